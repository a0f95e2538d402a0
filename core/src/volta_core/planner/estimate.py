"""Estimated decode step, tokens/s and prefill time on a V100: a roofline sum, kernel by kernel.

One decode step of ``batch`` sequences at ``context`` tokens (``q = 1 + draft tokens`` new
tokens each), on one of ``tp`` ranks (they run in parallel), is the sum of these terms, each
summed over the layers that have it:

* **a layer a plugin serves** (an attention layer its backend runs, a linear module or the
  experts its quant method claims): what the plugin's dispatch says the work costs
  (``volta_kernel_cost``), the bytes and FLOPs of the kernel the plan prints for that stage
  (its fallback where that kernel needs NVRTC and the plan found none), each launch
  ``max(bytes / HBM, FLOPs / rate of its unit)``. So the estimate prices tensor cores exactly
  where the plan prints tensor-core kernels;
* **what vLLM runs itself** (the host's own model)::

    linear layer  max(weight bytes / HBM, 2 x tokens x params / tensor rate)    (cuBLAS)
    attention     max(batch x held x KV bytes per token / HBM,
                      4 x batch x q x heads x head_size x held / FMA)
                  held = min(context, window) (TRITON_ATTN: tl.dot on the FMA units on SM70)
    norms         max(bytes / HBM, 2 x tokens x params / FMA)
    MoE experts   weight bytes x (1 - (1 - top_k / experts) ** tokens)  at the tensor rate
    linear-attn   FLA's Triton kernels, each launch priced from its bytes and FMA FLOPs
                  (:mod:`volta_core.planner.linear_attention`): the fused recurrent update,
                  the conv update and the gated RMSNorm in a decode step

  a plugin-served module's part of a layer's weights is taken out of that layer's own-model
  term (what remains: norms, the router, modules the plan does not list);
* all-reduce: latency + 2 (tp - 1) / tp x tokens x hidden x 2 bytes / PCIe, after attention
  and after the MLP in each layer and after the embedding; logits gather: latency +
  (tp - 1) / tp x tokens x vocab x 2 bytes / PCIe;
* launches: (layers x KERNELS_PER_LAYER + 4) x launch gap (inside a CUDA graph).

:func:`estimate_prefill` prices a prompt's prefill (the time to first token) with the same
parts: one pass per chunk of at most ``max_num_batched_tokens`` tokens (vLLM's chunked
prefill), each chunk's linear layers at its tokens (where a plugin's stage for that many
tokens runs the tensor cores, so does the estimate), its attention at ``Workload(1, chunk,
held)`` (the tokens before it and its own), the Gated DeltaNet layers' chunked delta rule, the
lm_head at the one token whose logits the chunk computes, its all-reduces and launch gaps.

Rates are :data:`volta_core.host.dispatch.V100_RATES` (the V100 whitepaper's, the ones the plugins
choose their kernels by), overridable, or a measured device's calibration
(:mod:`volta_core.planner.calibration`); PCIe, all-reduce latency and launch gap are named
assumptions. A roofline: real kernels reach a fraction of 900 GB/s, so it is optimistic. A
calibration with per-family ratios (what ``vllm-volta bench`` measured over this roofline on
that device) multiplies each plugin-served kernel's time by its family's ratio, the family given
by the rules the bench files its calls by (:func:`~volta_core.planner.calibration.attention_family`
of the cost's stage, :func:`~volta_core.planner.calibration.module_family` of the module's kind);
what vLLM runs itself the bench does not time, so no ratio scales it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from volta_core.host.dispatch import V100_RATES, DeviceRates, KernelCost, LaunchCost, Unit, Workload
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import QuantLayer
from volta_core.planner import linear_attention as gdn
from volta_core.planner.calibration import (
    Calibration,
    Family,
    FamilyRatio,
    attention_family,
    module_family,
)
from volta_core.planner.fit import Fit
from volta_core.planner.plan import LayerPlan, Plan, QuantPlan
from volta_core.planner.weights import WeightPart, linear_format, rank_share, tensor_kind

#: Kernels a decoder layer launches in a decode step, as counted for the launch term (norm,
#: projections, rotary or convolution, cache write, attention or recurrence, gate, activation,
#: residual adds, all-reduces).
KERNELS_PER_LAYER = 12

#: Who runs a layer the plugins do not serve.
VLLM = "vLLM"

#: Families the estimate has no term of, so a calibration's ratio for them scales nothing: the
#: KV-cache write is counted only as one of a layer's launches.
UNPRICED_FAMILIES = frozenset({Family.KV_WRITE})


@dataclass(frozen=True)
class SpeedAssumptions:
    """The named figures every estimate states (``--hbm-gbps`` and friends override them)."""

    hbm_gbps: float = V100_RATES.bandwidth / 1e9
    tensor_tflops: float = V100_RATES.tensor_flops / 1e12
    fma_tflops: float = V100_RATES.fma_flops / 1e12
    pcie_gbps: float = 12.0
    allreduce_us: float = 30.0
    launch_us: float = 2.0
    calibration: str = ""
    """The measured device and report the rates come from; empty for the whitepaper's."""
    ratios: tuple[FamilyRatio, ...] = ()
    """The calibration's measured / estimate median per kernel family; none without one."""

    def calibrated(self, calibration: Calibration) -> SpeedAssumptions:
        """These assumptions with ``calibration``'s measured bandwidth, rates and ratios."""
        return replace(
            self,
            hbm_gbps=calibration.bandwidth_gbps,
            tensor_tflops=calibration.tensor_tflops,
            fma_tflops=calibration.fma_tflops,
            calibration=calibration.label,
            ratios=calibration.ratios,
        )

    def scale(self, family: Family | None) -> float:
        """What a plugin-served kernel of ``family`` takes over its roofline: its family's
        ratio, 1 where the calibration has none (or the kernel no family)."""
        return next((r.median_ratio for r in self.ratios if r.family == family), 1.0)

    def rates(self) -> DeviceRates:
        return DeviceRates(
            self.calibration or V100_RATES.name,
            self.hbm_gbps * 1e9,
            self.tensor_tflops * 1e12,
            self.fma_tflops * 1e12,
        )

    def lines(self) -> list[str]:
        source = "measured" if self.calibration else "V100 whitepaper"
        calibrated = (
            f"calibrated: rates measured on {self.calibration}"
            if self.calibration
            else "not calibrated: the V100 whitepaper's rates, not a measured device's "
            "(vllm-volta bench measures one; --calibration NAME uses it)"
        )
        scaled = [r for r in self.ratios if r.family not in UNPRICED_FAMILIES]
        unpriced = [r for r in self.ratios if r.family in UNPRICED_FAMILIES]
        ratios = []
        if scaled:
            ratios.append(
                "scaled by its report's median of measured / estimate per family: the "
                f"plugins' {', '.join(r.label for r in scaled)}; vLLM's own kernels and other "
                "families as priced"
            )
        if unpriced:
            ratios.append(
                f"not applied: {', '.join(r.label for r in unpriced)}: the estimate has no "
                "term of it"
            )
        return [
            calibrated,
            *ratios,
            f"HBM2 {self.hbm_gbps:g} GB/s ({source}) for weight, KV and state reads",
            f"fp16 tensor cores {self.tensor_tflops:g} TFLOP/s (cuBLAS; the plugins' CUDA "
            "mma.m8n8k4 kernels)",
            f"fp32 FMA {self.fma_tflops:g} TFLOP/s (Triton's tl.dot and the GEMVs on SM70; "
            "vLLM's TRITON_ATTN; FLA's Gated DeltaNet kernels)",
            "each stage a plugin serves: the cost its dispatch gives for the kernel the plan "
            "prints; vLLM's own layers: the host's model",
            f"PCIe {self.pcie_gbps:g} GB/s effective for all-reduce and logits gather "
            "(--pcie-gbps), "
            f"{self.allreduce_us:g} us latency each (--allreduce-us; NCCL between PCIe cards "
            "without NVLink)",
            f"{self.launch_us:g} us per kernel inside a CUDA graph (--launch-us), "
            f"{KERNELS_PER_LAYER} kernels per layer",
        ]


