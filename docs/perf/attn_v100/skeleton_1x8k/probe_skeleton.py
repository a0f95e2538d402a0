"""Probe (not shipped): the 1 x 8K split decode launch without its attention arithmetic, H100.

As ct_wna16's run 18 did for its 1-token GEMV: a skeleton of the shipped fp16 decode launch at
one sequence of 8K keys, head size 128, block 16 (grid (1, 8 KV heads, 32 partitions), 4 warps,
64-key tiles on 2 stages), whose programs walk the same chain as the shipped kernel (query
start and sequence length, the query rows, the partition bounds from the length, each tile's
pages from the block table, then its K and V rows) and read the same bytes, but do no
arithmetic: each xors its K and V tiles into one int16 tile, and its partial is that tile's
column xor (low byte, as float32) plus its query rows. Two endings:

* ``combine``: the shipped protocol: partials stored, barrier, one release-acquire arrival
  count per (sequence, KV head), the last arriver reading every partition's partial past L1
  in steps of 16384 floats (one step at 32/8 heads, two at 64/8, as the wide combine) and
  storing the sum; the counter set back to zero;
* ``partials``: each program stores its partial to a row of its own and ends.

Each skeleton's output is checked against torch first. Times: inside one CUDA graph, rotating
input sets past L2 (the benchmark's ``time_cuda_graph``), best of two alternating runs; beside
them the shipped launch (``bench.decode_case``) and the read floor of the KV bytes.

Run from the repository root: PYTHONPATH=<root>/core/src:<root>/plugins/attn_v100/src python3
docs/perf/attn_v100/skeleton_1x8k/probe_skeleton.py
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from volta_attn_v100 import bench
from volta_core.kernels.bench import time_cuda_graph
from volta_core.kernels.read_floor import read_floor

HEAD = 128
PAGE = 16
BLOCK_N = 64
SPLITS = 32
COMBINE_FLOATS = 16384


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def skeleton_kernel(
    q_ptr,
    kv_ptr,
    bt_ptr,
    seq_lens_ptr,
    q_start_ptr,
    out_ptr,
    part_ptr,
    counter_ptr,
    num_splits,
    stride_blk,
    stride_kvh,
    stride_slot,
    stride_bt,
    stride_qt,
    stride_qh,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD: tl.constexpr,
    PAGE: tl.constexpr,
    COMBINE: tl.constexpr,
    CHUNK: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_begin = tl.load(q_start_ptr + seq)
    seq_len = tl.load(seq_lens_ptr + seq)
    rows = tl.arange(0, ROWS)
    d = tl.arange(0, HEAD)
    q_head = kv_head * ROWS + rows
    q = tl.load(q_ptr + q_begin.to(tl.int64) * stride_qt + q_head[:, None] * stride_qh + d[None, :])
    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    per = tl.cdiv(num_tiles, num_splits)
    lo = split * per
    hi = tl.minimum(lo + per, num_tiles)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    acc = tl.zeros([BLOCK_N, HEAD], tl.int16)
    for t in tl.range(lo, hi, num_stages=2):
        k_pos = t * BLOCK_N + tl.arange(0, BLOCK_N)
        page = tl.load(bt_row + k_pos // PAGE)
        off = page.to(tl.int64) * stride_blk + (k_pos % PAGE) * stride_slot + kv_head * stride_kvh
        k = tl.load(kv_ptr + off[:, None] + d[None, :])
        v = tl.load(kv_ptr + off[:, None] + HEAD + d[None, :])
        acc = acc ^ k.to(tl.int16, bitcast=True) ^ v.to(tl.int16, bitcast=True)
    col = tl.reduce(acc, 0, _xor).to(tl.int32) & 255
    part = col.to(tl.float32)[None, :] + q.to(tl.float32)
    prog = (seq * tl.num_programs(1) + kv_head) * num_splits
    if COMBINE:
        tl.store(part_ptr + ((prog + split) * ROWS + rows[:, None]) * HEAD + d[None, :], part)
        tl.debug_barrier()
        counter = counter_ptr + seq * tl.num_programs(1) + kv_head
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            total = tl.zeros([ROWS, HEAD], tl.float32)
            s = tl.arange(0, CHUNK)
            for s0 in range(0, num_splits, CHUNK):
                ptrs = (
                    part_ptr
                    + ((prog + s0 + s[None, :, None]) * ROWS + rows[:, None, None]) * HEAD
                    + d[None, None, :]
                )
                total += tl.sum(tl.load(ptrs, cache_modifier=".cg"), 1)
            tl.store(out_ptr + (seq * tl.num_programs(1) * ROWS + q_head[:, None]) * HEAD
                     + d[None, :], total)  # fmt: skip
            tl.store(counter, 0)
    else:
        tl.store(part_ptr + ((prog + split) * ROWS + rows[:, None]) * HEAD + d[None, :], part)


def launcher(rows: int, kv_heads: int, combine: bool, out, part, counters):
    chunk = min(SPLITS, COMBINE_FLOATS // (rows * HEAD))

    def run(q, kv, table, seq_lens, q_start):
        skeleton_kernel[(1, kv_heads, SPLITS)](
            q, kv, table, seq_lens, q_start, out, part, counters, SPLITS,
            kv.stride(0), kv.stride(1), kv.stride(2), table.stride(0), q.stride(0), q.stride(1),
            ROWS=rows, BLOCK_N=BLOCK_N, HEAD=HEAD, PAGE=PAGE, COMBINE=combine, CHUNK=chunk,
            num_warps=4,
        )  # fmt: skip

    return run


def reference(q, kv, table, ctx, kv_heads, rows) -> torch.Tensor:
    """The skeleton's partial of each (KV head, partition) by torch: [kvh, S, rows, HEAD]."""
    keys = kv[table[0].long()].view(torch.int16)  # [pages, kvh, PAGE, 2 * HEAD]
    keys = keys.permute(1, 0, 2, 3).reshape(kv_heads, -1, 2 * HEAD)[:, :ctx]
    x = keys[..., :HEAD] ^ keys[..., HEAD:]
    num_tiles = math.ceil(ctx / BLOCK_N)
    per = math.ceil(num_tiles / SPLITS)
    parts = torch.zeros(kv_heads, SPLITS, rows, HEAD, device=q.device)
    for s in range(SPLITS):
        lo, hi = s * per * BLOCK_N, min((s + 1) * per, num_tiles) * BLOCK_N
        col = torch.zeros(kv_heads, HEAD, dtype=torch.int16, device=q.device)
        for i in range(lo, hi):
            col ^= x[:, i]
        qrows = q[0].float().view(kv_heads, rows, HEAD)
        parts[:, s] = (col.int() & 255).float()[:, None, :] + qrows
    return parts


