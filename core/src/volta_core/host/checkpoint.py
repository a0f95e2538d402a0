"""What a checkpoint's ``quantization_config`` says, read the way the checkpoint states it.

One reading for everyone: the plan command and the vLLM adapter both describe a checkpoint's
weights and KV scales through these functions, so the KV verdict a user sees in the plan is
the one the engine applies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from volta_core.errors import UsageError
from volta_core.host.types import CheckpointKV, KVScaleScheme, QuantConfig

#: compressed-tensors ``kv_cache_scheme.strategy`` values and the scale layout each means.
_CT_KV_STRATEGIES: dict[str, KVScaleScheme] = {
    "tensor": KVScaleScheme.PER_TENSOR,
    "attn_head": KVScaleScheme.PER_ATTENTION_HEAD,
}


def quant_config(raw: object) -> QuantConfig | None:
    """Wrap a ``quantization_config`` section; None for an unquantized checkpoint.

    A section that is not a mapping is treated as absent here; ``vllm-volta plan`` refuses it
    beforehand (:mod:`volta_core.planner.config_check`) with a line naming the field.
    """
    if not isinstance(raw, Mapping) or not raw:
        return None
    method = raw.get("quant_method")
    if not isinstance(method, str) or not method:
        return QuantConfig("unknown", raw)
    return QuantConfig(method, raw)


def is_ignored(config: QuantConfig, prefix: str) -> bool:
    """Whether the checkpoint keeps module ``prefix`` unquantized (its ``ignore`` list).

    Entries are exact module names or ``re:`` patterns matched against the whole name, the way
    compressed-tensors matches them.
    """
    for entry in config.ignore:
        if not isinstance(entry, str):
            continue
        if entry.startswith("re:"):
            try:
                if re.match(entry[3:], prefix):
                    return True
            except re.error:  # refused by the config check; never matches here
                continue
        elif entry == prefix:
            return True
    return False


def unquantized_reason(config: QuantConfig, prefix: str) -> str | None:
    """Why the engine runs module ``prefix`` of a quantized checkpoint unquantized, or None when
    it is quantized: the checkpoint's ``ignore`` list (:func:`is_ignored`); for vLLM's ``fp8``
    method its ``ignored_layers`` (``modules_to_not_convert``) by exact name, and the output head,
    which ``Fp8Config`` never quantizes (it quantizes linear layers; ``lm_head`` is a
    ``ParallelLMHead`` there)."""
    if is_ignored(config, prefix):
        return "in the checkpoint's ignore list"
    if config.method != "fp8":
        return None
    if prefix.rsplit(".", 1)[-1] == "lm_head":
        return "vLLM's fp8 method quantizes linear layers, not the output head"
    skipped = config.raw.get("ignored_layers") or config.raw.get("modules_to_not_convert") or ()
    if isinstance(skipped, list | tuple) and prefix in skipped:
        return "in the checkpoint's ignored layers"
    return None


def _ct_weight_format(raw: Mapping[str, Any]) -> str:
    """The weight format of a compressed-tensors checkpoint (``int4``, ``fp8``, ``int8``...)."""
    formats = set()
    groups = raw.get("config_groups")
    for group in groups.values() if isinstance(groups, Mapping) else ():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            continue
        bits, kind = weights.get("num_bits"), weights.get("type", "int")
        if bits:
            formats.add(f"{'fp' if kind == 'float' else 'int'}{bits}")
    return "+".join(sorted(formats)) or "fp16"


def weight_format(config: QuantConfig | None) -> str:
    """A short name for how the weights are stored: ``fp16``, ``fp8``, ``int4``..."""
    if config is None:
        return "fp16"
    if config.method == "compressed-tensors":
        return _ct_weight_format(config.raw)
    if config.method in {"fp8", "fbgemm_fp8", "modelopt"}:
        return "fp8"
    bits = config.raw.get("bits") or config.raw.get("w_bit")
    return f"int{bits}" if bits else config.method


def checkpoint_kv(config: QuantConfig | None) -> CheckpointKV:
    """What the checkpoint ships for the KV cache: scale layout and the dtype they were made for.

    compressed-tensors states it in ``kv_cache_scheme`` (``strategy`` tensor or attn_head; an
    8-bit float scheme is calibrated for e4m3, the format llm-compressor produces). Dense fp8
    checkpoints from other tools state ``kv_cache_quant_algo``/``kv_cache_scheme`` likewise.
    """
    fmt = weight_format(config)
    if config is None:
        return CheckpointKV(weight_format=fmt, source="unquantized checkpoint")
    scheme = config.kv_cache_scheme
    if scheme is not None:
        strategy = str(scheme.get("strategy", "tensor"))
        layout = _CT_KV_STRATEGIES.get(strategy)
        if layout is None:
            known = ", ".join(sorted(_CT_KV_STRATEGIES))
            raise UsageError(f"kv_cache_scheme strategy {strategy!r} is not one of: {known}")
        kind, bits = scheme.get("type", "float"), scheme.get("num_bits", 8)
        calibrated = "fp8_e4m3" if (kind, bits) == ("float", 8) else f"{kind}{bits}"
        return CheckpointKV(
            layout, calibrated, fmt, f"{config.method} kv_cache_scheme ({strategy})"
        )
    algo = config.raw.get("kv_cache_quant_algo")
    if isinstance(algo, str) and algo.upper() == "FP8":
        return CheckpointKV(KVScaleScheme.PER_TENSOR, "fp8_e4m3", fmt, "kv_cache_quant_algo FP8")
    return CheckpointKV(weight_format=fmt, source=f"{config.method}: no KV-cache scales")
