"""Estimated decode step time and tokens/s on a V100: a roofline sum, kernel by kernel.

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
    linear-attn   max(2 x batch x state bytes / HBM, 4 x batch x state elements / FMA)
                  (the recurrent and conv state read and written once per token)

  a plugin-served module's part of a layer's weights is taken out of that layer's own-model
  term (what remains: norms, the router, modules the plan does not list);
* all-reduce: latency + 2 (tp - 1) / tp x tokens x hidden x 2 bytes / PCIe, after attention
  and after the MLP in each layer and after the embedding; logits gather: latency +
  (tp - 1) / tp x tokens x vocab x 2 bytes / PCIe;
* launches: (layers x KERNELS_PER_LAYER + 4) x launch gap (inside a CUDA graph).

Rates are :data:`volta_core.host.dispatch.V100_RATES` (the V100 whitepaper's, the ones the plugins
choose their kernels by), overridable, or a measured device's calibration
(:mod:`volta_core.planner.calibration`); PCIe, all-reduce latency and launch gap are named
assumptions. A roofline: real kernels reach a fraction of 900 GB/s, so it is optimistic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from volta_core.host.dispatch import V100_RATES, DeviceRates, KernelCost, LaunchCost, Unit, Workload
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import QuantLayer
from volta_core.planner.calibration import Calibration
from volta_core.planner.fit import Fit
from volta_core.planner.plan import LayerPlan, Plan, QuantPlan
from volta_core.planner.weights import WeightPart, linear_format, rank_share, tensor_kind

#: Kernels a decoder layer launches in a decode step, as counted for the launch term (norm,
#: projections, rotary or convolution, cache write, attention or recurrence, gate, activation,
#: residual adds, all-reduces).
KERNELS_PER_LAYER = 12

#: Who runs a layer the plugins do not serve.
VLLM = "vLLM"


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

    def calibrated(self, calibration: Calibration) -> SpeedAssumptions:
        """These assumptions with ``calibration``'s measured bandwidth and rates."""
        return replace(
            self,
            hbm_gbps=calibration.bandwidth_gbps,
            tensor_tflops=calibration.tensor_tflops,
            fma_tflops=calibration.fma_tflops,
            calibration=calibration.label,
        )

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
        return [
            calibrated,
            f"HBM2 {self.hbm_gbps:g} GB/s ({source}) for weight, KV and state reads",
            f"fp16 tensor cores {self.tensor_tflops:g} TFLOP/s (cuBLAS; the plugins' CUDA "
            "mma.m8n8k4 kernels)",
            f"fp32 FMA {self.fma_tflops:g} TFLOP/s (Triton's tl.dot and the GEMVs on SM70; "
            "vLLM's TRITON_ATTN; linear-attention state)",
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
            "terms": [
                {
                    "kernel": t.kernel,
                    "count": t.count,
                    "bytes": t.bytes,
                    "flops": t.flops,
                    "ms": round(t.seconds * 1e3, 4),
                    "bound": t.bound,
                    "kernels": t.kernels,
                }
                for t in self.terms
            ],
            "kernels": [line.as_dict() for line in self.kernels],
            "assumptions": asdict(self.assumptions) | {"kernels_per_layer": KERNELS_PER_LAYER},
            "assumption_notes": self.assumptions.lines(),
        }


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
    split), with its weight bytes and parameters on the rank; None without a shape."""
    n, k = module.output_size, module.input_size
    if not (n and k):
        return None
    fmt = linear_format(plan.model.quant, q.prefix)
    name = q.prefix.rsplit(".", 1)[-1]
    if module.experts:
        inter = math.ceil(n / tp)
        expert = linear_format(plan.model.quant, f"{q.prefix}.0.gate_proj")
        per_expert = 2 * expert.nbytes(inter, k) + expert.nbytes(k, inter)
        rank = replace(module, output_size=inter)
        return rank, module.experts * per_expert, module.experts * 3 * k * inter
    layer = _layer_of(q.prefix, plan)
    share = rank_share(f"{q.prefix}.weight", tp, layer.layer.num_kv_heads if layer else 0)
    if name in _ROW_PARALLEL:
        k = math.ceil(k * share)
    else:
        n = math.ceil(n * share)
    return replace(module, output_size=n, input_size=k), fmt.nbytes(n, k), n * k


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
    """Accumulates one decode step's terms and per-kernel lines."""

    def __init__(
        self, plan: Plan, manager: VoltaPluginManager, a: SpeedAssumptions, nvrtc: bool
    ) -> None:
        self.plan, self.manager, self.nvrtc = plan, manager, nvrtc
        self.rates = a.rates()
        self.terms: dict[str, Term] = {}
        self.lines: dict[tuple[str, str, str, str], KernelLine] = {}

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
    ) -> None:
        """Add ``runs`` times ``cost`` to term ``name`` and to its kernel line."""
        seconds = cost.seconds(self.rates) * runs
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
    nvrtc = not any(p.needs_nvrtc for p in _printed_paths(plan)) or plan.nvrtc is not None
    step = _Step(plan, manager, assumptions, nvrtc)
    tp, q = fit.tp, speculative_tokens + 1
    tokens = batch * q
    hidden, vocab = int(text.hidden_size), int(text.vocab_size)
    served = _served_modules(plan, tp)
    parts = _by_layer(fit.weights.parts)
    for part in parts:
        if part.kind in _KIND_NAMES:
            _linear_part(step, _KIND_NAMES[part.kind], part, tokens, served, text)
    lm_parts = [p for p in parts if p.kind == "lm_head"] or [
        replace(p, kind="lm_head") for p in parts if p.kind == "embedding"
    ]
    for part in lm_parts:
        _linear_part(step, "lm_head", part, tokens, served, text)
    _attention(step, fit, plan, batch, context, q, speculative_tokens)
    n_layers = len(plan.model.layers)
    _communication(step.term, assumptions, tp, tokens, hidden, vocab, 2 * n_layers + 1, "")
    launches = step.term("kernel launches")
    kernels = n_layers * KERNELS_PER_LAYER + 4
    launches.add(None, 0, 0, kernels * assumptions.launch_us * 1e-6, "launch")
    launches.count = kernels
    if speculative_tokens:
        _draft(step, parts, lm_parts, served, assumptions, tp, batch, speculative_tokens, text)
    per_step = 1 + speculative_tokens * acceptance
    return SpeedEstimate(
        batch,
        context,
        tp,
        assumptions,
        list(step.terms.values()),
        per_step,
        speculative_tokens,
        acceptance,
        sorted(step.lines.values(), key=lambda line: (line.term, line.module, line.stage)),
        nvrtc,
    )


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
    step: _Step,
    name: str,
    part: WeightPart,
    tokens: int,
    served: Sequence[_Served],
    text: Any,
    runs: float = 1.0,
) -> None:
    """A part's served modules priced by their plugins, the rest by the host's model."""
    rest_bytes, rest_params = part.nbytes, part.params
    layer = part.layer if part.layer is not None else 0
    for module in served:
        if not _applies(module, part, step.plan):
            continue
        q = module.plan
        assert q.plugin is not None
        assert q.method is not None
        priced = step.plugin_cost(q.plugin, module.module, q.method, Workload(tokens))
        if priced is None:
            continue
        stage, cost = priced
        step.add(name, part.layer, cost, q.prefix, layer, stage, q.plugin, runs)
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


