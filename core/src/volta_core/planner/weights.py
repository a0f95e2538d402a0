"""Weight bytes one tensor-parallel rank holds, part by part (per layer, embedding, lm_head).

Two sources, one result (:class:`WeightReport`):

* :func:`weights_from_tensors`: a checkpoint's real tensors (their safetensors headers). Each
  tensor is split across the ``tp`` ranks (``ceil(bytes / tp)``) except norms and the MoE router
  (replicated, as vLLM holds them) and the K/V projections of a model with fewer KV heads than
  ranks (each rank holds ``max(1, kv_heads // tp)`` of them). ``mtp.*`` tensors, the
  multi-token-prediction draft head, count only when it is used: vLLM loads them only with
  ``--speculative-config``.
* :func:`weights_from_config`: the config and the quant scheme. Per decoder layer: attention
  q (doubled where the model gates its output: Qwen3-Next/3.5/3.6), k, v, o; linear-attention
  (Gated DeltaNet) in_proj_qkvz, in_proj_ba, conv1d, out_proj and per-head parameters; dense MLP
  gate/up/down or MoE router + experts + shared expert; two norms. Plus the embedding, the
  lm_head (none of its own when ``tie_word_embeddings``), the final norm, and a Qwen-VL-style
  vision tower where the config describes one (:func:`vision_params`, fp16). Bytes per linear
  weight of ``n_out x n_in`` by format:

  - fp16/bf16: ``2 n_out n_in``;
  - FP8 (``fp8`` method or compressed-tensors float8): ``n_out n_in`` + fp32 scales (one per
    ``weight_block_size`` block, else one per output channel);
  - W4A16/W8A16 (compressed-tensors pack-quantized, GPTQ, AWQ): ``bits/8 n_out n_in`` packed
    (int32 words) + fp16 scales per group (``2 n_out ceil(n_in/g)``) + packed zero points when
    asymmetric (``bits/8 n_out ceil(n_in/g)``).

  Modules the checkpoint keeps unquantized (compressed-tensors ``ignore``, fp8
  ``modules_to_not_convert``) and the embedding and lm_head count as fp16.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from volta_core.host.checkpoint import is_ignored
from volta_core.host.types import QuantConfig
from volta_core.planner.model import GATED_QUERY_MODEL_TYPES, ModelLayer
from volta_core.planner.safetensors_header import DTYPE_BYTES, TensorEntry

#: Part kinds: what a decode step reads of them differs (experts: only the routed ones).
KINDS = (
    "attention",
    "linear_attention",
    "mlp",
    "experts",
    "norm",
    "embedding",
    "lm_head",
    "vision",
    "mtp",
    "other",
)


@dataclass(frozen=True)
class LinearFormat:
    """How one linear weight is stored: ``fp16``, ``fp8`` or ``int<bits>`` with its groups."""

    name: str
    bits: int = 16
    group_size: int | None = None
    symmetric: bool = True
    block: tuple[int, int] | None = None

    def nbytes(self, n_out: int, n_in: int) -> int:
        """Bytes of an ``n_out x n_in`` weight in this format (formulas in the module doc)."""
        if self.name == "fp16":
            return 2 * n_out * n_in
        if self.name == "fp8":
            if self.block is not None:
                scales = math.ceil(n_out / self.block[0]) * math.ceil(n_in / self.block[1])
            else:
                scales = n_out
            return n_out * n_in + 4 * scales
        groups = math.ceil(n_in / self.group_size) if self.group_size else 1
        packed = math.ceil(n_out * n_in * self.bits / 32) * 4
        zeros = 0 if self.symmetric else math.ceil(n_out * groups * self.bits / 32) * 4
        return packed + 2 * n_out * groups + zeros


FP16 = LinearFormat("fp16")


@dataclass(frozen=True)
class WeightPart:
    """One rank's share of one part of the model: parameters (for FLOPs) and bytes."""

    kind: str
    layer: int | None
    params: int
    nbytes: int
    fmt: str = "fp16"


@dataclass
class WeightReport:
    """Per-rank weights, where they came from, and what was left out."""

    source: str
    parts: list[WeightPart] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def layer_parts(self, layer: int) -> list[WeightPart]:
        return [p for p in self.parts if p.layer == layer]

    def kind_bytes(self, kind: str) -> int:
        return sum(p.nbytes for p in self.parts if p.kind == kind)