def case(heads: int, kv_heads: int, ctx: int, copy_bw: float) -> str:
    rows = heads // kv_heads
    kv_bytes = ctx * kv_heads * 2 * HEAD * 2
    sets = max(1, min(64, math.ceil(bench.ROTATE_BYTES / kv_bytes)))
    torch.manual_seed(0)
    inputs = [bench.make_decode_inputs(1, ctx, heads, kv_heads, "float16") for _ in range(sets)]
    out = torch.full((heads, HEAD), float("nan"), device="cuda")
    part = torch.full((kv_heads * SPLITS * rows, HEAD), float("nan"), device="cuda")
    counters = torch.zeros(kv_heads, dtype=torch.int32, device="cuda")
    runs = {
        "combine": launcher(rows, kv_heads, True, out, part, counters),
        "partials": launcher(rows, kv_heads, False, out, part, counters),
    }
    q, kv, table, *_ = inputs[0]
    ref = reference(q, kv, table, ctx, kv_heads, rows)
    runs["partials"](*inputs[0])
    torch.cuda.synchronize()
    got = part.view(kv_heads, SPLITS, rows, HEAD)
    assert torch.equal(got, ref), ("partials", (got - ref).abs().max())
    runs["combine"](*inputs[0])
    torch.cuda.synchronize()
    summed = ref.double().sum(1).view(heads, HEAD)
    err = (out.double() - summed).abs().max().item()
    assert err < 1e-2, ("combine", err)
    assert int(counters.sum()) == 0
    times: dict[str, list[float]] = {name: [] for name in ("shipped", *runs)}
    for _ in range(2):
        times["shipped"].append(
            bench.decode_case(1, ctx, heads, kv_heads, "float16", copy_bw)["ms"] * 1e3
        )
        for name, run in runs.items():
            times[name].append(time_cuda_graph(run, inputs).median_ms * 1e3)
    floor = read_floor([kv for _, kv, *_ in inputs], blocks=(1024, 2048), stages=(3,)).median_ms
    best = {name: min(t) for name, t in times.items()}
    target = (kv_bytes + 4 * heads * HEAD) / (0.6 * copy_bw) * 1e6
    return (
        f"{heads}/{kv_heads} 1 x {ctx}: shipped {best['shipped']:.2f}  skeleton+combine "
        f"{best['combine']:.2f}  skeleton partials only {best['partials']:.2f}  read floor "
        f"{floor * 1e3:.2f}  60% target {target:.2f} us   (all runs: "
        + ", ".join(f"{n} {'/'.join(f'{x:.2f}' for x in t)}" for n, t in times.items())
        + ")"
    )


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    copy_bw = bench.copy_bandwidth()
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    lines = [case(heads, 8, 8192, copy_bw) for heads in (32, 64)]
    print("\n== us, best of two alternating runs")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