@dataclass
class Term:
    """One kind of work's time, summed over the layers (or calls) that run it; ``count`` is
    how many distinct layers or calls contributed, ``kernels`` what runs it and on which unit."""

    kernel: str
    count: int = 0
    bytes: int = 0
    flops: int = 0
    seconds: float = 0.0
    bound: str = ""
    kernels: list[str] = field(default_factory=list)
    _seen: set[object] = field(default_factory=set, repr=False)

    def add(
        self, key: object, nbytes: float, flops: float, seconds: float, bound: str, kernel: str = ""
    ) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self.count += 1
        self.bytes += int(nbytes)
        self.flops += int(flops)
        self.seconds += seconds
        self.bound = bound if not self.bound or self.bound == bound else "mixed"
        if kernel and kernel not in self.kernels:
            self.kernels.append(kernel)


@dataclass
class KernelLine:
    """One module's or attention shape's work in the step and the kernel that runs it, summed
    over ``layers`` (the decoder layers that run it; -1 and below are MTP draft layers)."""

    term: str
    module: str
    stage: str
    kernel: str
    unit: str
    served_by: str
    layers: list[int] = field(default_factory=list)
    bytes: int = 0
    flops: int = 0
    seconds: float = 0.0
    bound: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "term": self.term,
            "module": self.module,
            "layers": self.layers,
            "stage": self.stage,
            "kernel": self.kernel,
            "unit": self.unit,
            "served_by": self.served_by,
            "bytes": self.bytes,
            "flops": self.flops,
            "ms": round(self.seconds * 1e3, 4),
            "bound": self.bound,
        }