def _attention(
    step: _Step, fit: Fit, plan: Plan, batch: int, context: int, q: int, drafts: int
) -> None:
    """Each attention layer's KV reads by the plugin whose backend runs it (else TRITON_ATTN's
    model), and the linear-attention state reads and writes."""
    plans = {lp.layer.index: lp for lp in plan.layers}
    first = next((lp for lp in plan.layers if lp.layer.is_attention), None)
    tp = fit.tp
    for need in fit.layers:
        lp = plans.get(need.index, first)
        name = "paged attention (KV reads)" if need.index >= 0 else "MTP draft"
        if need.bytes_per_token and lp is not None:
            held = min(context, need.window) if need.window else context
            query = q if need.index >= 0 else 1
            runs = 1 if need.index >= 0 else drafts
            module = f"attention, head size {lp.layer.head_size}"
            plugin, priced = lp.plugin, None
            if plugin is not None and lp.spec is not None and lp.backend is not None:
                work = Workload(batch, query, held)
                priced = step.plugin_cost(plugin, lp.spec, lp.backend, work)
            if plugin is not None and priced is not None:
                stage, cost = priced
                step.add(name, need.index, cost, module, need.index, stage, plugin, runs)
            else:
                nbytes = batch * held * need.bytes_per_token
                flops = 4 * batch * query * lp.layer.num_heads // tp * lp.layer.head_size * held
                own = KernelCost("TRITON_ATTN", (LaunchCost(nbytes, 0, flops, Unit.FMA),))
                step.add(name, need.index, own, module, need.index, runs=runs)
        if need.state_bytes:
            per_sequence = need.state_bytes / q  # the fit holds q state slots per sequence
            nbytes = int(batch * per_sequence * (1 + q))
            flops = int(2 * batch * q * per_sequence)
            launch = LaunchCost(nbytes, 0, flops, Unit.FMA)
            state = KernelCost("linear-attention recurrence", (launch,))
            name = "linear-attention state (read + write)"
            step.add(name, need.index, state, "state", need.index)


