"""Reading a compressed-tensors ``quantization_config`` for one layer, without torch.

The plugin decides whether to claim a layer from the checkpoint's config alone (the host calls
the hook while vLLM builds the model and when ``vllm-volta plan`` runs on a machine with no GPU).
Which config group covers a module, and whether ``ignore`` names it, follows compressed-tensors'
and vLLM's rules as the host states them for every plugin (:func:`volta_core.matching_group`,
:func:`volta_core.ignored_module`).

A layer's scheme is read by one function, :func:`quant_layer_scheme`, which the claim, the plan's
hooks and the layer factories all call, so a claim and the method built for it agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from volta_core import (
    DEFAULT_FUSED,
    LayerKind,
    QuantLayer,
    ignored_module,
    matching_group,
)
from volta_ct_wna16.awq_gptq import is_awq_or_gptq, method_scheme
from volta_ct_wna16.limits import SUPPORTED_BITS, SUPPORTED_GROUP_SIZES
from volta_ct_wna16.weight_scheme import (
    Packing,
    Unsupported,
    WeightScheme,
    act_order_split_reason,
    split_groups_reason,
)

#: The checkpoint names of one expert's gate, up and down projections (vLLM's defaults).
EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")

#: The compressed-tensors format this plugin reads.
PACK_QUANTIZED = "pack-quantized"


def weight_scheme(raw: Mapping[str, Any], group: Mapping[str, Any]) -> WeightScheme | Unsupported:
    """Translate one config group into a :class:`WeightScheme`, or say why it is not run here."""
    fmt = group.get("format") or raw.get("format")
    if fmt != PACK_QUANTIZED:
        return Unsupported(f"format {fmt!r} is not {PACK_QUANTIZED!r}")
    if group.get("input_activations"):
        return Unsupported("activations are quantized too (not weight-only)")
    weights = group.get("weights")
    if not weights:
        return Unsupported("the config group quantizes no weights")
    if weights.get("type", "int") != "int":
        return Unsupported(f"weight type {weights.get('type')!r} is not int")
    bits = weights.get("num_bits")
    if bits not in SUPPORTED_BITS:
        return Unsupported(f"{bits}-bit weights (runs {', '.join(map(str, SUPPORTED_BITS))})")
    if weights.get("dynamic"):
        return Unsupported("dynamic weight quantization")
    actorder = weights.get("actorder")
    if actorder == "group":
        return Unsupported("activation-order groups (weight_g_idx) are not implemented")
    strategy = weights.get("strategy")
    symmetric = bool(weights.get("symmetric", True))
    if strategy == "channel":
        return WeightScheme(bits, symmetric, None)
    if strategy == "group":
        size = weights.get("group_size")
        if size not in SUPPORTED_GROUP_SIZES:
            return Unsupported(
                f"group size {size} (runs {', '.join(map(str, SUPPORTED_GROUP_SIZES))} "
                "and channel-wise)"
            )
        return WeightScheme(bits, symmetric, int(size))
    return Unsupported(f"strategy {strategy!r} (runs group and channel)")


def layer_scheme(
    raw: Mapping[str, Any],
    prefix: str,
    is_linear: bool = True,
    fused: Mapping[str, Sequence[str]] = DEFAULT_FUSED,
) -> WeightScheme | Unsupported | None:
    """The scheme of one module: None when the checkpoint leaves it unquantized."""
    verdict = ignored_module(prefix, raw.get("ignore") or (), fused)
    if verdict is None:
        return Unsupported("the shards of this fused module disagree with the ignore list")
    if verdict:
        return None
    match = matching_group(raw, prefix, is_linear, fused)
    if match is None:
        return None
    return weight_scheme(raw, match[1])


def expert_scheme(
    raw: Mapping[str, Any],
    prefix: str,
    projections: Sequence[str] = EXPERT_PROJECTIONS,
    ignore: Iterable[str] | None = None,
) -> WeightScheme | Unsupported | None:
    """The scheme of a fused-experts module, read from expert 0's projections as vLLM does.

    The checkpoint quantizes each expert's projections as linear layers (a ``Linear`` target
    covers them); vLLM fuses them into one module and requires one scheme for all three.
    ``ignore`` replaces the checkpoint's list (the factory passes vLLM's, mapped to its module
    names). None: the experts stay unquantized.
    """
    if ignore is not None:
        raw = {**raw, "ignore": list(ignore)}
    names = [f"{prefix}.0.{projection}" for projection in projections]
    schemes = [layer_scheme(raw, name, is_linear=True) for name in names]
    if any(s != schemes[0] for s in schemes):
        found = ", ".join(
            f"{name.rsplit('.', 1)[-1]}: {_describe(s)}"
            for name, s in zip(names, schemes, strict=True)
        )
        return Unsupported(f"the experts' projections are quantized differently ({found})")
    return schemes[0]


def _describe(scheme: WeightScheme | Unsupported | None) -> str:
    if isinstance(scheme, WeightScheme):
        return scheme.label
    return scheme.reason if scheme is not None else "unquantized"


def quant_layer_scheme(
    raw: Mapping[str, Any],
    layer: QuantLayer,
    fused: Mapping[str, Sequence[str]] = DEFAULT_FUSED,
    ignore: Iterable[str] | None = None,
) -> WeightScheme | Unsupported | None:
    """The scheme of a layer the plugin may serve, from the checkpoint's config ``raw``
    (compressed-tensors, or AWQ/GPTQ: :func:`volta_ct_wna16.awq_gptq.method_scheme`): the one
    reading that the claim (``volta_quant_method``), the plan's hooks and the layer factories
    (:func:`volta_ct_wna16.linear.make_linear_method`, :func:`volta_ct_wna16.moe.make_moe_method`)
    share. Fused experts read expert 0's projections (:func:`expert_scheme`, ``ignore``
    replacing the checkpoint's list where given); a linear layer its own module, ``fused``
    naming the model's fused modules. A scheme whose tensor-parallel shard the loaders would
    refuse is :class:`Unsupported` with the reason (:func:`loader_refusal`). None: the layer
    stays unquantized, or is neither kind.
    """
    if layer.kind not in (LayerKind.FUSED_MOE, LayerKind.LINEAR):
        return None
    scheme: WeightScheme | Unsupported | None
    if is_awq_or_gptq(raw):
        scheme = method_scheme(raw, layer.prefix, layer.kind is LayerKind.FUSED_MOE, fused)
    elif layer.kind is LayerKind.FUSED_MOE:
        scheme = expert_scheme(raw, layer.prefix, ignore=ignore)
    else:
        scheme = layer_scheme(raw, layer.prefix, is_linear=True, fused=fused)
    if isinstance(scheme, WeightScheme):
        reason = loader_refusal(scheme, layer)
        if reason is not None:
            return Unsupported(reason)
    return scheme


def loader_refusal(scheme: WeightScheme, layer: QuantLayer) -> str | None:
    """Why the loaders would refuse ``layer``'s shape, whole or on one tensor-parallel rank, or
    None: the loaders' own rules, asked of the layer's full shape divided as vLLM divides it.

    - Every input length must be whole groups (:func:`split_groups_reason`, which the loaders
      ask through :func:`volta_ct_wna16.layout.require_whole_groups`): a linear layer's input,
      fused experts' hidden size, and what the ranks divide, a row-parallel layer's inputs and
      fused experts' intermediate size (their down projection's inputs). E.g. Qwen3-30B-A3B's
      intermediate size 768 over 4 ranks is 192 a rank, not whole groups of 128.
    - Act-order inputs cannot be divided at all (:func:`act_order_split_reason`).

    A size the ranks do not divide is vLLM's own refusal (``divide`` in
    ``vllm/distributed/utils.py``), not asked here; a size of 0 is not known.
    """
    divided: tuple[str, int, int] | None = None
    if layer.kind is LayerKind.FUSED_MOE:
        whole = {"hidden size": layer.input_size}
        if layer.splits_output:
            divided = ("intermediate size per TP rank", layer.output_size, layer.outputs_per_rank)
    else:
        whole = {"input size": layer.input_size}
        if layer.splits_input:
            act_order = act_order_split_reason(scheme, input_split=True)
            if act_order is not None:
                return act_order
            divided = ("input size per TP rank", layer.input_size, layer.inputs_per_rank)
    reason = split_groups_reason(scheme.group_size, {w: n for w, n in whole.items() if n})
    if reason is not None or divided is None:
        return reason
    what, size, per_rank = divided
    reason = split_groups_reason(scheme.group_size, {what: per_rank}) if per_rank else None
    if reason is None:
        return None
    ranks = layer.tensor_parallel_size
    return (
        f"{reason} ({size} over {ranks} ranks); use a tensor-parallel size that leaves whole "
        "groups on each rank"
    )


__all__ = [
    "EXPERT_PROJECTIONS",
    "PACK_QUANTIZED",
    "Packing",
    "Unsupported",
    "WeightScheme",
    "expert_scheme",
    "layer_scheme",
    "loader_refusal",
    "quant_layer_scheme",
    "weight_scheme",
]