@dataclass
class SpeedEstimate:
    """The estimated decode step on one rank and what it implies."""

    batch: int
    context: int
    tp: int
    assumptions: SpeedAssumptions
    terms: list[Term] = field(default_factory=list)
    tokens_per_step: float = 1.0
    """Tokens each sequence gains per step: 1, or ``1 + N x acceptance`` with MTP."""
    speculative_tokens: int = 0
    acceptance: float = 0.0
    kernels: list[KernelLine] = field(default_factory=list)
    """Per module and attention shape: the stage, kernel, unit and cost terms."""
    nvrtc: bool = True
    """Whether kernels that need NVRTC were priced as themselves (else as their fallbacks)."""

    @property
    def step_seconds(self) -> float:
        return sum(t.seconds for t in self.terms)

    @property
    def tokens_per_second(self) -> float:
        """All sequences together: ``batch x tokens_per_step / step``."""
        return self.batch * self.per_sequence_tokens_per_second

    @property
    def per_sequence_tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step_seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": "estimate (SM70 roofline sum, not a measurement)",
            "batch": self.batch,
            "context": self.context,
            "tensor_parallel_size": self.tp,
            "step_ms": round(self.step_seconds * 1e3, 3),
            "speculative_tokens": self.speculative_tokens,
            "acceptance": self.acceptance,
            "tokens_per_step": round(self.tokens_per_step, 3),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "tokens_per_second_per_sequence": round(self.per_sequence_tokens_per_second, 2),
            "nvrtc": self.nvrtc,
            "terms": _terms_dict(self.terms),
            "kernels": [line.as_dict() for line in self.kernels],
            "assumptions": asdict(self.assumptions) | {"kernels_per_layer": KERNELS_PER_LAYER},
            "assumption_notes": self.assumptions.lines(),
        }


@dataclass
class PrefillEstimate:
    """The estimated prefill of one ``prompt``-token sequence in ``chunks`` chunks of at most
    ``chunk`` tokens on one rank: its time is the time to first token."""

    prompt: int
    chunk: int
    chunks: int
    tp: int
    assumptions: SpeedAssumptions
    terms: list[Term] = field(default_factory=list)
    kernels: list[KernelLine] = field(default_factory=list)
    nvrtc: bool = True

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.terms)

    @property
    def tokens_per_second(self) -> float:
        return self.prompt / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": "estimate (SM70 roofline sum, not a measurement)",
            "prompt_tokens": self.prompt,
            "chunk_tokens": self.chunk,
            "chunks": self.chunks,
            "tensor_parallel_size": self.tp,
            "ms": round(self.seconds * 1e3, 3),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "nvrtc": self.nvrtc,
            "terms": _terms_dict(self.terms),
            "kernels": [line.as_dict() for line in self.kernels],
        }


def _terms_dict(terms: Sequence[Term]) -> list[dict[str, Any]]:
    return [
        {
            "kernel": t.kernel,
            "count": t.count,
            "bytes": t.bytes,
            "flops": t.flops,
            "ms": round(t.seconds * 1e3, 4),
            "bound": t.bound,
            "kernels": t.kernels,
        }
        for t in terms
    ]