def _communication(
    term: Callable[[str], Term],
    a: SpeedAssumptions,
    tp: int,
    tokens: int,
    hidden: int,
    vocab: int,
    reduces: int,
    prefix: str,
    runs: int = 1,
) -> None:
    """All-reduces of the hidden state and the lm_head's logits gather, over PCIe."""
    if tp == 1:
        return
    pcie, latency = a.pcie_gbps * 1e9, a.allreduce_us * 1e-6
    nbytes = 2 * (tp - 1) / tp * tokens * hidden * 2
    reduce = term(f"{prefix}all-reduce (2 per layer + embedding)")
    for i in range(reduces * runs):
        reduce.add(i, nbytes, 0, latency + nbytes / pcie, "PCIe")
    nbytes = (tp - 1) / tp * tokens * vocab * 2
    for i in range(runs):
        term(f"{prefix}logits gather").add(i, nbytes, 0, latency + nbytes / pcie, "PCIe")


def _draft(
    step: _Step,
    parts: Sequence[WeightPart],
    lm_parts: Sequence[WeightPart],
    served: Sequence[_Served],
    a: SpeedAssumptions,
    tp: int,
    batch: int,
    n: int,
    text: Any,
) -> None:
    """``n`` sequential passes of the MTP draft layer(s) and the lm_head at ``batch`` tokens.
    The draft's own modules are not in the plan's module list, so vLLM's model prices them."""
    draft = [p for p in parts if p.kind == "mtp"]
    for part in [*draft, *lm_parts]:
        _linear_part(step, "MTP draft", part, batch, served, text, runs=n)
    layers = len({p.layer for p in draft}) or 1
    _communication(
        step.term,
        a,
        tp,
        batch,
        int(text.hidden_size),
        int(text.vocab_size),
        2 * layers + 1,
        "MTP draft ",
        n,
    )
    kernels = (layers * KERNELS_PER_LAYER + 4) * n
    step.term("MTP draft").add(None, 0, 0, kernels * a.launch_us * 1e-6, "launch")


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
    for t in sorted(e.terms, key=lambda t: -t.seconds):
        on = f"; {', '.join(t.kernels)}" if t.kernels else ""
        lines.append(f"  {t.seconds * 1e3:8.2f} ms  {t.kernel} (x{t.count}, {t.bound}{on})")
    lines.append("  assumptions:")
    lines += [f"    {line}" for line in e.assumptions.lines()]
    if not e.nvrtc:
        lines.append("    no NVRTC here: stages that need it are priced as their fallbacks")
    return lines
