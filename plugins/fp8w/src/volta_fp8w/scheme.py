"""Reading a checkpoint's ``quantization_config`` for one layer, without torch.

Two writers make the dense FP8 checkpoints V100 owners download, and both are read here, by one
function (:func:`quant_layer_scheme`) that the claim, the plan's hooks and the layer factories
call, so that a claim and the method built for it agree:

* vLLM's ``fp8`` method (Qwen's official FP8 releases, DeepSeek's): ``fmt`` e4m3,
  ``weight_block_size`` ``[block_n, block_k]`` with a ``weight_scale_inv`` per block, or none
  and one ``weight_scale`` per tensor; ``activation_scheme`` dynamic or static;
  ``ignored_layers`` (or ``modules_to_not_convert``) matched as vLLM's ``is_layer_skipped``
  does in its default exact mode (a fused module by its shards; experts by substring).
* compressed-tensors ``float-quantized`` (llm-compressor's FP8 schemes): 8-bit ``float``
  weights, ``strategy`` channel, tensor or block (``block_structure``), any activation scheme;
  groups, targets and ``ignore`` matched by the host's shared rules
  (:func:`volta_core.matching_group`).

Every scheme runs weight-only: fp16 activations, e4m3 weights decoded in registers. Activation
scales a checkpoint carries (static ``input_scale``, or dynamic per-token quantization) are not
applied; :attr:`Fp8Scheme.activations` names them so the claim's detail shows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from volta_core import (
    DEFAULT_FUSED,
    LayerKind,
    QuantLayer,
    ignored_module,
    matching_group,
    shard_names,
)
from volta_fp8w.limits import BLOCK_K_QUANTUM

#: The checkpoint names of one expert's gate, up and down projections (vLLM's defaults).
EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")

#: The compressed-tensors formats whose weights are stored as float8 values.
FLOAT_FORMATS = ("float-quantized", "naive-quantized")

#: The quantization-config methods this plugin reads.
FP8 = "fp8"
COMPRESSED_TENSORS = "compressed-tensors"


@dataclass(frozen=True)
class Fp8Scheme:
    """The weight quantization of one layer, as the kernels need it.

    ``strategy``: ``block`` (``block`` is ``(block_n, block_k)``), ``channel`` (one scale per
    output row) or ``tensor`` (one per checkpoint tensor). ``activations``: what the checkpoint
    says of activations, which this plugin does not apply (None: weight-only already).
    ``source``: the config's method, which decides the scale tensor's name.
    """

    strategy: str
    block: tuple[int, int] | None
    source: str
    activations: str | None = None

    @property
    def scale_name(self) -> str:
        """The checkpoint's scale tensor: ``weight_scale_inv`` for vLLM ``fp8`` blocks."""
        if self.source == FP8 and self.strategy == "block":
            return "weight_scale_inv"
        return "weight_scale"

    @property
    def label(self) -> str:
        grouping = f"block {self.block[0]}x{self.block[1]}" if self.block else self.strategy
        if not self.activations:
            return f"FP8 e4m3 W8A16 {grouping}"
        kind = self.activations
        return f"FP8 e4m3 W8A16 {grouping} (the checkpoint's {kind} FP8 activations run as fp16)"


@dataclass(frozen=True)
class Unsupported:
    """A layer the checkpoint quantizes in a way this plugin does not run, and why."""

    reason: str


def _block(value: object) -> tuple[int, int] | Unsupported:
    if (
        not isinstance(value, Sequence)
        or len(value) != 2
        or not all(isinstance(v, int) and v > 0 for v in value)
    ):
        return Unsupported(f"weight block {value!r} is not two positive integers")
    block_n, block_k = int(value[0]), int(value[1])
    if block_k % BLOCK_K_QUANTUM:
        return Unsupported(
            f"weight block {block_n}x{block_k}: the input length of a block must be a multiple "
            f"of {BLOCK_K_QUANTUM}"
        )
    return block_n, block_k


# -- vLLM's ``fp8`` ---------------------------------------------------------------------------


def fp8_scheme(raw: Mapping[str, Any]) -> Fp8Scheme | Unsupported:
    """The scheme every quantized layer of an ``fp8`` checkpoint has."""
    fmt = str(raw.get("fmt", "e4m3")).lower()
    if fmt not in ("e4m3", "float8_e4m3fn"):
        return Unsupported(f"fp8 weights in format {fmt!r} (runs e4m3)")
    store = raw.get("store_dtype")
    if store is not None:
        return Unsupported(f"weights stored as {store!r}")
    activation = raw.get("activation_scheme")
    activations = str(activation) if activation in ("dynamic", "static") else None
    block = raw.get("weight_block_size")
    if block is None:
        return Fp8Scheme("tensor", None, FP8, activations)
    parsed = _block(block)
    if isinstance(parsed, Unsupported):
        return parsed
    return Fp8Scheme("block", parsed, FP8, activations)