def _own_linear(nbytes: float, params: float, tokens: int) -> KernelCost:
    """A linear part vLLM runs itself: its bytes, its product on the tensor cores (cuBLAS)."""
    return KernelCost(
        "cuBLAS", (LaunchCost(int(nbytes), 0, int(2 * tokens * params), Unit.TENSOR_CORES),)
    )


@dataclass(frozen=True)
class _Served:
    """A linear module or experts a plugin serves, with the rank's shape and weights."""

    plan: QuantPlan
    module: QuantLayer
    kind: str
    layer_type: str | None
    weight_bytes: int
    params: int


_ROW_PARALLEL = ("o_proj", "down_proj", "out_proj")


def _rank_module(
    q: QuantPlan, module: QuantLayer, plan: Plan, tp: int
) -> tuple[QuantLayer, int, int] | None:
    """The module as one of ``tp`` ranks holds it (vLLM's column- and row-parallel layers, KV
    heads replicated when fewer than the ranks, the router replicated, experts' intermediate
    split), with its weight bytes and parameters on the rank; None without a shape. The rank's
    module is whole to the plugins it is priced by (``tensor_parallel_size`` 1): its shape is
    already the rank's, and dividing it again would refuse what the full layer's claim took."""
    n, k = module.output_size, module.input_size
    if not (n and k):
        return None
    fmt = linear_format(plan.model.quant, q.prefix)
    name = q.prefix.rsplit(".", 1)[-1]
    if module.experts:
        inter = math.ceil(n / tp)
        expert = linear_format(plan.model.quant, f"{q.prefix}.0.gate_proj")
        per_expert = 2 * expert.nbytes(inter, k) + expert.nbytes(k, inter)
        rank = replace(module, output_size=inter, tensor_parallel_size=1)
        return rank, module.experts * per_expert, module.experts * 3 * k * inter
    layer = _layer_of(q.prefix, plan)
    share = rank_share(f"{q.prefix}.weight", tp, layer.layer.num_kv_heads if layer else 0)
    if name in _ROW_PARALLEL:
        k = math.ceil(k * share)
    else:
        n = math.ceil(n * share)
    rank = replace(module, output_size=n, input_size=k, tensor_parallel_size=1)
    return rank, fmt.nbytes(n, k), n * k


def _layer_of(prefix: str, plan: Plan) -> LayerPlan | None:
    _, index = tensor_kind(f"{prefix}.weight")
    return next((lp for lp in plan.layers if lp.layer.index == index), None)


def _served_modules(plan: Plan, tp: int) -> list[_Served]:
    served = []
    for q in plan.quant:
        if q.plugin is None or q.method is None or q.module is None:
            continue
        rank = _rank_module(q, q.module, plan, tp)
        if rank is None:
            continue
        kind, _ = tensor_kind(f"{q.prefix}.weight")
        owner = _layer_of(q.prefix, plan)
        layer_type = owner.layer.layer_type if owner is not None else None
        served.append(_Served(q, rank[0], kind, layer_type, rank[1], rank[2]))
    return served


class _Step:
    """Accumulates one estimate's terms and per-kernel lines."""

    def __init__(self, plan: Plan, manager: VoltaPluginManager, a: SpeedAssumptions) -> None:
        self.plan, self.manager, self.assumptions = plan, manager, a
        self.nvrtc = not any(p.needs_nvrtc for p in _printed_paths(plan)) or plan.nvrtc is not None
        self.rates = a.rates()
        self.terms: dict[str, Term] = {}
        self.lines: dict[tuple[str, str, str, str], KernelLine] = {}

    def kernel_lines(self) -> list[KernelLine]:
        return sorted(self.lines.values(), key=lambda line: (line.term, line.module, line.stage))

    def term(self, name: str) -> Term:
        return self.terms.setdefault(name, Term(name))

    def add(
        self,
        name: str,
        key: object,
        cost: KernelCost,
        module: str,
        layer: int,
        stage: str = "",
        served_by: str = VLLM,
        runs: float = 1.0,
        family: Family | None = None,
    ) -> None:
        """Add ``runs`` times ``cost`` to term ``name`` and to its kernel line, its time
        scaled by the calibration's ratio for ``family`` (a plugin-served kernel's)."""
        seconds = cost.seconds(self.rates) * runs * self.assumptions.scale(family)
        bound = cost.bound(self.rates)
        unit = cost.unit.value
        label = cost.kernel if unit in cost.kernel else f"{cost.kernel} on {unit}"
        self.term(name).add(key, cost.bytes * runs, cost.flops * runs, seconds, bound, label)
        line = self.lines.setdefault(
            (name, module, stage, cost.kernel),
            KernelLine(name, module, stage, cost.kernel, cost.unit.value, served_by),
        )
        if layer not in line.layers:
            line.layers.append(layer)
        line.bytes += int(cost.bytes * runs)
        line.flops += int(cost.flops * runs)
        line.seconds += seconds
        line.bound = bound if not line.bound or line.bound == bound else "mixed"

    def plugin_cost(
        self, plugin: str, layer: Any, served_by: str, work: Workload
    ) -> tuple[str, KernelCost] | None:
        """The stage and the serving kernel's cost by ``plugin``, or None where it gives none."""
        device, quant = self.plan.options.device, self.plan.model.quant
        answer = self.manager.kernel_cost(plugin, layer, served_by, device, quant, work)
        return None if answer is None else (answer.stage, answer.serving(self.nvrtc))


