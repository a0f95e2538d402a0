"""AWQ and GPTQ layers made by vLLM's own quantization test utilities, with their reference.

``vllm.model_executor.layers.quantization.utils.quant_utils`` (in every vLLM family) quantizes
a float weight per group (``quantize_weights``: scales, zero points, and the dequantized
reference ``w_ref`` it computes from the integers) and packs the integers as each format stores
them (``awq_pack``: AutoAWQ's interleaved order along the output dimension; ``gptq_pack``:
along the input dimension; ``pack_cols`` for GPTQ's ``qzeros``). The original GPTQ format
stores each zero point minus one (AutoGPTQ's packer; vLLM's exllama kernels add the one back);
``gptq_v2`` stores it as it is. An act-order layer is quantized with its rows in the order of a
random permutation (GPTQ's order of decreasing Hessian diagonal), groups contiguous in that
order, and stored in the original row order with ``g_idx`` naming each row's group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from volta_ct_wna16.repack import Repacked, awq_weights, gptq_weights
from volta_ct_wna16.weight_scheme import Packing, WeightScheme


@dataclass(frozen=True)
class Layer:
    """One layer's checkpoint tensors (the format's names), its scheme, and ``reference``: the
    dequantized weight ``[N, K]`` vLLM's ``quantize_weights`` computed, in float16."""

    tensors: dict[str, torch.Tensor]
    scheme: WeightScheme
    reference: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.reference.shape)  # type: ignore[return-value]

    def repacked(self, name: str = "test") -> Repacked:
        """The layer in the kernels' layout (fp16 activations)."""
        n, k = self.shape
        t = self.tensors
        common = {"n": n, "k": k, "qweight": t["qweight"], "qzeros": t["qzeros"]}
        if self.scheme.packing is Packing.AWQ:
            return awq_weights(
                name, self.scheme, **common, scales=t["scales"], act_dtype=torch.float16
            )
        return gptq_weights(
            name,
            self.scheme,
            **common,
            scales=t["scales"],
            g_idx=t["g_idx"],
            act_dtype=torch.float16,
        )


def quantization_config(scheme: WeightScheme, **extra: Any) -> dict[str, Any]:
    """The ``quantization_config`` section the producers write for ``scheme``."""
    group = scheme.group_size or -1
    if scheme.packing is Packing.AWQ:
        return {
            "quant_method": "awq",
            "bits": scheme.num_bits,
            "group_size": group,
            "zero_point": True,
            "version": "gemm",
            **extra,
        }
    return {
        "quant_method": "gptq",
        "bits": scheme.num_bits,
        "group_size": group,
        "desc_act": scheme.act_order,
        "sym": scheme.symmetric,
        "checkpoint_format": scheme.packing.value,
        **extra,
    }


def make_layer(
    n: int,
    k: int,
    scheme: WeightScheme,
    seed: int = 0,
    order_seed: int | None = None,
    weight: torch.Tensor | None = None,
) -> Layer:
    """A layer of ``scheme`` (``n`` outputs, ``k`` inputs) quantizing ``weight`` ``[n, k]`` (a
    fresh random one by default); an act-order layer's row order is drawn from ``order_seed``
    (default ``seed``): the shards of one fused module (one input) share it."""
    from vllm.model_executor.layers.quantization.utils import quant_utils
    from vllm.scalar_type import scalar_types

    bits = scheme.num_bits
    gen = torch.Generator().manual_seed(seed)
    if weight is None:
        weight = torch.randn(n, k, generator=gen) * 0.05
    w = weight.t().to(torch.float16).contiguous()
    if scheme.symmetric:
        quant_type = scalar_types.uint4b8 if bits == 4 else scalar_types.uint8b128
    else:
        quant_type = scalar_types.uint4 if bits == 4 else scalar_types.uint8
    group = scheme.group_size or -1
    order = torch.Generator().manual_seed(seed if order_seed is None else order_seed)
    perm = torch.randperm(k, generator=order) if scheme.act_order else torch.arange(k)
    w_ref, w_q, w_s, zp = quant_utils.quantize_weights(
        w[perm], quant_type, group, zero_points=not scheme.symmetric
    )
    inverse = torch.argsort(perm)
    w_ref, w_q = w_ref[inverse], w_q[inverse]
    groups = w_s.shape[0]
    if scheme.packing is Packing.AWQ:
        tensors = {
            "qweight": quant_utils.awq_pack(w_q, bits, k, n),
            "qzeros": quant_utils.awq_pack(zp, bits, groups, n),
            "scales": w_s,
        }
        return Layer(tensors, scheme, w_ref.t().contiguous())
    if scheme.symmetric:
        stored = torch.full((groups, n), 1 << (bits - 1), dtype=torch.int32)
    else:
        assert int(zp.min()) >= 1, "the original GPTQ format cannot store a zero point of 0"
        stored = zp
    if scheme.packing is Packing.GPTQ:
        stored = stored - 1
    group_of_row = torch.arange(k, dtype=torch.int32) // (scheme.group_size or k)
    tensors = {
        "qweight": quant_utils.gptq_pack(w_q, bits, k, n),
        "qzeros": quant_utils.pack_cols(stored, bits, groups, n),
        "scales": w_s,
        "g_idx": group_of_row[inverse].contiguous(),
    }
    return Layer(tensors, scheme, w_ref.t().contiguous())


