"""Timing a GPU call as vLLM runs it: event-timed medians, rotating inputs past the L2 cache.

A speed claim is a ratio measured in one run on one device: a kernel's time over what the
device's own ceilings (copy and read bandwidth, fp16 and fp32 matmul rates, measured in the
same run) allow. Each call is timed as the median of many CUDA-event-timed launches after
warm-up (:func:`time_cuda`) or, for decode-sized calls, of replays of one CUDA graph holding
many calls (:func:`time_cuda_graph`), cycling through enough input sets that together they
exceed the L2 cache (:func:`rotation_count`), so the cache is not what gets measured.

The ``vllm-volta bench`` command and the devkit's benchmark harness (``volta_devkit.bench``)
both time with these functions. torch is imported inside them: importing this module imports
neither torch nor triton.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: Bytes the copy ceiling moves each way (large enough to dwarf any L2: H100 has 50 MB).
COPY_BYTES = 1 << 30
#: Square size of the fp16 matmul ceiling.
MATMUL_N = 8192
#: Input sets are rotated until together they exceed this many times the L2 size.
L2_MULTIPLE = 3
#: Each eagerly timed call is timed for about this long after warm-up.
TARGET_MS = 300.0
#: A captured graph holds at least this many calls, so one graph launch's latency is spread
#: over all of them.
GRAPH_MIN_CALLS = 16
#: ... and about this much GPU time (a cap on ``calls`` for kernels of microseconds).
GRAPH_TARGET_MS = 20.0
GRAPH_MAX_CALLS = 256


@dataclass
class Timing:
    """Milliseconds per call: median and the 20th/80th percentiles of ``reps`` timed calls."""

    median_ms: float
    q20_ms: float
    q80_ms: float
    reps: int
    input_sets: int


def time_cuda(
    fn: Callable[..., Any],
    input_sets: Sequence[Sequence[Any]],
    *,
    target_ms: float = TARGET_MS,
    min_reps: int = 25,
    max_reps: int = 2000,
) -> Timing:
    """Median of CUDA-event-timed calls of ``fn``, rotating through ``input_sets``.

    Warm-up runs every input set once (compilation, caching allocators, cuBLAS handles) and
    then for about a tenth of ``target_ms``; the number of timed calls is chosen from the
    warm-up so the timing lasts about ``target_ms``.
    """
    import torch

    if not input_sets:
        raise ValueError("time_cuda needs at least one input set")
    for args in input_sets:
        fn(*args)
    torch.cuda.synchronize()
    begin = time.perf_counter()
    calls = 0
    while calls < 3 or (time.perf_counter() - begin) * 1e3 < target_ms / 10:
        fn(*input_sets[calls % len(input_sets)])
        calls += 1
        if calls % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    per_call_ms = (time.perf_counter() - begin) * 1e3 / calls
    reps = int(min(max_reps, max(min_reps, target_ms / max(per_call_ms, 1e-3))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        args = input_sets[i % len(input_sets)]
        starts[i].record()
        fn(*args)
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
    q = statistics.quantiles(times, n=5)
    return Timing(statistics.median(times), q[0], q[3], reps, len(input_sets))


def time_cuda_graph(
    fn: Callable[..., Any],
    input_sets: Sequence[Sequence[Any]],
    *,
    replays: int = 15,
) -> Timing:
    """Milliseconds per call of ``fn`` run back to back inside one captured CUDA graph.

    vLLM captures a whole decode step, every layer, in one CUDA graph, so what a decode kernel
    costs there is its time inside a graph: no host launch latency, which (several
    microseconds per graph launch) is as long as a short decode kernel and would otherwise be
    measured instead of it. One graph of ``calls`` invocations cycling through ``input_sets``
    is captured (``calls`` chosen from an eager timing so the graph runs about
    ``GRAPH_TARGET_MS``, at least ``GRAPH_MIN_CALLS`` and every input set once), then replayed
    ``replays`` times; each replay is event-timed and divided by ``calls``. ``reps`` in the
    result counts calls.
    """
    import torch

    if not input_sets:
        raise ValueError("time_cuda_graph needs at least one input set")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as capture requires
        for args in input_sets:
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for args in input_sets:
        fn(*args)
    end.record()
    end.synchronize()
    eager_ms = max(start.elapsed_time(end) / len(input_sets), 1e-3)
    calls = int(min(GRAPH_MAX_CALLS, max(GRAPH_MIN_CALLS, GRAPH_TARGET_MS / eager_ms)))
    calls = max(calls, len(input_sets))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*input_sets[i % len(input_sets)])
    graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for i in range(replays):
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) / calls for s, e in zip(starts, ends, strict=True))
    del graph
    q = statistics.quantiles(times, n=5)
    return Timing(statistics.median(times), q[0], q[3], replays * calls, len(input_sets))


def l2_bytes() -> int:
    """The L2 cache size of the current CUDA device (50 MB where torch does not say)."""
    import torch

    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20))


def rotation_count(bytes_per_set: int, *, at_most: int = 64, l2: int | None = None) -> int:
    """How many input sets together exceed ``L2_MULTIPLE`` times the L2 cache (``l2`` bytes;
    default: the current device's)."""
    if bytes_per_set <= 0:
        return 2
    l2 = l2_bytes() if l2 is None else l2
    return max(2, min(at_most, math.ceil(L2_MULTIPLE * l2 / bytes_per_set)))


def measure_copy_bandwidth(nbytes: int = COPY_BYTES) -> tuple[float, Timing]:
    """Device-to-device copy bandwidth in GB/s (bytes read plus bytes written, 1e9 B/GB)."""
    import torch

    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    timing = time_cuda(lambda s, d: d.copy_(s), [(src, dst)])
    return 2 * nbytes / (timing.median_ms * 1e-3) / 1e9, timing


def measure_read_bandwidth(nbytes: int = COPY_BYTES) -> tuple[float, Timing]:
    """Read bandwidth in GB/s: bytes read (1e9 B/GB) by ``torch.amax`` over ``nbytes`` of
    fp16, whose only write is one value, so its time is the read's."""
    import torch

    src = torch.randn(nbytes // 2, dtype=torch.float16, device="cuda")
    out = torch.empty((), dtype=torch.float16, device="cuda")
    timing = time_cuda(lambda s: torch.amax(s, dim=0, out=out), [(src,)])
    return nbytes / (timing.median_ms * 1e-3) / 1e9, timing


def measure_matmul(n: int = MATMUL_N, dtype_name: str = "float16") -> tuple[float, Timing]:
    """Dense ``n x n`` matmul rate of ``torch.matmul`` (cuBLAS) in TFLOP/s, on random data.

    ``"float16"`` runs on the tensor cores; ``"float32"`` with TF32 off runs on the fp32 FMA
    units (on SM70, which has no TF32, it always does), so it measures their rate.
    """
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    out = torch.empty(n, n, device="cuda", dtype=dtype)
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        timing = time_cuda(lambda x, y: torch.matmul(x, y, out=out), [(a, b)])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed
    return 2 * n**3 / (timing.median_ms * 1e-3) / 1e12, timing


def measure_fp16_matmul(n: int = MATMUL_N) -> tuple[float, Timing]:
    """Dense fp16 matmul rate of ``torch.matmul`` (cuBLAS) in TFLOP/s, on random data."""
    return measure_matmul(n, "float16")