def fp8_ignored(
    prefix: str, ignore: Iterable[str], fused: Mapping[str, Sequence[str]] = DEFAULT_FUSED
) -> bool | None:
    """vLLM's ``is_layer_skipped`` in its exact mode: a fused module by its shards (None when
    they disagree), experts when an ignored name containing ``experts`` contains the prefix."""
    names = list(ignore)
    if prefix in names:
        return True
    if prefix.rsplit(".", 1)[-1] in {suffix.rsplit(".", 1)[-1] for suffix in fused}:
        hits = [shard in names for shard in shard_names(prefix, fused)]
        if all(hits):
            return True
        return None if any(hits) else False
    if "experts" in prefix:
        return any(prefix in name for name in names if "experts" in name)
    return False


def _fp8_layer(
    raw: Mapping[str, Any], prefix: str, fused: Mapping[str, Sequence[str]]
) -> Fp8Scheme | Unsupported | None:
    ignore = raw.get("ignored_layers") or raw.get("modules_to_not_convert") or ()
    verdict = fp8_ignored(prefix, ignore, fused)
    if verdict is None:
        return Unsupported("the shards of this fused module disagree with the ignored layers")
    if verdict:
        return None
    return fp8_scheme(raw)


# -- compressed-tensors ``float-quantized`` -----------------------------------------------------


def ct_weight_scheme(
    raw: Mapping[str, Any], group: Mapping[str, Any]
) -> Fp8Scheme | Unsupported | None:
    """One compressed-tensors config group as an :class:`Fp8Scheme`; None when its weights are
    not 8-bit floats (another plugin's, or vLLM's)."""
    weights = group.get("weights")
    if not isinstance(weights, Mapping) or weights.get("type") != "float":
        return None
    if weights.get("num_bits") != 8:
        return None
    fmt = group.get("format") or raw.get("format")
    if fmt not in FLOAT_FORMATS:
        return Unsupported(f"format {fmt!r} (runs {', '.join(FLOAT_FORMATS)})")
    if weights.get("dynamic"):
        return Unsupported("dynamic weight quantization")
    if weights.get("symmetric") is False:
        return Unsupported("asymmetric float weights")
    inputs = group.get("input_activations")
    activations = None
    if isinstance(inputs, Mapping) and inputs:
        activations = "dynamic" if inputs.get("dynamic") else "static"
    strategy = weights.get("strategy")
    if strategy in ("channel", "tensor"):
        return Fp8Scheme(str(strategy), None, COMPRESSED_TENSORS, activations)
    if strategy == "block":
        parsed = _block(weights.get("block_structure"))
        if isinstance(parsed, Unsupported):
            return parsed
        return Fp8Scheme("block", parsed, COMPRESSED_TENSORS, activations)
    return Unsupported(f"strategy {strategy!r} (runs channel, tensor and block)")


def _ct_layer(
    raw: Mapping[str, Any], prefix: str, fused: Mapping[str, Sequence[str]]
) -> Fp8Scheme | Unsupported | None:
    verdict = ignored_module(prefix, raw.get("ignore") or (), fused)
    if verdict is None:
        return Unsupported("the shards of this fused module disagree with the ignore list")
    if verdict:
        return None
    match = matching_group(raw, prefix, True, fused)
    return None if match is None else ct_weight_scheme(raw, match[1])


# -- one layer ------------------------------------------------------------------------------


def layer_scheme(
    raw: Mapping[str, Any], prefix: str, fused: Mapping[str, Sequence[str]] = DEFAULT_FUSED
) -> Fp8Scheme | Unsupported | None:
    """The scheme of one linear module: None when it is not this plugin's (unquantized, or
    another format)."""
    method = raw.get("quant_method")
    if method == FP8:
        return _fp8_layer(raw, prefix, fused)
    if method == COMPRESSED_TENSORS:
        return _ct_layer(raw, prefix, fused)
    return None


def expert_scheme(
    raw: Mapping[str, Any], prefix: str, ignore: Iterable[str] | None = None
) -> Fp8Scheme | Unsupported | None:
    """The scheme of a fused-experts module, read from expert 0's projections as vLLM does;
    ``ignore`` replaces the checkpoint's list (a factory passes vLLM's, mapped to its names)."""
    if raw.get("quant_method") == FP8:
        names = list(ignore) if ignore is not None else None
        if names is None:
            names = list(raw.get("ignored_layers") or raw.get("modules_to_not_convert") or ())
        return None if fp8_ignored(prefix, names) else fp8_scheme(raw)
    if ignore is not None:
        raw = {**raw, "ignore": list(ignore)}
    schemes = [layer_scheme(raw, f"{prefix}.0.{p}") for p in EXPERT_PROJECTIONS]
    if any(s != schemes[0] for s in schemes):
        return Unsupported("the experts' gate, up and down projections are quantized differently")
    return schemes[0]