def write_moe_checkpoints(root: Path, scheme: WeightScheme) -> tuple[Path, Path]:
    """``_moe_model``'s random tiny Qwen3-MoE with its experts and attention projections in
    ``scheme`` (the router and output head fp16, left out by the config), and the same model
    with those weights dequantized: the two compute the same function."""
    import _moe_model
    from safetensors.torch import save_file

    model = _moe_model._hf_model()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    linears = _moe_model._expert_linears(state)
    attention = ("q_proj", "k_proj", "v_proj", "o_proj")
    for name in [n for n in state if n.rpartition(".")[0].rpartition(".")[2] in attention]:
        linears[name.removesuffix(".weight")] = state.pop(name)
    quantized, dense = dict(state), dict(state)
    for i, (name, weight) in enumerate(linears.items()):
        layer = make_layer(*weight.shape, scheme, seed=i, weight=weight.float())
        quantized.update({f"{name}.{t}": v.contiguous() for t, v in layer.tensors.items()})
        dense[f"{name}.weight"] = layer.reference.contiguous()
    config = dict(model.config.to_dict(), architectures=["Qwen3MoeForCausalLM"])
    config["torch_dtype"] = "float16"
    # The router and the output head stay fp16: AWQ by name, GPTQ by listing the quantized
    # modules (vLLM's rules for each).
    only_experts = (
        {"modules_to_not_convert": ["mlp.gate", "lm_head"]}
        if scheme.packing is Packing.AWQ
        else {
            "modules_in_block_to_quantize": [[f"self_attn.{p}" for p in attention], ["mlp.experts"]]
        }
    )
    paths = []
    for kind, tensors in (("quantized", quantized), ("dense", dense)):
        out = root / kind
        out.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        cfg = dict(config)
        if kind == "quantized":
            cfg["quantization_config"] = quantization_config(scheme, **only_experts)
        (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
        paths.append(out)
    return paths[0], paths[1]


def write_tiny_dense_checkpoint(out: Path, scheme: WeightScheme) -> Path:
    """``tests/e2e/tiny_model.py``'s scripted bigram model with every decoder linear layer in
    ``scheme`` (the output head and embeddings fp16, as AWQ and GPTQ releases keep them)."""
    import tiny_model
    from safetensors.torch import save_file

    model = tiny_model.build_model()
    linear = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    tensors: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and module.rpartition(".")[2] in linear:
            layer = make_layer(*value.shape, scheme, seed=len(tensors), weight=value.float())
            tensors.update({f"{module}.{t}": v.contiguous() for t, v in layer.tensors.items()})
        else:
            tensors[name] = value.to(torch.float16).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = dict(model.config.to_dict(), architectures=["Qwen3ForCausalLM"])
    config["torch_dtype"] = "float16"
    config["quantization_config"] = quantization_config(scheme)
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str))
    tiny_model._write_tokenizer(out)
    return out