def linear_format(quant: QuantConfig | None, prefix: str) -> LinearFormat:
    """The storage format of the linear layer ``prefix`` under the checkpoint's quant scheme."""
    if quant is None:
        return FP16
    raw = quant.raw
    if quant.method == "fp8":
        skipped = raw.get("modules_to_not_convert") or raw.get("ignored_layers") or ()
        if any(isinstance(s, str) and s in prefix for s in skipped):
            return FP16
        block = raw.get("weight_block_size")
        blk = None
        if isinstance(block, list) and len(block) == 2:
            blk = (int(block[0]), int(block[1]))
        return LinearFormat("fp8", 8, block=blk)
    if quant.method == "compressed-tensors":
        if is_ignored(quant, prefix):
            return FP16
        return _ct_format(raw)
    bits = raw.get("bits") or raw.get("w_bit")
    if isinstance(bits, int) and bits < 16:
        group = raw.get("group_size") or raw.get("q_group_size")
        sym = bool(raw.get("sym", not raw.get("zero_point", False)))
        return LinearFormat(f"int{bits}", bits, int(group) if group else None, sym)
    return FP16


def _ct_format(raw: Mapping[str, Any]) -> LinearFormat:
    groups = raw.get("config_groups")
    for group in groups.values() if isinstance(groups, Mapping) else ():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            continue
        bits = int(weights.get("num_bits") or 16)
        if weights.get("type") == "float" and bits == 8:
            return LinearFormat("fp8", 8)
        if bits < 16:
            g = weights.get("group_size") if weights.get("strategy") == "group" else None
            sym = bool(weights.get("symmetric", True))
            return LinearFormat(f"int{bits}", bits, int(g) if g else None, sym)
    return FP16


def _base(layers: Sequence[ModelLayer]) -> str:
    return layers[0].prefix.split(".layers.")[0] if layers else "model"


