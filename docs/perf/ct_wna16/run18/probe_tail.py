"""Probe (H100): how fast can a 1-token split-K launch of the shipped shape be, doing no math?

For the M=1 layers this times, in one CUDA graph each as the benchmark does (rotating weight
copies past L2), best of two alternating runs:

* ``shipped``: ``wna16_linear`` as the table launches it (int4, group 128, symmetric);
* ``read+tail``: :func:`skeleton_kernel` on the same grid (output blocks x splits), tile, warps
  and stages, reading the same packed words of each program's range but doing no
  dequantization or multiply (the words are xored into one int32 per column, so the loads
  stay), then the shipped summing: fp32 atomic adds into zeroed accumulators, one
  release-acquire arrival count per output tile, and the last arriver reading the sums,
  zeroing them and writing the fp16 output;
* ``read only``: the same reads, each program storing its partial to its own row (no atomics,
  no counter, no last arriver);
* the read floor of the words (``volta_core.kernels.read_floor``).

The skeleton's sums are checked against torch's xor of the same words first. Run from the
repository root with PYTHONPATH=<root>/core/src:<root>/plugins/ct_wna16/src.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from volta_core.kernels.bench import time_cuda_graph
from volta_core.kernels.counters import arrival_counters, zeroed_accumulators
from volta_core.kernels.read_floor import read_floor
from volta_ct_wna16 import bench, configs
from volta_ct_wna16.ops import wna16_linear

LAYERS = ((5120, 5120), (7168, 5120), (27648, 5120), (5120, 27648))


@triton.jit
def skeleton_kernel(
    w_ptr,
    acc_ptr,
    counter_ptr,
    part_ptr,
    out_ptr,
    n,
    per_split_words,
    words_per_column,
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    TAIL: tl.constexpr,
):
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < n
    w0 = split * per_split_words
    w1 = tl.minimum(w0 + per_split_words, words_per_column)
    x = tl.zeros([BLOCK_N], tl.int32)
    rows = tl.arange(0, BLOCK_W)
    for r in tl.range(w0, w1, BLOCK_W, num_stages=NUM_STAGES):
        words = tl.load(
            w_ptr + (r + rows)[:, None] * n + cols[None, :],
            mask=((r + rows) < w1)[:, None] & col_ok[None, :],
            other=0,
        )
        x = x ^ tl.xor_sum(words, 0)
    partial = (x & 0xF).to(tl.float32)
    if TAIL:
        tl.atomic_add(acc_ptr + cols, partial, mask=col_ok, sem="relaxed")
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == tl.num_programs(2) - 1:
            none = tl.zeros([BLOCK_N], tl.float32)
            total = tl.atomic_add(acc_ptr + cols, none, mask=col_ok)
            tl.store(acc_ptr + cols, none, mask=col_ok)
            tl.store(out_ptr + cols, total.to(tl.float16), mask=col_ok)
            tl.store(counter_ptr + pid_n, 0)
    else:
        tl.store(part_ptr + split * n + cols, partial, mask=col_ok)


def skeleton(pw, launch, splits: int, per_split: int, tail: bool, out, part) -> None:
    n = pw.n
    grid = (1, -(-n // launch.block_n), splits)
    acc = zeroed_accumulators(out.device, n)
    counters = arrival_counters(out.device, grid[1])
    skeleton_kernel[grid](
        pw.qweight, acc, counters, part, out, n, per_split // 8, pw.words_per_column,
        BLOCK_N=launch.block_n, BLOCK_W=max(1, launch.block_k // 8),
        NUM_STAGES=launch.num_stages, TAIL=tail,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip


def check(pw, launch, splits: int, per_split: int) -> None:
    """The skeleton's sums against torch: per split, the low 4 bits of the xor of its words."""
    n = pw.n
    w = pw.qweight.view(-1, n).to(torch.int64)
    want = torch.zeros(n, dtype=torch.float32, device="cuda")
    for s in range(splits):
        x = torch.zeros(n, dtype=torch.int64, device="cuda")
        for row in w[s * per_split // 8 : (s + 1) * per_split // 8]:
            x ^= row
        want += (x & 0xF).to(torch.float32)
    out = torch.full((n,), float("nan"), dtype=torch.float16, device="cuda")
    part = torch.full((splits, n), float("nan"), device="cuda")
    skeleton(pw, launch, splits, per_split, True, out, part)
    torch.testing.assert_close(out.float(), want.half().float(), rtol=0, atol=0)
    skeleton(pw, launch, splits, per_split, False, out, part)
    torch.testing.assert_close(part.sum(0), want, rtol=0, atol=0)


def time_layer(n: int, k: int, cap: tuple[int, int], sms: int) -> str:
    copies = max(2, min(bench.MAX_COPIES, -(-bench.ROTATE_BYTES // (n * k // 2))))
    pws = bench.weights(n, k, True, copies)
    launch = configs.choose(1, n, cap, 4, k=k)
    splits, per_split = configs.split_count(n, k, launch, sms, 1)
    check(pws[0], launch, splits, per_split)
    x = torch.randn(1, k, device="cuda", dtype=torch.float16)
    outs = [torch.empty(1, n, device="cuda", dtype=torch.float16) for _ in range(2)]
    flat = [torch.empty(n, device="cuda", dtype=torch.float16) for _ in range(2)]
    part = torch.empty((splits, n), device="cuda")

    def shipped(i: int) -> None:
        wna16_linear(x, pws[i], out=outs[i % 2])

    def with_tail(i: int) -> None:
        skeleton(pws[i], launch, splits, per_split, True, flat[i % 2], part)

    def read_only(i: int) -> None:
        skeleton(pws[i], launch, splits, per_split, False, flat[i % 2], part)

    variants = {"shipped": shipped, "read+tail": with_tail, "read only": read_only}
    sets = [(i,) for i in range(len(pws))]
    best: dict[str, float] = {}
    for _ in range(2):
        for name, fn in variants.items():
            us = time_cuda_graph(fn, sets, replays=bench.REPLAYS).median_ms * 1e3
            best[name] = min(best.get(name, float("inf")), us)
            print(f"{n}x{k} {name}: {us:.2f} us", flush=True)
    floor = read_floor([pw.qweight for pw in pws]).median_ms * 1e3
    grid = f"{-(-n // launch.block_n)} x {splits}"
    cells = " | ".join(f"{name} {us:6.2f}" for name, us in best.items())
    return f"{n:>5}x{k:<5} grid {grid:>8} | {cells} | read floor {floor:5.2f}"


def main() -> int:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    cap = torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lines = []
    for n, k in LAYERS:
        lines.append(time_layer(n, k, cap, sms))
        torch.cuda.empty_cache()
    print("\n== M=1, int4 g128 symmetric, us (best of two alternating runs)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
