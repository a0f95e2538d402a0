"""Estimated decode step time and tokens/s on a V100: an SM70 roofline, kernel by kernel.

One decode step of ``batch`` sequences at ``context`` tokens, on one of ``tp`` ranks (they run
in parallel), is the sum of these terms, each summed over the layers that have it::

    linear layer  max(weight bytes / HBM, 2 x batch x params / rate)
    attention     max(batch x held x KV bytes per token / HBM,
                      4 x batch x heads x head_size x held / FMA)       held = min(context, window)
    linear-attn   max(2 x batch x state bytes / HBM, 4 x batch x state elements / FMA)
                  (the recurrent and conv state read and written once per token)
    MoE experts   weight bytes x (1 - (1 - top_k / experts) ** batch)   (experts some token uses)
    all-reduce    latency + 2 (tp - 1) / tp x batch x hidden x 2 bytes / PCIe
                  (after attention and after the MLP in each layer, after the embedding)
    logits gather latency + (tp - 1) / tp x batch x vocab x 2 bytes / PCIe
    launches      (layers x KERNELS_PER_LAYER + 4) x launch gap      (inside a CUDA graph)

Rates (V100 datasheet): HBM2 900 GB/s; fp16 tensor cores 125 TFLOP/s (cuBLAS, for fp16
weights and the dequantized W4A16 path); fp32 FMA 15.7 TFLOP/s (Triton's ``tl.dot`` on SM70
has no tensor-core path: this project's attention and W4A16 kernels). W4A16/W8A16 weights are
read as their packed bytes up to 32 tokens (the ct_wna16 plugin's SM70 GEMV/GEMM); from 33
tokens the plugin dequantizes to fp16 first (packed bytes + 2 bytes written and read per weight,
tensor-core rate). FP8 weights are read as 1 byte each at the tensor-core rate (an assumption
about the SM70 FP8 path of 1Cat-vLLM, which runs those checkpoints; vLLM 0.19 refuses them
below SM75). The PCIe bandwidth, all-reduce latency and launch gap are named, overridable
assumptions. A roofline: real kernels reach a fraction of 900 GB/s, so it is optimistic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from volta_core.fit import Fit
from volta_core.model import ModelLayer
from volta_core.weights import WeightPart

#: Kernels a decoder layer launches in a decode step, as counted for the launch term (norm,
#: projections, rotary or convolution, cache write, attention or recurrence, gate, activation,
#: residual adds, all-reduces).
KERNELS_PER_LAYER = 12
#: Above this many tokens the W4A16 plugin dequantizes to fp16 and calls cuBLAS on SM70.
WNA16_FMA_MAX_TOKENS = 32


@dataclass(frozen=True)
class SpeedAssumptions:
    """The named figures every estimate states (``--pcie-gbps`` and friends override them)."""

    hbm_gbps: float = 900.0
    tensor_tflops: float = 125.0
    fma_tflops: float = 15.7
    pcie_gbps: float = 12.0
    allreduce_us: float = 30.0
    launch_us: float = 2.0

    def lines(self) -> list[str]:
        return [
            f"HBM2 {self.hbm_gbps:g} GB/s (V100 datasheet) for weight, KV and state reads",
            f"fp16 tensor cores {self.tensor_tflops:g} TFLOP/s (cuBLAS: fp16 and FP8 weights, "
            "W4A16 above 32 tokens)",
            f"fp32 FMA {self.fma_tflops:g} TFLOP/s (Triton on SM70: attention, W4A16 up to 32 "
            "tokens, linear-attention state)",
            f"PCIe {self.pcie_gbps:g} GB/s effective for all-reduce and logits gather "
            "(--pcie-gbps), "
            f"{self.allreduce_us:g} us latency each (--allreduce-us; NCCL between PCIe cards "
            "without NVLink)",
            f"{self.launch_us:g} us per kernel inside a CUDA graph (--launch-us), "
            f"{KERNELS_PER_LAYER} kernels per layer",
        ]


@dataclass
class Term:
    """One kernel's time, summed over the layers (or calls) that run it; ``count`` is how
    many distinct layers or calls contributed."""

    kernel: str
    count: int = 0
    bytes: int = 0
    flops: int = 0
    seconds: float = 0.0
    bound: str = ""
    _seen: set[object] = field(default_factory=set, repr=False)

    def add(self, key: object, nbytes: float, flops: float, seconds: float, bound: str) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self.count += 1
        self.bytes += int(nbytes)
        self.flops += int(flops)
        self.seconds += seconds
        self.bound = bound if not self.bound or self.bound == bound else "mixed"


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
            "terms": [
                {
                    "kernel": t.kernel,
                    "count": t.count,
                    "bytes": t.bytes,
                    "flops": t.flops,
                    "ms": round(t.seconds * 1e3, 4),
                    "bound": t.bound,
                }
                for t in self.terms
            ],
            "assumptions": asdict(self.assumptions)
            | {
                "kernels_per_layer": KERNELS_PER_LAYER,
                "wna16_fma_max_tokens": WNA16_FMA_MAX_TOKENS,
            },
            "assumption_notes": self.assumptions.lines(),
        }


class _Roofline:
    def __init__(self, a: SpeedAssumptions) -> None:
        self.hbm = a.hbm_gbps * 1e9
        self.rates = {"tensor cores": a.tensor_tflops * 1e12, "FMA": a.fma_tflops * 1e12}

    def time(self, nbytes: float, flops: float, unit: str) -> tuple[float, str]:
        memory, compute = nbytes / self.hbm, flops / self.rates[unit]
        return (memory, "HBM") if memory >= compute else (compute, unit)


def _linear_cost(part: WeightPart, batch: int, roof: _Roofline) -> tuple[float, float, float, str]:
    """Bytes, FLOPs, seconds and bound of one linear part at ``batch`` tokens (module doc)."""
    flops = 2 * batch * part.params
    nbytes = float(part.nbytes)
    if part.fmt.startswith("int"):
        if batch <= WNA16_FMA_MAX_TOKENS:
            seconds, bound = roof.time(nbytes, flops, "FMA")
            return nbytes, flops, seconds, bound
        nbytes += 4 * part.params  # fp16 written by the dequantization, then read by cuBLAS
    seconds, bound = roof.time(nbytes, flops, "tensor cores")
    return nbytes, flops, seconds, bound


def estimate_decode(
    fit: Fit,
    layers: Sequence[ModelLayer],
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
    roof = _Roofline(assumptions)
    tp, q = fit.tp, speculative_tokens + 1
    tokens = batch * q
    hidden, vocab = int(text.hidden_size), int(text.vocab_size)
    experts = int(getattr(text, "num_experts", None) or getattr(text, "n_routed_experts", 0) or 0)
    top_k = int(getattr(text, "num_experts_per_tok", 0) or 0)
    touched = 1 - (1 - top_k / experts) ** tokens if experts and top_k else 1.0
    terms: dict[str, Term] = {}

    def term(name: str) -> Term:
        return terms.setdefault(name, Term(name))

    def linear(name: str, part: WeightPart, n: int, scale: float = 1.0) -> None:
        nbytes, flops, seconds, bound = _linear_cost(part, n, roof)
        term(name).add(part.layer, nbytes * scale, flops * scale, seconds * scale, bound)

    parts = fit.weights.parts
    for part in parts:
        if part.kind in _KIND_NAMES:
            linear(_KIND_NAMES[part.kind], part, tokens)
        elif part.kind == "experts":
            linear("MoE experts (routed)", part, tokens, touched)
    lm_parts = [p for p in parts if p.kind == "lm_head"] or [
        p for p in parts if p.kind == "embedding"
    ]
    for part in lm_parts:
        linear("lm_head", replace(part, kind="lm_head"), tokens)
    heads = {la.index: la for la in layers}
    first = next((la for la in layers if la.is_attention), None)
    for need in fit.layers:
        la = heads.get(need.index, first)
        name = "paged attention (KV reads)" if need.index >= 0 else "MTP draft"
        if need.bytes_per_token and la is not None:
            held = min(context, need.window) if need.window else context
            nbytes: float = batch * held * need.bytes_per_token
            flops: float = 4 * batch * (q if need.index >= 0 else 1) * la.num_heads // tp
            flops *= la.head_size * held
            seconds, bound = roof.time(nbytes, flops, "FMA")
            runs = 1 if need.index >= 0 else speculative_tokens
            term(name).add(need.index, nbytes * runs, flops * runs, seconds * runs, bound)
        if need.state_bytes:
            per_sequence = need.state_bytes / q  # the fit holds q state slots per sequence
            nbytes = batch * per_sequence * (1 + q)
            flops = 2 * tokens * per_sequence
            seconds, bound = roof.time(nbytes, flops, "FMA")
            term("linear-attention state (read + write)").add(
                need.index, nbytes, flops, seconds, bound
            )
    n_layers = len(layers)
    _communication(term, assumptions, tp, tokens, hidden, vocab, 2 * n_layers + 1, "")
    launches = term("kernel launches")
    kernels = n_layers * KERNELS_PER_LAYER + 4
    launches.add(None, 0, 0, kernels * assumptions.launch_us * 1e-6, "launch")
    launches.count = kernels
    if speculative_tokens:
        _draft(term, parts, lm_parts, roof, assumptions, fit.tp, batch, speculative_tokens, text)
    per_step = 1 + speculative_tokens * acceptance
    return SpeedEstimate(
        batch,
        context,
        tp,
        assumptions,
        list(terms.values()),
        per_step,
        speculative_tokens,
        acceptance,
    )


_KIND_NAMES = {
    "attention": "attention projections (q/k/v/o)",
    "linear_attention": "linear-attention projections",
    "mlp": "MLP",
    "norm": "norms",
}


def _communication(
    term: Any,
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
    term: Any,
    parts: Sequence[WeightPart],
    lm_parts: Sequence[WeightPart],
    roof: _Roofline,
    a: SpeedAssumptions,
    tp: int,
    batch: int,
    n: int,
    text: Any,
) -> None:
    """``n`` sequential passes of the MTP draft layer(s) and the lm_head at ``batch`` tokens."""
    draft = [p for p in parts if p.kind == "mtp"]
    for part in [*draft, *lm_parts]:
        nbytes, flops, seconds, bound = _linear_cost(part, batch, roof)
        term("MTP draft").add(part.layer, nbytes * n, flops * n, seconds * n, bound)
    layers = len({p.layer for p in draft}) or 1
    _communication(
        term,
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
    term("MTP draft").add(None, 0, 0, kernels * a.launch_us * 1e-6, "launch")


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
        lines.append(f"  {t.seconds * 1e3:8.2f} ms  {t.kernel} (x{t.count}, {t.bound})")
    lines.append("  assumptions:")
    lines += [f"    {line}" for line in e.assumptions.lines()]
    return lines
