"""The GDN calls ``gpu_fla.py`` makes, their inputs, their float64 check and their timing.

Each case is one call of a family's op as vLLM's Qwen3.5 layer makes it: batch 1 flattened
with ``cu_seqlens`` (int32), q/k/v and beta in fp16, g and the states in fp32,
``use_qk_l2norm_in_kernel=True``. The prefill is ``chunk_gated_delta_rule`` (a 2048-token
chunk and an odd 1000-token one, with and without initial states, and three sequences of odd
lengths in one call); the decodes are ``fused_recurrent_gated_delta_rule`` and the layer's
default decode ``fused_sigmoid_gating_delta_rule_update`` (gating fused in), one token per
sequence, updating the state cache in place at the sequences' slots
(``ssm_state_indices``, scattered in a cache larger than the batch, as continuous batching
hands them over; never slot 0, which vLLM 0.33 reserves as its null block and whose ops skip
it), the larger batch with one more row padded as a CUDA-graph batch is (slot -1, skipped by
every family's ops).

The gates are drawn as the layer computes them (``g = -exp(A_log) * softplus(a + dt_bias)``,
``beta = sigmoid(b)``, ``a, b`` standard normal) with ``A = exp(A_log)`` uniform in [0.05, 16]
(Hugging Face transformers' Qwen3-Next/Qwen3.5 ``GatedDeltaNet`` initializes it uniform in
[0, 16]) and ``dt_bias`` uniform in [-6, 1] (initialized to 1 there: lower values give the
heads whose decay is nearly 1), so the heads' decays run from nearly 1 (a state that
remembers the whole 2048-token chunk) to nearly 0.

Pass bounds (fp16 inputs, fp32 accumulation; the reference is float64 from the same fp16
values): the RMS error over the reference's RMS at most 5e-3 for the chunked prefill and 2e-3
for the recurrent decodes, flash-linear-attention's own bounds for these ops at fp16
(tests/ops/test_gated_delta.py: ``assert_close(..., 0.005)`` for ``chunk``, ``0.002`` for
``fused_recurrent``); and, so that one wrong token or head cannot hide in the RMS, the largest
error at most 5e-2 (prefill, whose intermediates w, u, h and v_new are stored in fp16) or 1e-2
(decode) of the reference's largest magnitude. Slots the decode does not own must come back
bit for bit.
"""

from __future__ import annotations

import statistics
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gdn_reference as ref
import torch
from fla_standalone import Family, recording_launches

#: (RMS bound, max bound) per op kind; see the module docstring.
BOUNDS = {"prefill": (5e-3, 5e-2), "decode": (2e-3, 1e-2)}

#: The slot vLLM gives a batch's padding rows (``PAD_SLOT_ID``).
PAD_SLOT = -1

PREFILL_OP = "chunk_gated_delta_rule"
DECODE_OPS = ("fused_recurrent_gated_delta_rule", "fused_sigmoid_gating_delta_rule_update")


@dataclass(frozen=True)
class Shape:
    """One rank's GDN heads: key heads, value heads, head dims."""

    label: str
    key_heads: int
    value_heads: int
    head_k: int
    head_v: int


@dataclass(frozen=True)
class Case:
    """One op call: ``lengths`` of the sequences (prefill), or the decode ``batch`` and
    whether a padding row follows it."""

    op: str
    label: str
    lengths: tuple[int, ...] = ()
    initial_state: bool = True
    batch: int = 0
    padded: bool = False

    @property
    def kind(self) -> str:
        return "prefill" if self.op == PREFILL_OP else "decode"


def cases(smoke: bool) -> list[Case]:
    """The calls per shape (``smoke``: a few tokens, for the Triton interpreter)."""
    if smoke:
        prefill = [((130,), True), ((130,), False), ((37, 63, 50), True)]
        batches = (1, 3)
    else:
        prefill = [
            ((2048,), True),
            ((2048,), False),
            ((1000,), True),
            ((1000,), False),
            ((517, 783, 748), True),
        ]
        batches = (1, 16)
    out = [
        Case(PREFILL_OP, f"T={'+'.join(map(str, lengths))}{' h0' if h0 else ''}", lengths, h0)
        for lengths, h0 in prefill
    ]
    for op in DECODE_OPS:
        out += [
            Case(op, f"batch {n}{' + pad' if n > 1 else ''}", batch=n, padded=n > 1)
            for n in batches
        ]
    return out


# -- inputs ---------------------------------------------------------------------------------------


def _generator(shape: Shape, case: Case) -> torch.Generator:
    """The same inputs for a shape and case in every family and on every device."""
    return torch.Generator().manual_seed(
        zlib.crc32(f"{shape.label}/{case.op}/{case.label}".encode())
    )


def _gates(gen: torch.Generator, tokens: int, hv: int) -> dict[str, torch.Tensor]:
    a_log = torch.log(0.05 + 15.95 * torch.rand(hv, generator=gen))
    return {
        "A_log": a_log,
        "dt_bias": (-6 + 7 * torch.rand(hv, generator=gen)).half(),
        "a": torch.randn(tokens, hv, generator=gen).half(),
        "b": torch.randn(tokens, hv, generator=gen).half(),
    }


