"""Does a model fit on N GPUs at the engine's settings, and how much context is left?

Per rank (all ranks hold the same under tensor parallelism)::

    budget      = gpu_memory x gpu_memory_utilization
    KV memory   = budget - weights - engine reserve            (volta_core.planner.reserve)
    need(L)     = sum over attention layers of bytes_per_token(layer) x held(layer, L)
                  + sum over linear-attention layers of their per-sequence state
    held(layer, L) = min(L, window + block_size) for a sliding-window layer, else L
    fits        = KV memory >= need(max_model_len)             (vLLM's own start-up check)
    sequences   = floor(KV memory / need(max_model_len)), at most max_num_seqs
    tokens      = floor((KV memory - one sequence's state) / sum of bytes_per_token),
                  in whole blocks

``bytes_per_token(layer)`` is the plan's per-layer KV computation
(:attr:`volta_core.planner.plan.Plan.kv_layers`): ``2 x head_size x max(1, kv_heads // tp)``
elements of the cache dtype. A layer that reuses another's cache (Gemma's KV-shared layers) holds
none.

When it does not fit, each knob is tried and suggested only if the fit recomputed with it
holds: ``--kv-cache-dtype fp8_e5m2`` (if the plugins accept it for this checkpoint), a larger
``--tensor-parallel-size`` (on as many GPUs, up to :data:`MAX_GPUS`), a shorter
``--max-model-len`` (the longest that fits). A model that fits at no TP up to
:data:`MAX_GPUS` even with fp8_e5m2 KV and one block of context cannot fit at any setting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from volta_core.errors import UsageError
from volta_core.host.checkpoint import weight_format
from volta_core.host.manager import VoltaPluginManager
from volta_core.planner.linear_state import state_bytes_per_sequence
from volta_core.planner.model import ModelDescription
from volta_core.planner.plan import Plan, PlanOptions, make_plan
from volta_core.planner.reserve import RESERVE_MODEL, Reserve, capture_sizes, engine_reserve
from volta_core.planner.safetensors_header import TensorEntry, checkpoint_files, checkpoint_tensors
from volta_core.planner.weights import WeightReport, weights_from_config, weights_from_tensors

GIB = 1 << 30
#: What a V100-32GB reports to CUDA (nvidia-smi: 32510MiB); the default ``--gpu-memory``.
V100_32GB = "32510MiB"
#: The most GPUs a suggestion may ask for (one host).
MAX_GPUS = 8
#: vLLM's defaults for the OpenAI server on a GPU under 70 GiB (EngineArgs).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, what: str = "--gpu-memory") -> int:
    """Bytes from ``32GiB``, ``32510MiB``, ``34GB`` or a plain byte count (units: B, KB, MB,
    GB, TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024; any case).

    Raises :class:`UsageError` for anything else, or a size of zero.
    """
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise UsageError(
            f"{what} {text!r} is not a size (examples: 32GiB, 32510MiB, 16GB, 34359738368)"
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise UsageError(f"{what} {text!r} must be more than zero bytes")
    return size


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class FitOptions:
    """The memory knobs of a fit (vLLM's flags of the same names, plus the hardware)."""

    gpus: int = 1
    gpu_memory: int = 32510 << 20
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    speculative_tokens: int = 0
    """MTP draft tokens per step (``--speculative-config '{"method": "mtp",
    "num_speculative_tokens": N}'``): the draft layers' weights and KV cache count, and each
    linear-attention layer keeps ``1 + N`` state slots per sequence."""

    def __post_init__(self) -> None:
        if self.speculative_tokens < 0:
            raise UsageError("--speculative-tokens must not be negative")
        if self.gpus < 1:
            raise UsageError("--gpus must be at least 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise UsageError(
                f"--gpu-memory-utilization {self.gpu_memory_utilization} is not in (0, 1]"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise UsageError("--max-model-len must be at least 1")
        if self.max_num_seqs < 1:
            raise UsageError("--max-num-seqs must be at least 1")
        if self.max_num_batched_tokens < 1:
            raise UsageError("--max-num-batched-tokens must be at least 1")


@dataclass(frozen=True)
class LayerNeed:
    """One layer's KV bytes per token (per rank) and its window, or its per-sequence state."""

    index: int
    bytes_per_token: int
    window: int | None
    state_bytes: int


@dataclass
class Fit:
    """The fit of one setting (per rank); ``suggestions`` are filled when it does not fit."""

    tp: int
    kv_cache_dtype: str
    max_model_len: int
    budget: int
    weights: WeightReport
    reserve: Reserve
    layers: list[LayerNeed]
    block_size: int
    max_num_seqs: int
    capture_sizes: tuple[int, ...] = ()
    """The CUDA-graph capture sizes the reserve counts (:func:`~volta_core.planner.reserve.
    capture_sizes`), the ones the plan's serve command passes."""
    notes: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    impossible: str | None = None

    @property
    def kv_available(self) -> int:
        return self.budget - self.weights.total_bytes - self.reserve.total

    @property
    def bytes_per_token(self) -> int:
        return sum(layer.bytes_per_token for layer in self.layers)

    @property
    def state_per_sequence(self) -> int:
        return sum(layer.state_bytes for layer in self.layers)

    def need(self, context: int) -> int:
        """KV bytes one sequence of ``context`` tokens needs on one rank (module doc)."""
        total = self.state_per_sequence
        for layer in self.layers:
            held = context
            if layer.window is not None:
                held = min(context, layer.window + self.block_size)
            total += layer.bytes_per_token * held
        return total

    @property
    def fits(self) -> bool:
        return self.kv_available >= self.need(self.max_model_len)

    @property
    def concurrency(self) -> float:
        return max(0.0, self.kv_available / max(1, self.need(self.max_model_len)))

    @property
    def sequences(self) -> int:
        return min(self.max_num_seqs, int(self.concurrency))

    @property
    def tokens(self) -> int:
        room = self.kv_available - self.state_per_sequence
        if room <= 0 or not self.bytes_per_token:
            return 0
        blocks = room // self.bytes_per_token // self.block_size
        return int(blocks * self.block_size)

    def longest_context(self, limit: int) -> int:
        """The longest ``max_model_len`` up to ``limit`` whose sequence fits (0 if none)."""
        if self.kv_available < self.need(1):
            return 0
        lo, hi = 1, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.need(mid) <= self.kv_available:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def as_dict(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "impossible": self.impossible,
            "tensor_parallel_size": self.tp,
            "kv_cache_dtype": self.kv_cache_dtype,
            "max_model_len": self.max_model_len,
            "per_rank_bytes": {
                "budget": self.budget,
                "weights": self.weights.total_bytes,
                "reserve": self.reserve.as_dict(),
                "kv_available": self.kv_available,
                "kv_needed_at_max_model_len": self.need(self.max_model_len),
                "kv_bytes_per_token": self.bytes_per_token,
                "linear_state_per_sequence": self.state_per_sequence,
            },
            "weights_source": self.weights.source,
            "reserve_model": RESERVE_MODEL,
            "cuda_graph_capture_sizes": list(self.capture_sizes),
            "kv_tokens": self.tokens,
            "concurrency_at_max_model_len": round(self.concurrency, 3),
            "sequences_at_max_model_len": self.sequences,
            "suggestions": list(self.suggestions),
            "notes": [*self.weights.notes, *self.notes],
        }


class Sizer:
    """Computes fits of one model at any TP, KV dtype and context (re-planning for each)."""

    def __init__(
        self,
        model: ModelDescription,
        raw: Mapping[str, Any],
        text: Any,
        options: PlanOptions,
        fit_options: FitOptions,
        manager: VoltaPluginManager,
        checkpoint: Path | None,
    ) -> None:
        self.model, self.raw, self.text, self.options = model, raw, text, options
        self.fit_options, self.manager = fit_options, manager
        self.tensors: Sequence[TensorEntry] = ()
        self.files = 0
        if checkpoint is not None:
            self.files = len(checkpoint_files(checkpoint))
            self.tensors = checkpoint_tensors(checkpoint)
        self.model_max = int(getattr(text, "max_position_embeddings", 0) or 0) or None
        if (
            fit_options.max_model_len is not None
            and self.model_max is not None
            and fit_options.max_model_len > self.model_max
        ):
            raise UsageError(
                f"--max-model-len {fit_options.max_model_len} is longer than the model's "
                f"maximum ({self.model_max}, max_position_embeddings)"
            )
        self.max_model_len = fit_options.max_model_len or self.model_max or 4096
        self.mtp_layers = 0
        if fit_options.speculative_tokens:
            self.mtp_layers = int(getattr(text, "mtp_num_hidden_layers", 0) or 0)
            if not self.mtp_layers:
                raise UsageError(
                    f"{model.name}: --speculative-tokens needs an MTP draft head "
                    "(mtp_num_hidden_layers in the config); this model has none"
                )

    def weights(self, tp: int) -> WeightReport:
        if self.tensors:
            kv_heads = max((la.num_kv_heads for la in self.model.layers), default=0)
            bits = 4 if "int4" in weight_format(self.model.quant) else 8
            return weights_from_tensors(
                self.tensors, tp, kv_heads, bits, self.files, with_mtp=self.mtp_layers > 0
            )
        vision = self.raw.get("vision_config")
        return weights_from_config(
            self.text,
            self.model.model_type,
            self.model.layers,
            self.model.quant,
            tp,
            vision if isinstance(vision, Mapping) else None,
            self.mtp_layers,
        )

    def plan(self, tp: int, kv_cache_dtype: str) -> Plan:
        options = replace(self.options, tensor_parallel_size=tp, kv_cache_dtype=kv_cache_dtype)
        return make_plan(self.model, options, self.manager)

    def fit(self, plan: Plan, max_model_len: int | None = None) -> Fit:
        """The fit of ``plan``'s TP and KV dtype at ``max_model_len`` (default: the option)."""
        tp = plan.options.tensor_parallel_size
        dtype_bytes = plan.activation_bytes
        states = {
            la.index: state_bytes_per_sequence(self.text, la, tp, dtype_bytes)
            for la in self.model.layers
        }
        kv = {k.index: k for k in plan.kv_layers}
        slots = 1 + self.fit_options.speculative_tokens
        layers = [
            LayerNeed(
                la.index,
                kv[la.index].bytes_per_token if la.index in kv else 0,
                kv[la.index].window if la.index in kv else None,
                (states[la.index] or 0) * slots,
            )
            for la in self.model.layers
        ]
        # Each MTP draft layer is a full-attention layer with a cache like the model's first.
        full = next((k for k in plan.kv_layers if k.window is None), None)
        if full is not None:
            layers += [
                LayerNeed(-1 - k, full.bytes_per_token, None, 0) for k in range(self.mtp_layers)
            ]
        unmodelled = sorted({la.layer_type for la in self.model.layers if states[la.index] is None})
        notes = [f"{t} layers: per-sequence state not modelled (counted as 0)" for t in unmodelled]
        text = self.text
        widest = max(
            int(getattr(text, "intermediate_size", 0) or 0),
            *(la.num_heads * la.head_size * 2 for la in self.model.layers if la.is_attention),
            *(
                2 * int(text.linear_num_key_heads) * int(text.linear_key_head_dim)
                + 2 * int(text.linear_num_value_heads) * int(text.linear_value_head_dim)
                for la in self.model.layers[:1]
                if any(x.layer_type == "linear_attention" for x in self.model.layers)
            ),
        )
        fo = self.fit_options
        sizes = capture_sizes(fo.max_num_seqs, 1 + fo.speculative_tokens, fo.max_num_batched_tokens)
        reserve = engine_reserve(
            int(text.hidden_size),
            widest,
            int(text.vocab_size),
            tp,
            fo.max_num_batched_tokens,
            fo.max_num_seqs,
            len(sizes),
        )
        return Fit(
            tp=tp,
            kv_cache_dtype=plan.options.kv_cache_dtype,
            max_model_len=max_model_len or self.max_model_len,
            budget=int(fo.gpu_memory * fo.gpu_memory_utilization),
            weights=self.weights(tp),
            reserve=reserve,
            layers=layers,
            block_size=plan.options.block_size,
            max_num_seqs=fo.max_num_seqs,
            capture_sizes=sizes,
            notes=notes,
        )

    def _runnable(self, plan: Plan) -> bool:
        """Whether the engine would start ``plan`` as far as the fit can tell: the KV dtype is
        accepted, and every sharded size divides across its TP (vLLM asserts it:
        attention heads divide across the ranks, KV heads divide the ranks or the ranks divide
        them). A layer no backend runs is the plan's problem, not the fit's: not judged here."""
        if plan.kv is None or plan.kv.accepted is False:
            return False
        tp, text = plan.options.tensor_parallel_size, self.text
        for la in self.model.layers:
            if la.is_attention and (
                la.num_heads % tp or (la.num_kv_heads % tp and tp % la.num_kv_heads)
            ):
                return False
        sizes = [
            getattr(text, name, None)
            for name in (
                "intermediate_size",
                "moe_intermediate_size",
                "linear_num_key_heads",
                "linear_num_value_heads",
            )
        ]
        return all(not size or int(size) % tp == 0 for size in sizes)

    def suggest(self, fit: Fit) -> None:
        """Fill ``fit.suggestions`` with knobs that make it fit, each checked by a new fit;
        set ``fit.impossible`` when none can (module doc)."""
        if fit.fits:
            return
        e5m2 = "fp8_e5m2"
        current = fit.kv_cache_dtype
        kv_choices = [current]
        if current != e5m2 and fit.layers and self._runnable(self.plan(fit.tp, e5m2)):
            kv_choices.append(e5m2)
        if kv_choices[-1] == e5m2 != current and self.fit(self.plan(fit.tp, e5m2)).fits:
            fit.suggestions.append(f"--kv-cache-dtype {e5m2}")
        for tp in range(fit.tp + 1, MAX_GPUS + 1):
            found = False
            for kv_dtype in kv_choices:
                plan = self.plan(tp, kv_dtype)
                if not self._runnable(plan) or not self.fit(plan).fits:
                    continue
                knob = f"--tensor-parallel-size {tp}"
                if tp > self.fit_options.gpus:
                    knob = f"--gpus {tp} {knob}"
                if kv_dtype != current:
                    knob += f" --kv-cache-dtype {kv_dtype}"
                fit.suggestions.append(knob)
                found = True
                break
            if found:
                break
        longest = fit.longest_context(fit.max_model_len)
        if longest >= fit.block_size:
            fit.suggestions.append(f"--max-model-len {longest}")
        if fit.suggestions:
            return
        # No one knob: the fewest GPUs whose fit, with the smaller KV dtype, holds some context.
        kv_dtype = kv_choices[-1]
        best: Fit | None = None
        for tp in range(fit.tp, MAX_GPUS + 1):
            plan = self.plan(tp, kv_dtype)
            if not self._runnable(plan):
                continue
            best = self.fit(plan)
            longest = best.longest_context(fit.max_model_len)
            if longest >= fit.block_size:
                knob = f"--tensor-parallel-size {tp}" if tp != fit.tp else ""
                if tp > self.fit_options.gpus:
                    knob = f"--gpus {tp} {knob}"
                if kv_dtype != current:
                    knob += f" --kv-cache-dtype {kv_dtype}"
                fit.suggestions.append(f"{knob} --max-model-len {longest}".strip())
                return
        if best is None:
            fit.notes.append(f"no tensor-parallel size up to {MAX_GPUS} divides this model")
            return
        held = (
            f"at tensor parallel {best.tp} (on {best.tp} GPUs) one rank holds "
            f"{gib(best.weights.total_bytes)} of weights + {gib(best.reserve.total)} engine "
            f"reserve"
        )
        if best.kv_available < 0:
            fit.impossible = f"{held}: more than its {gib(best.budget)} budget"
        else:
            fit.impossible = (
                f"{held}, leaving {gib(best.kv_available)} of its {gib(best.budget)} budget: "
                f"less than one {fit.block_size}-token block of KV cache even with "
                f"--kv-cache-dtype {kv_dtype}"
            )


def render_fit(fit: Fit, fit_options: FitOptions) -> list[str]:
    """The fit as text lines (a section of the plan)."""
    fo = fit_options
    w = fit.weights
    lines = [
        f"memory ({fo.gpus} x {gib(fo.gpu_memory)}, tensor parallel {fit.tp}, "
        f"--gpu-memory-utilization {fo.gpu_memory_utilization:g}, "
        f"--max-model-len {fit.max_model_len}, --kv-cache-dtype {fit.kv_cache_dtype})",
        (
            f"  per rank: budget {gib(fit.budget)} = weights {gib(w.total_bytes)} "
            f"+ engine reserve {gib(fit.reserve.total)} + KV cache {gib(fit.kv_available)}"
            if fit.kv_available >= 0
            else f"  per rank: weights {gib(w.total_bytes)} + engine reserve "
            f"{gib(fit.reserve.total)} exceed the budget {gib(fit.budget)} by "
            f"{gib(-fit.kv_available)}: no room for a KV cache"
        ),
        f"  weights: {w.source}",
        f"  engine reserve (estimate): activation {gib(fit.reserve.activation)}, "
        f"sampler {gib(fit.reserve.sampler)}, non-torch {gib(fit.reserve.non_torch)}, "
        f"CUDA graphs {gib(fit.reserve.cuda_graphs)}"
        + (
            f" ({len(fit.capture_sizes)} capture sizes, {fit.capture_sizes[0]}-"
            f"{fit.capture_sizes[-1]} tokens)"
            if fit.capture_sizes
            else ""
        ),
        f"    models {RESERVE_MODEL}",
        f"  KV per token per rank: {fit.bytes_per_token:,} bytes"
        + (
            f"; linear-attention state per sequence: {fit.state_per_sequence / 2**20:.1f} MiB"
            if fit.state_per_sequence
            else ""
        ),
        f"  one sequence of {fit.max_model_len} tokens needs {gib(fit.need(fit.max_model_len))} "
        f"of KV cache per rank",
    ]
    lines += [f"  note: {n}" for n in [*w.notes, *fit.notes]]
    if fit.fits:
        lines.append(
            f"  fits: {fit.tokens:,} tokens of KV cache; {fit.concurrency:.2f} sequences of "
            f"{fit.max_model_len} tokens at once ({fit.sequences} with --max-num-seqs "
            f"{fo.max_num_seqs})"
        )
    else:
        lines.append(
            f"  DOES NOT FIT: needs {gib(fit.need(fit.max_model_len))} of KV cache per rank, "
            f"{gib(max(0, fit.kv_available))} available"
        )
        if fit.suggestions:
            lines.append("  fits with any one of:")
            lines += [f"    {s}" for s in fit.suggestions]
        if fit.impossible:
            lines.append(f"  cannot fit at any setting: {fit.impossible}")
    return lines