def estimate_decode(
    fit: Fit,
    plan: Plan,
    manager: VoltaPluginManager,
    text: Any,
    batch: int,
    context: int,
    assumptions: SpeedAssumptions,
    speculative_tokens: int = 0,
    acceptance: float = 0.0,
) -> SpeedEstimate:
    """The decode step of ``batch`` sequences at ``context`` tokens (formulas in the doc).

    With ``speculative_tokens`` N (MTP), a step verifies N + 1 tokens per sequence in one
    pass of the model (weights read once, FLOPs, all-reduce bytes and state writes N + 1
    times) after N sequential passes of the draft layer and the lm_head, and yields
    ``1 + N x acceptance`` tokens per sequence (``acceptance``: accepted / drafted tokens,
    as vLLM's ``spec_decode_num_accepted_tokens`` over ``num_draft_tokens``).
    """
    step = _Step(plan, manager, assumptions)
    model = _Model.of(fit, plan, text)
    q = speculative_tokens + 1
    tokens = batch * q
    _linear_layers(step, model, tokens, tokens)
    _attention(step, fit, plan, Workload(batch, q, context), speculative_tokens)
    _linear_attention(step, model, _DECODE, lambda s: gdn.decode_step(s, batch, q))
    _communication(step, model, tokens, tokens)
    _launches(step, model)
    if speculative_tokens:
        _draft(step, model, batch, speculative_tokens)
    per_step = 1 + speculative_tokens * acceptance
    return SpeedEstimate(
        batch,
        context,
        fit.tp,
        assumptions,
        list(step.terms.values()),
        per_step,
        speculative_tokens,
        acceptance,
        step.kernel_lines(),
        step.nvrtc,
    )


def estimate_prefill(
    fit: Fit,
    plan: Plan,
    manager: VoltaPluginManager,
    text: Any,
    prompt: int,
    chunk: int,
    assumptions: SpeedAssumptions,
) -> PrefillEstimate:
    """One sequence's ``prompt``-token prefill, in chunks of at most ``chunk`` tokens, each
    attending to the prompt before it (vLLM's chunked prefill at ``max_num_batched_tokens``),
    through the same parts as :func:`estimate_decode`: the linear layers at the chunk's tokens,
    attention at ``Workload(1, chunk, held)``, the Gated DeltaNet layers' chunked kernels, the
    lm_head at the one token whose logits each chunk computes. An MTP draft layer's pass over
    the chunk is not counted (one layer of the model's dozens)."""
    if prompt < 1 or chunk < 1:
        raise ValueError(
            f"a prefill has a prompt and a chunk of at least one token: {prompt}, {chunk}"
        )
    step = _Step(plan, manager, assumptions)
    model = _Model.of(fit, plan, text)
    sizes = [min(chunk, prompt - start) for start in range(0, prompt, chunk)]
    for size in sorted(set(sizes), reverse=True):
        runs = sizes.count(size)
        _linear_layers(step, model, size, 1, runs)
        _linear_attention(step, model, _PREFILL, partial(gdn.prefill_chunk, tokens=size), runs)
        _communication(step, model, size, 1, runs)
    held = 0
    for size in sizes:
        held += size
        _attention(step, fit, plan, Workload(1, size, held), 0)
    _launches(step, model, len(sizes))
    return PrefillEstimate(
        prompt,
        chunk,
        len(sizes),
        fit.tp,
        assumptions,
        list(step.terms.values()),
        step.kernel_lines(),
        step.nvrtc,
    )