def make_inputs(shape: Shape, case: Case, device: torch.device) -> dict[str, torch.Tensor]:
    """The call's tensors on ``device``; decodes also get ``cache`` and ``slots``."""
    gen = _generator(shape, case)
    tokens = sum(case.lengths) if case.kind == "prefill" else case.batch + case.padded
    h, hv, dk, dv = shape.key_heads, shape.value_heads, shape.head_k, shape.head_v
    t: dict[str, torch.Tensor] = {
        "q": torch.randn(1, tokens, h, dk, generator=gen).half(),
        "k": torch.randn(1, tokens, h, dk, generator=gen).half(),
        "v": torch.randn(1, tokens, hv, dv, generator=gen).half(),
        **_gates(gen, tokens, hv),
    }
    gating = ref.sigmoid_gating(t["A_log"], t["a"], t["b"], t["dt_bias"])
    t["g"] = gating[0].float()[None]
    t["beta"] = gating[1].half()[None]
    if case.kind == "prefill":
        t["cu_seqlens"] = torch.tensor([0, *torch.tensor(case.lengths).cumsum(0).tolist()])
        if case.initial_state:
            t["h0"] = torch.randn(len(case.lengths), hv, dv, dk, generator=gen)
    else:
        slots = 1 + torch.randperm(2 * case.batch + 1, generator=gen)[: case.batch]
        t["slots"] = torch.cat([slots, torch.tensor([PAD_SLOT] * case.padded, dtype=torch.long)])
        t["cu_seqlens"] = torch.arange(len(t["slots"]) + 1)
        t["cache"] = torch.randn(2 * case.batch + 2, hv, dv, dk, generator=gen)
    for name in ("cu_seqlens", "slots"):
        if name in t:
            t[name] = t[name].to(torch.int32)
    return {k: v.to(device) for k, v in t.items()}


# -- the call -------------------------------------------------------------------------------------


def call(family: Family, case: Case, t: dict[str, torch.Tensor]) -> Callable[[], Any]:
    """The family's op called on ``t`` (a decode updates ``t['cache']`` in place)."""
    common = {"q": t["q"], "k": t["k"], "v": t["v"], "use_qk_l2norm_in_kernel": True}
    if case.op == PREFILL_OP:
        fn = family.op("chunk", PREFILL_OP)
        return lambda: fn(
            **common,
            g=t["g"],
            beta=t["beta"],
            initial_state=t.get("h0"),
            output_final_state=True,
            cu_seqlens=t["cu_seqlens"],
        )
    decode = {
        "initial_state": t["cache"],
        "inplace_final_state": True,
        "cu_seqlens": t["cu_seqlens"],
        "ssm_state_indices": t["slots"],
    }
    if case.op == DECODE_OPS[0]:
        fn = family.op("fused_recurrent", case.op)
        return lambda: fn(**common, **decode, g=t["g"], beta=t["beta"])
    fn = family.op("fused_sigmoid_gating", case.op)
    return lambda: fn(
        **common,
        **decode,
        A_log=t["A_log"],
        a=t["a"],
        b=t["b"],
        dt_bias=t["dt_bias"],
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check(family: Family, shape: Shape, case: Case, device: torch.device) -> dict[str, Any]:
    """Call the op once, compare it with the float64 reference, record the launches."""
    t = make_inputs(shape, case, device)
    cache_before = t["cache"].clone() if "cache" in t else None
    with recording_launches(family) as launches:
        o, state = call(family, case, t)()
    _sync(device)
    rms_bound, max_bound = BOUNDS[case.kind]
    if case.kind == "prefill":
        inputs = ref.Inputs(
            t["q"][0], t["k"][0], t["v"][0], t["g"][0], t["beta"][0], t.get("h0"),
            t["cu_seqlens"].tolist(),
        )  # fmt: skip
        o_ref, state_ref = ref.recurrent(inputs)
        got_state, untouched_ok = state, True
    else:
        assert cache_before is not None
        live = t["slots"] != PAD_SLOT  # one token per row; the padding row's output is void
        slots = t["slots"][live].long()
        if case.op == DECODE_OPS[0]:
            g, beta = t["g"][0], t["beta"][0]
        else:  # the op gates a, b itself: the reference does too, in float64
            g, beta = ref.sigmoid_gating(t["A_log"], t["a"], t["b"], t["dt_bias"])
        inputs = ref.Inputs(
            t["q"][0][live], t["k"][0][live], t["v"][0][live], g[live], beta[live],
            cache_before[slots], list(range(len(slots) + 1)),
        )  # fmt: skip
        o_ref, state_ref = ref.recurrent(inputs)
        o = o[:, live]
        got_state = t["cache"][slots]
        others = torch.ones(len(cache_before), dtype=torch.bool, device=device)
        others[slots] = False
        untouched_ok = bool(torch.equal(t["cache"][others], cache_before[others]))
    errors = {"o": ref.error(o[0], o_ref), "state": ref.error(got_state, state_ref)}
    passed = untouched_ok and all(e.within(rms_bound, max_bound) for e in errors.values())
    return {
        "errors": {k: vars(e) for k, e in errors.items()},
        "untouched_slots_unchanged": untouched_ok,
        "bounds": {"rms_rel": rms_bound, "max_rel": max_bound},
        "passed": passed,
        "launches": sorted(set(launches)),
    }


# -- timing ---------------------------------------------------------------------------------------


def _median_ms(run: Callable[[], Any], reps: int, device: torch.device) -> float:
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize(device)
    return statistics.median(s.elapsed_time(e) for s, e in events)


def time_case(
    family: Family, shape: Shape, case: Case, device: torch.device, reps: int
) -> dict[str, Any]:
    """Median milliseconds per call: eager (the host code each time, CUDA events around one
    call), and on a GPU replayed from a CUDA graph (the kernels alone, as vLLM's decode runs
    them), or why the capture failed."""
    t = make_inputs(shape, case, device)
    run = call(family, case, t)
    run()
    run()
    _sync(device)
    out: dict[str, Any] = {"eager_ms": _median_ms(run, reps, device)}
    if device.type == "cuda":
        try:
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                run()
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            graph.replay()
            out["graph_ms"] = _median_ms(graph.replay, reps, device)
        except Exception as exc:
            out["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out