def weights_from_config(
    text: Any,
    model_type: str,
    layers: Sequence[ModelLayer],
    quant: QuantConfig | None,
    tp: int,
    vision: Mapping[str, Any] | None = None,
    mtp_layers: int = 0,
) -> WeightReport:
    """Per-rank weights estimated from the text config ``text`` (transformers' object), the
    raw ``vision_config`` (fp16, split across ranks), if any, and ``mtp_layers`` MTP draft
    layers (kind ``mtp``: each a full-attention decoder layer shaped like the model's first,
    plus its ``2 hidden -> hidden`` input projection and norms, stored as the checkpoint
    stores modules named ``mtp.*``; the draft shares the embedding and lm_head)."""
    report = WeightReport("estimated from config.json and the quant scheme")
    hidden = int(text.hidden_size)
    base = _base(layers)

    def linear(kind: str, layer: int, prefix: str, n_out: int, n_in: int, share: float) -> None:
        fmt = linear_format(quant, prefix)
        params = n_out * n_in
        report.parts.append(
            WeightPart(
                kind,
                layer,
                math.ceil(params * share),
                math.ceil(fmt.nbytes(n_out, n_in) * share),
                fmt.name,
            )
        )

    def plain(kind: str, layer: int | None, params: int, share: float) -> None:
        n = math.ceil(params * share)
        report.parts.append(WeightPart(kind, layer, n, 2 * n))

    gated = 2 if str(getattr(text, "model_type", model_type)) in GATED_QUERY_MODEL_TYPES else 1
    first_attention = next((la for la in layers if la.is_attention), None)
    draft = (
        [(replace(first_attention, index=-1 - k), f"mtp.layers.{k}") for k in range(mtp_layers)]
        if first_attention is not None
        else []
    )
    decoder = [(layer, f"{base}.layers.{layer.index}") for layer in layers]
    for layer, pre in [*decoder, *draft]:
        i = layer.index
        if layer.is_attention:
            q, kv = layer.num_heads * layer.head_size, layer.num_kv_heads * layer.head_size
            kv_share = max(1, layer.num_kv_heads // tp) / layer.num_kv_heads
            linear("attention", i, f"{pre}.self_attn.q_proj", gated * q, hidden, 1 / tp)
            linear("attention", i, f"{pre}.self_attn.k_proj", kv, hidden, kv_share)
            linear("attention", i, f"{pre}.self_attn.v_proj", kv, hidden, kv_share)
            linear("attention", i, f"{pre}.self_attn.o_proj", hidden, q, 1 / tp)
            plain("norm", i, 2 * layer.head_size, 1)
        elif layer.layer_type == "linear_attention":
            nk, nv = int(text.linear_num_key_heads), int(text.linear_num_value_heads)
            key, value = nk * int(text.linear_key_head_dim), nv * int(text.linear_value_head_dim)
            la = f"{pre}.linear_attn"
            linear("linear_attention", i, f"{la}.in_proj_qkvz", 2 * key + 2 * value, hidden, 1 / tp)
            linear("linear_attention", i, f"{la}.in_proj_ba", 2 * nv, hidden, 1 / tp)
            linear("linear_attention", i, f"{la}.out_proj", hidden, value, 1 / tp)
            conv = (2 * key + value) * int(getattr(text, "linear_conv_kernel_dim", 4))
            plain("linear_attention", i, conv + 2 * nv, 1 / tp)
            plain("norm", i, int(text.linear_value_head_dim), 1)
        else:
            report.notes.append(f"layer {i} ({layer.layer_type}): its mixer's weights not counted")
        _mlp(text, i, f"{pre}.mlp", linear, plain, tp)
        plain("norm", i, 2 * hidden, 1)
    for layer, pre in draft:
        linear("mtp", layer.index, f"{pre}.fc", hidden, 2 * hidden, 1 / tp)
        plain("norm", layer.index, 3 * hidden, 1)
    drafted = {layer.index for layer, _ in draft}
    report.parts = [replace(p, kind="mtp") if p.layer in drafted else p for p in report.parts]
    vocab = int(text.vocab_size)
    plain("embedding", None, vocab * hidden, 1 / tp)
    if not getattr(text, "tie_word_embeddings", False):
        plain("lm_head", None, vocab * hidden, 1 / tp)
    plain("norm", None, hidden, 1)
    tower = vision_params(vision, hidden) if vision else None
    if tower is not None:
        plain("vision", None, tower, 1 / tp)
    else:
        report.notes.append("config estimate: no vision tower counted (the config describes none)")
    return report


def vision_params(vision: Mapping[str, Any], text_hidden: int) -> int | None:
    """Parameters of a Qwen-VL-style vision tower (``vision_config`` with ``depth``,
    ``hidden_size``, ``intermediate_size``); None for a config of another shape.

    Patch embedding ``in_channels x temporal_patch_size x patch_size^2 x h``, position
    embeddings ``num_position_embeddings x h``; per block q/k/v/proj ``4 h^2``, MLP
    ``2 h x intermediate``, two norms, biases; the patch merger ``(h m^2)^2 + h m^2 x out``
    (``m = spatial_merge_size``, ``out = out_hidden_size``).
    """
    try:
        depth, h = int(vision["depth"]), int(vision["hidden_size"])
        inter = int(vision["intermediate_size"])
        patch = int(vision.get("in_channels", 3)) * int(vision.get("temporal_patch_size", 2))
        patch *= int(vision.get("patch_size", 16)) ** 2 * h
        positions = int(vision.get("num_position_embeddings", 0)) * h
        merged = h * int(vision.get("spatial_merge_size", 2)) ** 2
        out = int(vision.get("out_hidden_size", text_hidden))
    except (KeyError, TypeError, ValueError):
        return None
    block = 4 * h * h + 2 * h * inter + 9 * h + inter
    return patch + positions + depth * block + merged * merged + merged * out + 2 * h + merged + out


def _mlp(text: Any, i: int, pre: str, linear: Any, plain: Any, tp: int) -> None:
    hidden = int(text.hidden_size)
    experts = int(getattr(text, "num_experts", None) or getattr(text, "n_routed_experts", 0) or 0)
    if experts:
        moe = int(getattr(text, "moe_intermediate_size", None) or text.intermediate_size)
        plain("mlp", i, experts * hidden, 1)  # router: replicated, kept unquantized
        # All experts alike: expert 0's format, times the expert count (TP splits each one).
        for proj, n_out, n_in in (("gate_proj", moe, hidden), ("up_proj", moe, hidden)):
            linear("experts", i, f"{pre}.experts.0.{proj}", n_out, n_in, experts / tp)
        linear("experts", i, f"{pre}.experts.0.down_proj", hidden, moe, experts / tp)
        shared = int(getattr(text, "shared_expert_intermediate_size", 0) or 0)
        if shared:
            sp = f"{pre}.shared_expert"
            linear("mlp", i, f"{sp}.gate_proj", shared, hidden, 1 / tp)
            linear("mlp", i, f"{sp}.up_proj", shared, hidden, 1 / tp)
            linear("mlp", i, f"{sp}.down_proj", hidden, shared, 1 / tp)
        return
    inter = int(text.intermediate_size)
    linear("mlp", i, f"{pre}.gate_proj", inter, hidden, 1 / tp)
    linear("mlp", i, f"{pre}.up_proj", inter, hidden, 1 / tp)
    linear("mlp", i, f"{pre}.down_proj", hidden, inter, 1 / tp)


_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_MTP_RE = re.compile(r"(?:^|\.)mtp\.")
_VISION = ("visual.", "vision_tower", "vision_model", "multi_modal_projector", "vision_embed")


def tensor_kind(name: str) -> tuple[str, int | None]:
    """The part a tensor belongs to (see :data:`KINDS`), and its decoder layer if any."""
    if any(v in name for v in _VISION):
        return "vision", None
    if "embed_tokens" in name:
        return "embedding", None
    if name.startswith("lm_head") or ".lm_head." in name:
        return "lm_head", None
    match = _LAYER_RE.search(name)
    layer = int(match.group(1)) if match else None
    if ".experts." in name:
        return "experts", layer
    owner = name.rsplit(".", 2)[-2] if "." in name else name
    if "norm" in owner:
        return "norm", layer
    if ".self_attn." in name or ".attention." in name:
        return "attention", layer
    if ".linear_attn." in name:
        return "linear_attention", layer
    if ".mlp." in name or ".feed_forward." in name:
        return "mlp", layer
    return ("norm" if "norm" in name else "other"), layer


def rank_share(name: str, tp: int, kv_heads: int) -> float:
    """The part of the linear tensor or module ``name`` one of ``tp`` ranks holds, as vLLM
    shards it: the MoE router and the shared expert's gate replicated, K and V by KV heads
    (replicated when fewer than the ranks), every other projection split evenly."""
    if name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
        return 1.0
    if re.search(r"\.(k_proj|v_proj)\.", name) and kv_heads:
        return max(1, kv_heads // tp) / kv_heads
    return 1 / tp


def _tensor_share(entry: TensorEntry, kind: str, tp: int, kv_heads: int) -> float:
    return 1.0 if kind == "norm" else rank_share(entry.name, tp, kv_heads)


def weights_from_tensors(
    tensors: Sequence[TensorEntry],
    tp: int,
    kv_heads: int,
    bits: int,
    files: int,
    with_mtp: bool = False,
) -> WeightReport:
    """Per-rank weights from a checkpoint's real tensors (sharding rules in the module doc).

    ``bits`` is the quantized weights' width, used only to count the parameters an int32
    word packs (for FLOPs); bytes are the tensors' own.
    """
    report = WeightReport(f"checkpoint safetensors headers ({len(tensors)} tensors, {files} files)")
    skipped = 0
    for entry in tensors:
        kind, layer = tensor_kind(entry.name)
        share = _tensor_share(entry, kind, tp, kv_heads)
        if _MTP_RE.search(entry.name):
            if not with_mtp:
                skipped += entry.nbytes
                continue
            kind, layer = "mtp", -1
        itemsize = DTYPE_BYTES.get(entry.dtype, 1)
        params = entry.nbytes // itemsize
        if entry.dtype in {"I32", "U32"} and entry.name.endswith(("weight_packed", "qweight")):
            params *= 32 // bits
        fmt = {"F8_E4M3": "fp8", "F8_E5M2": "fp8", "I32": f"int{bits}", "U32": f"int{bits}"}
        report.parts.append(
            WeightPart(
                kind,
                layer,
                math.ceil(params * share),
                math.ceil(entry.nbytes * share),
                fmt.get(entry.dtype, "fp16"),
            )
        )
    if skipped:
        report.notes.append(
            f"mtp.* draft-head tensors ({skipped / 2**30:.2f} GiB in all) not counted: vLLM "
            "loads them only with --speculative-config"
        )
    return report