@dataclass(frozen=True)
class _Model:
    """What every pass prices: the weights per layer, the lm_head's, the modules the plugins
    serve, the Gated DeltaNet layers' shape and the sizes the communication moves."""

    parts: list[WeightPart]
    lm_parts: list[WeightPart]
    served: list[_Served]
    text: Any
    tp: int
    hidden: int
    vocab: int
    layers: int
    gdn_layers: list[int]
    gdn_shape: gdn.GdnShape | None

    @classmethod
    def of(cls, fit: Fit, plan: Plan, text: Any) -> _Model:
        parts = _by_layer(fit.weights.parts)
        lm_parts = [p for p in parts if p.kind == "lm_head"] or [
            replace(p, kind="lm_head") for p in parts if p.kind == "embedding"
        ]
        types = {la.index: la.layer_type for la in plan.model.layers}
        gdn_layers = [
            need.index
            for need in fit.layers
            if need.state_bytes and types.get(need.index) == "linear_attention"
        ]
        act = plan.activation_bytes
        shape = gdn.GdnShape.of(text, fit.tp, act) if gdn_layers else None
        return cls(
            parts,
            lm_parts,
            _served_modules(plan, fit.tp),
            text,
            fit.tp,
            int(text.hidden_size),
            int(text.vocab_size),
            len(plan.model.layers),
            gdn_layers,
            shape,
        )


def _linear_layers(
    step: _Step, model: _Model, tokens: int, lm_tokens: int, runs: float = 1.0
) -> None:
    """Every layer's linear parts at ``tokens`` tokens and the lm_head at ``lm_tokens``."""
    for part in model.parts:
        if part.kind in _KIND_NAMES:
            _linear_part(step, _KIND_NAMES[part.kind], part, tokens, model, runs)
    for part in model.lm_parts:
        _linear_part(step, "lm_head", part, lm_tokens, model, runs)


def _launches(step: _Step, model: _Model, passes: int = 1) -> None:
    """The launch gaps of ``passes`` passes of the model."""
    launches = step.term("kernel launches")
    kernels = (model.layers * KERNELS_PER_LAYER + 4) * passes
    launches.add(None, 0, 0, kernels * step.assumptions.launch_us * 1e-6, "launch")
    launches.count = kernels


def _by_layer(parts: Sequence[WeightPart]) -> list[WeightPart]:
    """The weights summed per kind and layer (a report lists modules or tensors one by one),
    in the order each first appears."""
    groups: dict[tuple[str, int | None], WeightPart] = {}
    for p in parts:
        key = (p.kind, p.layer)
        seen = groups.get(key)
        groups[key] = (
            p
            if seen is None
            else replace(seen, params=seen.params + p.params, nbytes=seen.nbytes + p.nbytes)
        )
    return list(groups.values())


def _printed_paths(plan: Plan) -> list[Any]:
    return [p for lp in plan.layers for p in lp.kernel_paths] + [
        p for q in plan.quant for p in q.kernel_paths
    ]


_KIND_NAMES = {
    "attention": "attention projections (q/k/v/o)",
    "linear_attention": "linear-attention projections",
    "mlp": "MLP",
    "experts": "MoE experts (routed)",
    "norm": "norms",
}


def _applies(module: _Served, part: WeightPart, plan: Plan) -> bool:
    """Whether the plan's representative ``module`` stands for a module of ``part``'s layer."""
    if module.kind != part.kind:
        return False
    if part.kind == "lm_head":
        return True
    if part.layer is None or part.layer < 0:
        return False
    if part.kind in ("mlp", "experts"):
        return True
    owner = next((lp for lp in plan.layers if lp.layer.index == part.layer), None)
    return owner is not None and owner.layer.layer_type == module.layer_type


