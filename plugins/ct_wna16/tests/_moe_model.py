"""A tiny random Qwen3-MoE checkpoint, its W4A16 experts, and one engine run over it.

:func:`write_checkpoints` builds ``Qwen3MoeForCausalLM`` with transformers at random init, has
the compressed-tensors library quantize every expert's gate, up and down projection (min-max
qparams, ``pack-quantized``), and writes two checkpoints with per-expert tensor names (as real
W4A16 MoE checkpoints have them): ``quantized`` (the experts packed; attention, router and
``lm_head`` in fp16, not targeted) and ``dense`` (the same model with the experts'
*dequantized* weights), so the two must compute the same function.

Run as a script (vLLM spawns its engine process): ``_moe_model.py MODEL_DIR`` generates greedily
from fixed prompt token ids (no tokenizer) and prints ``RESULT {"tokens": ..., "logprobs": ...,
"methods": ...}``, ``methods`` being the quant method class of each MoE layer's experts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from ct_wna16_checkpoints import library_checkpoint, quantization_config

from volta_ct_wna16.layout import dequantize
from volta_ct_wna16.scheme import WeightScheme

VOCAB = 96
HIDDEN = 128
MOE_INTERMEDIATE = 64
EXPERTS = 8
TOP_K = 2
LAYERS = 2
#: Large enough that the experts dominate the residual stream and the logits spread out.
INIT_STD = 0.15

PROMPTS = [[5, 17, 33, 2, 71], [40, 41, 42], [90, 1, 64, 64, 12, 7, 88, 30]]
MAX_TOKENS = 6
LOGPROBS = 3

#: The quantized checkpoint's ``config_groups`` target the experts only.
EXPERT_TARGET = r"re:.*mlp\.experts\..*"


def _hf_model() -> Any:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=256,
        moe_intermediate_size=MOE_INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        torch_dtype="float16",
    )
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(config).to(torch.float16)


def _expert_linears(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert ``gate_proj``/``up_proj``/``down_proj`` weights from transformers' fused ones."""
    out: dict[str, torch.Tensor] = {}
    for name in [n for n in state if n.endswith("mlp.experts.gate_up_proj")]:
        stem = name.removesuffix("gate_up_proj")
        gate_up, down = state.pop(name), state.pop(stem + "down_proj")
        for e in range(EXPERTS):
            out[f"{stem}{e}.gate_proj"] = gate_up[e, :MOE_INTERMEDIATE]
            out[f"{stem}{e}.up_proj"] = gate_up[e, MOE_INTERMEDIATE:]
            out[f"{stem}{e}.down_proj"] = down[e]
    return out


def write_checkpoints(root: Path, scheme: WeightScheme) -> tuple[Path, Path]:
    """The quantized and the dequantized-dense checkpoints of one random model."""
    from safetensors.torch import save_file

    model = _hf_model()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    experts = _expert_linears(state)
    quantized, dense = dict(state), dict(state)
    for i, (name, weight) in enumerate(experts.items()):
        ckpt = library_checkpoint(*weight.shape, scheme, seed=i, weight=weight)
        quantized.update({f"{name}.{t}": v.contiguous() for t, v in ckpt.tensors.items()})
        pw = ckpt.packed(name)
        dense[f"{name}.weight"] = dequantize(pw).to(torch.float16).contiguous()
    config = model.config.to_dict()
    paths = []
    for kind, tensors in (("quantized", quantized), ("dense", dense)):
        out = root / kind
        out.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        cfg = dict(config, architectures=["Qwen3MoeForCausalLM"], torch_dtype="float16")
        if kind == "quantized":
            qc = quantization_config(scheme, ignore=["lm_head"])
            qc["config_groups"]["group_0"]["targets"] = [EXPERT_TARGET]
            cfg["quantization_config"] = qc
        (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
        paths.append(out)
    return paths[0], paths[1]


def expert_methods(model: torch.nn.Module) -> list[str]:
    """The quant method class of every fused-experts module (runs in the engine's worker,
    which finds it by module name: the script's directory is on the spawned process's path)."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    return [
        type(module.quant_method).__name__
        for module in model.modules()
        if isinstance(module, RoutedExperts)
    ]


def main(model: str) -> None:
    import _moe_model
    from e2e_reports import ENGINE_ARGS
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, skip_tokenizer_init=True, **ENGINE_ARGS)
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
        "methods": llm.apply_model(_moe_model.expert_methods),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "e2e"))
    main(sys.argv[1])
