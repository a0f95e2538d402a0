"""Reading an AWQ or GPTQ ``quantization_config`` for one layer, without torch.

AWQ (AutoAWQ, GPTQModel's AWQ) and GPTQ (AutoGPTQ, GPTQModel) store the same arithmetic the
kernels run, ``(q - z) * s`` per group of inputs, in other packings (:class:`Packing`); the
weights are repacked once at load (:mod:`volta_ct_wna16.repack`). The rules for which modules
a checkpoint leaves unquantized follow vLLM's readers of the same configs:

- AWQ: ``modules_to_not_convert`` names modules by substring (vLLM's ``AWQConfig`` and
  ``AutoAWQConfig``: ``is_layer_skipped(..., match_mode="substring")``).
- GPTQ: ``dynamic`` maps regular expressions (``re.match``) over module names to per-module
  overrides, a ``-:`` prefix leaving the module unquantized; ``modules_in_block_to_quantize``,
  where given, lists the quantized modules by substring (vLLM's ``gptq_utils``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from volta_core import DEFAULT_FUSED, match_name, shard_names
from volta_ct_wna16.limits import SUPPORTED_BITS, SUPPORTED_GROUP_SIZES
from volta_ct_wna16.weight_scheme import Packing, Unsupported, WeightScheme

#: The ``quant_method`` names of each family (the checkpoint's, and vLLM's Marlin variants a
#: user may pass as ``--quantization``).
AWQ_METHODS = frozenset({"awq", "awq_marlin", "auto_awq"})
GPTQ_METHODS = frozenset({"gptq", "gptq_marlin", "auto_gptq"})

#: The AWQ bit width vLLM's AWQ configs accept (``AWQConfig``, ``AutoAWQConfig``: 4 only).
AWQ_BITS = 4

#: AWQ checkpoint versions in the GEMM packing (the layout vLLM reads; GEMV and others are not).
AWQ_GEMM_VERSIONS = ("gemm", "")


def _first(raw: Mapping[str, Any], keys: Sequence[str], default: Any = None) -> Any:
    for key in keys:
        if key in raw:
            return raw[key]
    return default


def _bits(value: Any) -> int | Unsupported:
    if value not in SUPPORTED_BITS or isinstance(value, bool):
        return Unsupported(f"{value}-bit weights (runs {', '.join(map(str, SUPPORTED_BITS))})")
    return int(value)


def _group(value: Any) -> int | Unsupported | None:
    """A config's group size: None for channel-wise (``-1``)."""
    if value == -1:
        return None
    if value not in SUPPORTED_GROUP_SIZES or isinstance(value, bool):
        return Unsupported(
            f"group size {value} (runs {', '.join(map(str, SUPPORTED_GROUP_SIZES))} "
            "and channel-wise)"
        )
    return int(value)


def _names_any(prefix: str, names: Sequence[str], fused: Mapping[str, Sequence[str]]) -> bool:
    """vLLM's substring rule: a name inside the module's name, or inside every shard's."""
    if any(name in prefix for name in names):
        return True
    shards = shard_names(prefix, fused)
    return len(shards) > 1 and all(any(name in s for name in names) for s in shards)


def awq_scheme(
    raw: Mapping[str, Any], prefix: str, fused: Mapping[str, Sequence[str]] = DEFAULT_FUSED
) -> WeightScheme | Unsupported | None:
    """One module's scheme in an AWQ checkpoint (None: ``modules_to_not_convert`` names it)."""
    if _names_any(prefix, _first(raw, ["modules_to_not_convert"]) or (), fused):
        return None
    version = str(_first(raw, ["version"], "gemm") or "").lower()
    if version not in AWQ_GEMM_VERSIONS:
        return Unsupported(f"AWQ version {version!r} (runs the GEMM packing)")
    if not _first(raw, ["zero_point"], True):
        return Unsupported("AWQ without zero points (zero_point false)")
    bits = _bits(_first(raw, ["w_bit", "bits"]))
    group = _group(_first(raw, ["q_group_size", "group_size"]))
    if isinstance(bits, Unsupported):
        return bits
    if bits != AWQ_BITS:
        return Unsupported(f"{bits}-bit AWQ (vLLM's AWQ configs read {AWQ_BITS}-bit only)")
    if isinstance(group, Unsupported):
        return group
    return WeightScheme(bits, False, group, Packing.AWQ)


def _dynamic(raw: Mapping[str, Any], prefix: str) -> Mapping[str, Any] | bool | None:
    """GPTQModel's ``dynamic`` rule for a module: False (left unquantized), its overrides, or
    None (no rule matches)."""
    rules = raw.get("dynamic") or {}
    if not isinstance(rules, Mapping):
        return None
    for pattern, overrides in rules.items():
        if pattern.startswith("-:"):
            if match_name(prefix, "re:" + pattern[2:]):
                return False
        elif match_name(prefix, "re:" + pattern.removeprefix("+:")):
            return overrides if isinstance(overrides, Mapping) else {}
    return None


def _flat(items: Any) -> list[str]:
    out: list[str] = []
    for item in items or ():
        out += _flat(item) if isinstance(item, list | tuple) else [str(item)]
    return out


def gptq_scheme(
    raw: Mapping[str, Any], prefix: str, fused: Mapping[str, Sequence[str]] = DEFAULT_FUSED
) -> WeightScheme | Unsupported | None:
    """One module's scheme in a GPTQ checkpoint, its ``dynamic`` overrides applied (None: the
    checkpoint leaves it unquantized)."""
    dynamic = _dynamic(raw, prefix)
    if dynamic is False:
        return None
    listed = _flat(raw.get("modules_in_block_to_quantize"))
    if listed and not _names_any(prefix, listed, fused):
        return None
    merged = {**raw, **(dynamic if isinstance(dynamic, Mapping) else {})}
    bits = _bits(merged.get("bits"))
    group = _group(merged.get("group_size"))
    if isinstance(bits, Unsupported):
        return bits
    if isinstance(group, Unsupported):
        return group
    fmt = str(merged.get("checkpoint_format") or "gptq").lower()
    if fmt not in (Packing.GPTQ.value, Packing.GPTQ_V2.value):
        return Unsupported(f"GPTQ checkpoint format {fmt!r} (runs gptq and gptq_v2)")
    # vLLM clears desc_act for channel-wise GPTQ: one group has no order to follow.
    act_order = bool(merged.get("desc_act")) and group is not None
    return WeightScheme(bits, bool(merged.get("sym", True)), group, Packing(fmt), act_order)


def method_scheme(
    raw: Mapping[str, Any],
    prefix: str,
    is_experts: bool,
    fused: Mapping[str, Sequence[str]] = DEFAULT_FUSED,
) -> WeightScheme | Unsupported | None:
    """The scheme of one linear module or fused-experts module of an AWQ or GPTQ checkpoint.

    Fused experts are read as vLLM reads them, from the experts module's own name (both
    families' MoE methods apply one config to all experts); act-order experts are not run.
    """
    method = str(raw.get("quant_method", "")).lower()
    reader = awq_scheme if method in AWQ_METHODS else gptq_scheme
    scheme = reader(raw, prefix, fused)
    if is_experts and isinstance(scheme, WeightScheme) and scheme.act_order:
        return Unsupported("act-order (desc_act) experts: their g_idx is not read")
    return scheme


def is_awq_or_gptq(raw: Mapping[str, Any]) -> bool:
    """Whether ``raw`` is an AWQ or GPTQ ``quantization_config``."""
    method = str(raw.get("quant_method", "")).lower()
    return method in AWQ_METHODS or method in GPTQ_METHODS