def _linear_part(
    step: _Step, name: str, part: WeightPart, tokens: int, model: _Model, runs: float = 1.0
) -> None:
    """A part's served modules priced by their plugins, the rest by the host's model."""
    rest_bytes, rest_params = part.nbytes, part.params
    layer = part.layer if part.layer is not None else 0
    text = model.text
    for module in model.served:
        if not _applies(module, part, step.plan):
            continue
        q = module.plan
        assert q.plugin is not None
        assert q.method is not None
        priced = step.plugin_cost(q.plugin, module.module, q.method, Workload(tokens))
        if priced is None:
            continue
        stage, cost = priced
        family = module_family(module.module.kind)
        step.add(name, part.layer, cost, q.prefix, layer, stage, q.plugin, runs, family)
        rest_bytes -= module.weight_bytes
        rest_params -= module.params
    if rest_params <= 0 and rest_bytes <= 0:
        return
    rest_bytes, rest_params = max(0, rest_bytes), max(0, rest_params)
    if part.kind == "experts":
        experts = int(
            getattr(text, "num_experts", None) or getattr(text, "n_routed_experts", None) or 0
        )
        top_k = int(getattr(text, "num_experts_per_tok", 0) or 0)
        touched = 1 - (1 - top_k / experts) ** tokens if experts and top_k else 1.0
        rest_bytes = int(rest_bytes * touched)
        rest_params = int(rest_params * top_k / experts) if experts and top_k else rest_params
    cost = _own_linear(rest_bytes, rest_params, tokens)
    if part.kind == "norm":
        norm = LaunchCost(rest_bytes, 0, 2 * tokens * rest_params, Unit.FMA)
        cost = KernelCost("norm", (norm,))
    step.add(name, part.layer, cost, part.kind, layer, runs=runs)


def _attention(step: _Step, fit: Fit, plan: Plan, work: Workload, drafts: int) -> None:
    """Each attention layer's work (``work``: sequences, new tokens, tokens held) by the plugin
    whose backend runs it, else TRITON_ATTN's model; the MTP draft layers ``drafts`` times at
    one token per sequence."""
    plans = {lp.layer.index: lp for lp in plan.layers}
    first = next((lp for lp in plan.layers if lp.layer.is_attention), None)
    tp, batch = fit.tp, work.sequences
    for need in fit.layers:
        lp = plans.get(need.index, first)
        runs = 1 if need.index >= 0 else drafts
        if not (need.bytes_per_token and lp is not None and runs):
            continue
        name = "paged attention (KV reads)" if need.index >= 0 else "MTP draft"
        query = work.query_len if need.index >= 0 else 1
        held = work.context
        if need.window:
            held = min(held, need.window + query - 1)
        module = f"attention, head size {lp.layer.head_size}"
        plugin, priced = lp.plugin, None
        if plugin is not None and lp.spec is not None and lp.backend is not None:
            priced = step.plugin_cost(plugin, lp.spec, lp.backend, Workload(batch, query, held))
        if plugin is not None and priced is not None:
            stage, cost = priced
            family = attention_family(stage)
            step.add(name, need.index, cost, module, need.index, stage, plugin, runs, family)
        else:
            nbytes = batch * held * need.bytes_per_token
            flops = 4 * batch * query * lp.layer.num_heads // tp * lp.layer.head_size * held
            own = KernelCost("TRITON_ATTN", (LaunchCost(nbytes, 0, flops, Unit.FMA),))
            step.add(name, need.index, own, module, need.index, runs=runs)


#: The Gated DeltaNet terms: a decode step runs FLA's fused recurrent update, a prefill chunk
#: its chunked delta rule; both are Triton, so FMA on sm_70.
_DECODE = ("linear attention (FLA fused_recurrent on FMA)", "decode")
_PREFILL = ("linear attention (FLA chunk_gated_delta_rule on FMA)", "prefill chunk")


def _linear_attention(
    step: _Step,
    model: _Model,
    term: tuple[str, str],
    kernels: Callable[[gdn.GdnShape], list[KernelCost]],
    runs: float = 1.0,
) -> None:
    """Each Gated DeltaNet layer's FLA kernels (:mod:`volta_core.planner.linear_attention`)."""
    shape = model.gdn_shape
    if shape is None:
        return
    name, stage = term
    module = (
        f"Gated DeltaNet, {shape.key_heads}/{shape.value_heads} heads of "
        f"{shape.head_k}/{shape.head_v} per rank"
    )
    costs = kernels(shape)
    for index in model.gdn_layers:
        for cost in costs:
            step.add(name, index, cost, module, index, stage, runs=runs)