def block_shards_reason(
    block: tuple[int, int],
    input_size: int,
    inputs_per_rank: int,
    output_size: int,
    output_shards: Sequence[int],
) -> str | None:
    """Why a linear layer's tensor-parallel rank or merged shards would cut a scale block, or
    None (vLLM's ``validate_fp8_block_shape`` in ``quantization/utils/fp8_utils.py`` states
    the same rule for its own method).

    Block scales are sliced by whole blocks, so a row-parallel rank's inputs
    (``inputs_per_rank`` below ``input_size``), every output shard of a column-parallel rank
    (``output_shards`` summing below ``output_size``: a rank whose rows start inside a block
    would read its neighbour's scales), and every output shard but a merged layer's last, are
    whole blocks. The linear method refuses a layer with this reason when built, and the claim
    declines by it (:func:`loader_refusal`).
    """
    block_n, block_k = block
    if inputs_per_rank != input_size and inputs_per_rank % block_k:
        return (
            f"{inputs_per_rank} inputs per tensor-parallel rank is not a multiple of the weight "
            f"block's {block_k}; use a tensor-parallel size that divides the blocks"
        )
    split = sum(output_shards) != output_size  # column-parallel: each rank holds some rows
    for size in output_shards if split else output_shards[:-1]:
        if size % block_n:
            return (
                f"an output shard of {size} rows is not a multiple of the weight block's {block_n}"
            )
    return None


def expert_blocks_reason(block: tuple[int, int], inter_per_rank: int, ranks: int) -> str | None:
    """Why fused experts' intermediate size, divided over ``ranks``, would cut a scale block
    (a rank's gate/up rows and down inputs are its slice of the intermediate size), or None.
    The experts' method refuses such a layer when built, and the claim declines by it."""
    block_n, block_k = block
    if ranks > 1 and (inter_per_rank % block_n or inter_per_rank % block_k):
        return (
            f"intermediate size per TP rank {inter_per_rank} (of {inter_per_rank * ranks}, "
            f"{ranks} ranks) is not a multiple of the weight block {block_n}x{block_k}: a "
            "rank's gate/up rows and down columns would split a block; use a tensor-parallel "
            "size that keeps whole blocks per rank"
        )
    return None


def loader_refusal(scheme: Fp8Scheme, layer: QuantLayer) -> str | None:
    """Why the loaders would refuse one tensor-parallel rank's shard of ``layer``, or None: the
    loaders' rules (:func:`block_shards_reason`, :func:`expert_blocks_reason`) asked of the
    layer's full shape divided as vLLM divides it: a row-parallel layer's inputs, fused
    experts' intermediate size.

    A column-parallel layer's rows are left to the loader: a QKV layer's rows per rank follow
    vLLM's KV-head replication, which a :class:`~volta_core.QuantLayer` does not carry, and
    gate/up's rows per rank are down's inputs per rank, checked here. Block scales only; a size
    the ranks do not divide is vLLM's own refusal (``divide``), not asked here.
    """
    if scheme.block is None:
        return None
    if layer.kind is LayerKind.FUSED_MOE and layer.splits_output and layer.outputs_per_rank:
        return expert_blocks_reason(
            scheme.block, layer.outputs_per_rank, layer.tensor_parallel_size
        )
    if layer.kind is LayerKind.LINEAR and layer.splits_input and layer.inputs_per_rank:
        n, k = layer.output_size, layer.input_size
        return block_shards_reason(scheme.block, k, layer.inputs_per_rank, n, (n,))
    return None


def quant_layer_scheme(
    raw: Mapping[str, Any],
    layer: QuantLayer,
    fused: Mapping[str, Sequence[str]] = DEFAULT_FUSED,
    ignore: Iterable[str] | None = None,
) -> Fp8Scheme | Unsupported | None:
    """The scheme of a layer the plugin may serve, from the checkpoint's config ``raw``: the one
    reading the claim, the plan's hooks and the layer factories share; :class:`Unsupported`
    with the reason where the loaders would refuse the layer's tensor-parallel shard
    (:func:`loader_refusal`). None: the layer stays unquantized, is another plugin's format,
    or is neither a linear layer nor fused experts."""
    scheme: Fp8Scheme | Unsupported | None
    if layer.kind is LayerKind.FUSED_MOE:
        scheme = expert_scheme(raw, layer.prefix, ignore=ignore)
    elif layer.kind is LayerKind.LINEAR:
        scheme = layer_scheme(raw, layer.prefix, fused)
    else:
        return None
    if isinstance(scheme, Fp8Scheme):
        reason = loader_refusal(scheme, layer)
        if reason is not None:
            return Unsupported(reason)
    return scheme