def _communication(
    step: _Step,
    model: _Model,
    tokens: int,
    lm_tokens: int,
    runs: int = 1,
    prefix: str = "",
    layers: int | None = None,
) -> None:
    """All-reduces of the hidden state after attention and the MLP in each of ``layers``
    layers (default: the model's) and after the embedding, at ``tokens``; the lm_head's logits
    gather at ``lm_tokens``; over PCIe."""
    if model.tp == 1:
        return
    a, tp = step.assumptions, model.tp
    layers = model.layers if layers is None else layers
    pcie, latency = a.pcie_gbps * 1e9, a.allreduce_us * 1e-6
    nbytes = 2 * (tp - 1) / tp * tokens * model.hidden * 2
    reduce = step.term(f"{prefix}all-reduce (2 per layer + embedding)")
    for i in range((2 * layers + 1) * runs):
        reduce.add(i, nbytes, 0, latency + nbytes / pcie, "PCIe")
    nbytes = (tp - 1) / tp * lm_tokens * model.vocab * 2
    for i in range(runs):
        step.term(f"{prefix}logits gather").add(i, nbytes, 0, latency + nbytes / pcie, "PCIe")


def _draft(step: _Step, model: _Model, batch: int, n: int) -> None:
    """``n`` sequential passes of the MTP draft layer(s) and the lm_head at ``batch`` tokens.
    The draft's own modules are not in the plan's module list, so vLLM's model prices them."""
    draft = [p for p in model.parts if p.kind == "mtp"]
    for part in [*draft, *model.lm_parts]:
        _linear_part(step, "MTP draft", part, batch, model, runs=n)
    layers = len({p.layer for p in draft}) or 1
    _communication(step, model, batch, batch, n, "MTP draft ", layers)
    kernels = (layers * KERNELS_PER_LAYER + 4) * n
    step.term("MTP draft").add(None, 0, 0, kernels * step.assumptions.launch_us * 1e-6, "launch")


def _term_lines(terms: Sequence[Term], top: int | None = None) -> list[str]:
    """The terms, longest first (the ``top`` longest where given)."""
    lines = []
    for t in sorted(terms, key=lambda t: -t.seconds)[:top]:
        on = f"; {', '.join(t.kernels)}" if t.kernels else ""
        lines.append(f"  {t.seconds * 1e3:8.2f} ms  {t.kernel} (x{t.count}, {t.bound}{on})")
    return lines


def render_speed(estimate: SpeedEstimate) -> list[str]:
    """The estimate as text lines (a section of the plan)."""
    e = estimate
    lines = [
        f"decode speed (ESTIMATE for V100, batch {e.batch}, context {e.context}, tensor "
        f"parallel {e.tp}): {e.step_seconds * 1e3:.1f} ms per step, "
        f"{e.per_sequence_tokens_per_second:.1f} tokens/s per sequence"
        + (f", {e.tokens_per_second:.1f} tokens/s in all" if e.batch > 1 else ""),
    ]
    if e.speculative_tokens:
        lines.append(
            f"  MTP: {e.speculative_tokens} draft tokens per step at {e.acceptance:g} "
            f"acceptance: {e.tokens_per_step:.2f} tokens per sequence per step"
        )
    lines += _term_lines(e.terms)
    lines.append("  assumptions:")
    lines += [f"    {line}" for line in e.assumptions.lines()]
    if not e.nvrtc:
        lines.append("    no NVRTC here: stages that need it are priced as their fallbacks")
    return lines


#: How many of the prefill's terms the plan's text prints (the JSON has them all).
PREFILL_TOP_TERMS = 5


def render_prefill(estimate: PrefillEstimate) -> list[str]:
    """The prefill estimate as text lines: the time to first token and its longest terms."""
    e = estimate
    chunks = f"{e.chunks} chunk{'s' if e.chunks > 1 else ''} of at most {e.chunk} tokens"
    took = f"{e.seconds:.1f} s" if e.seconds >= 10 else f"{e.seconds * 1e3:.1f} ms"
    return [
        f"prefill (ESTIMATE for V100, tensor parallel {e.tp}): {e.prompt}-token prompt in "
        f"{took} (time to first token), {e.tokens_per_second:.0f} tokens/s "
        f"({chunks}, --max-num-batched-tokens)",
        *_term_lines(e.terms, PREFILL_TOP_TERMS),
    ]
