"""Probe (not shipped): 1 x 8K fp16 split decode with each warp walking its own keys, H100.

`docs/perf/attn_v100/skeleton_1x8k/` found the shipped launch's attention arithmetic 2.5-2.9 us over a
skeleton of the same launch: a program's four 64-key tiles run Q.K, softmax and P.V one after
another, and the [16 rows, 64 keys] score tile is spread over the four warps, so every row max
and sum is a cross-warp reduction through shared memory. Here each 64-key tile is four pages of
16 keys, and warp ``w`` takes page ``w`` with its own running max, sum and output: the tiles are
``[4, 16, 128]`` and both products are batched dots over the leading axis, which Triton lays out
one batch per warp, so the loop has no cross-warp reduction. The four states are merged once
after the loop, then the partition's partial goes through the shipped combine protocol.

Same grid, partitions, tile, warps and stages as the shipped launch (fp16, head size 128,
block 16, 32 partitions, no window, soft-cap or sinks; the context a multiple of 64 keys).
Checked against the shipped launch's output first; graph-timed with rotating inputs as the
benchmark, best of two alternating runs.

Run from the repository root: PYTHONPATH=<root>/core/src:<root>/plugins/attn_v100/src python3
docs/perf/attn_v100/warp_keys/probe_warp_keys.py
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from volta_attn_v100 import bench
from volta_core.kernels.bench import time_cuda_graph

HEAD = 128
PAGE = 16
BLOCK_N = 64
SPLITS = 32
COMBINE_FLOATS = 16384
NEG_BIG = tl.constexpr(-1.0e30)
LOG2E = 1.4426950408889634
STAGE_CHOICES = (2, 3, 4)


@triton.jit
def warp_keys_kernel(
    q_ptr,
    kv_ptr,
    bt_ptr,
    seq_lens_ptr,
    q_start_ptr,
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    counter_ptr,
    qk_scale,
    num_splits,
    stride_blk,
    stride_kvh,
    stride_slot,
    stride_bt,
    stride_qt,
    stride_qh,
    GROUP: tl.constexpr,
    ROWS: tl.constexpr,
    WARPS: tl.constexpr,
    PAGE: tl.constexpr,
    HEAD: tl.constexpr,
    CHUNK: tl.constexpr,
    STAGES: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    BLOCK_N: tl.constexpr = WARPS * PAGE
    q_begin = tl.load(q_start_ptr + seq)
    seq_len = tl.load(seq_lens_ptr + seq)
    rows = tl.arange(0, ROWS)
    d = tl.arange(0, HEAD)
    valid = rows < GROUP
    q_head = kv_head * GROUP + rows
    q = tl.load(
        q_ptr + q_begin.to(tl.int64) * stride_qt + q_head[:, None] * stride_qh + d[None, :],
        mask=valid[:, None],
        other=0.0,
    )
    q3 = tl.broadcast_to(q[None, :, :], (WARPS, ROWS, HEAD))
    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    per = tl.cdiv(num_tiles, num_splits)
    lo = split * per
    hi = tl.minimum(lo + per, num_tiles)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    w = tl.arange(0, WARPS)
    slot = tl.arange(0, PAGE)
    m3 = tl.full([WARPS, ROWS], NEG_BIG, tl.float32)
    l3 = tl.zeros([WARPS, ROWS], tl.float32)
    acc3 = tl.zeros([WARPS, ROWS, HEAD], tl.float32)
    for t in tl.range(lo, hi, num_stages=STAGES):
        page = tl.load(bt_row + t * WARPS + w)
        off = (
            page.to(tl.int64)[:, None] * stride_blk
            + slot[None, :] * stride_slot
            + kv_head * stride_kvh
        )
        k3 = tl.load(kv_ptr + off[:, :, None] + d[None, None, :])
        v3 = tl.load(kv_ptr + off[:, :, None] + HEAD + d[None, None, :])
        s = tl.dot(q3, tl.permute(k3, (0, 2, 1))) * qk_scale
        m_new = tl.maximum(m3, tl.max(s, 2))
        alpha = tl.exp2(m3 - m_new)
        p = tl.exp2(s - m_new[:, :, None])
        l3 = l3 * alpha + tl.sum(p, 2)
        acc3 = acc3 * alpha[:, :, None] + tl.dot(p.to(tl.float16), v3)
        m3 = m_new
    m_i = tl.max(m3, 0)
    wgt = tl.exp2(m3 - m_i[None, :])
    l_i = tl.sum(l3 * wgt, 0)
    acc = tl.sum(acc3 * wgt[:, :, None], 0)
    part_row = (q_begin.to(tl.int64) * tl.num_programs(1) * GROUP + q_head) * num_splits + split
    tl.store(part_acc_ptr + part_row[:, None] * HEAD + d[None, :], acc, mask=valid[:, None])
    tl.store(part_ml_ptr + part_row * 2, m_i, mask=valid)
    tl.store(part_ml_ptr + part_row * 2 + 1, l_i, mask=valid)
    tl.debug_barrier()
    counter = counter_ptr + seq * tl.num_programs(1) + kv_head
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
        crow = tl.arange(0, GROUP)
        base = q_begin.to(tl.int64) * tl.num_programs(1) * GROUP + kv_head * GROUP + crow
        base = base * num_splits
        sc = tl.arange(0, CHUNK)
        m = tl.full([GROUP], NEG_BIG, tl.float32)
        l_sum = tl.zeros([GROUP], tl.float32)
        out = tl.zeros([GROUP, HEAD], tl.float32)
        for s0 in range(0, num_splits, CHUNK):
            r = base[:, None] + s0 + sc[None, :]
            m_s = tl.load(part_ml_ptr + r * 2, cache_modifier=".cg")
            l_s = tl.load(part_ml_ptr + r * 2 + 1, cache_modifier=".cg")
            a_s = tl.load(
                part_acc_ptr + r[:, :, None] * HEAD + d[None, None, :], cache_modifier=".cg"
            )
            m_new = tl.maximum(m, tl.max(m_s, 1))
            alpha = tl.exp2(m - m_new)
            ws = tl.exp2(m_s - m_new[:, None])
            l_sum = l_sum * alpha + tl.sum(l_s * ws, 1)
            out = out * alpha[:, None] + tl.sum(a_s * ws[:, :, None], 1)
            m = m_new
        o_head = kv_head * GROUP + crow
        o_ptrs = out_ptr + q_begin.to(tl.int64) * stride_qt + o_head[:, None] * stride_qh
        tl.store(o_ptrs + d[None, :], (out / l_sum[:, None]).to(tl.float16))
        tl.store(counter, 0)


def launcher(heads: int, kv_heads: int, num_tokens: int, out: torch.Tensor, stages: int):
    group = heads // kv_heads
    part_acc = torch.empty(num_tokens * heads * SPLITS, HEAD, device="cuda")
    part_ml = torch.empty(num_tokens * heads * SPLITS, 2, device="cuda")
    counters = torch.zeros(num_tokens * kv_heads, dtype=torch.int32, device="cuda")
    chunk = min(SPLITS, COMBINE_FLOATS // (group * HEAD))

    def run(q, kv, table, seq_lens, q_start):
        warp_keys_kernel[(q_start.shape[0] - 1, kv_heads, SPLITS)](
            q, kv, table, seq_lens, q_start, out, part_acc, part_ml, counters,
            HEAD**-0.5 * LOG2E, SPLITS,
            kv.stride(0), kv.stride(1), kv.stride(2), table.stride(0), q.stride(0), q.stride(1),
            GROUP=group, ROWS=max(16, group), WARPS=BLOCK_N // PAGE, PAGE=PAGE, HEAD=HEAD,
            CHUNK=chunk, STAGES=stages, num_warps=BLOCK_N // PAGE,
        )  # fmt: skip

    return run


def case(heads: int, kv_heads: int, ctx: int, copy_bw: float) -> str:
    kv_bytes = ctx * kv_heads * 2 * HEAD * 2
    sets = max(1, min(64, math.ceil(bench.ROTATE_BYTES / kv_bytes)))
    torch.manual_seed(0)
    inputs = [bench.make_decode_inputs(1, ctx, heads, kv_heads, "float16") for _ in range(sets)]
    shipped = torch.full_like(inputs[0][0], float("nan"))
    bench.decode_call(ctx, "float16", shipped)(*inputs[0])
    runs, diffs = {}, {}
    for stages in STAGE_CHOICES:
        ours = torch.full_like(inputs[0][0], float("nan"))
        runs[f"warp keys s{stages}"] = launcher(heads, kv_heads, 1, ours, stages)
        runs[f"warp keys s{stages}"](*inputs[0])
        torch.cuda.synchronize()
        diffs[stages] = (ours.float() - shipped.float()).abs().max().item()
        assert diffs[stages] < 2e-3, (stages, diffs[stages])
    times: dict[str, list[float]] = {"shipped": [], **{name: [] for name in runs}}
    for _ in range(2):
        times["shipped"].append(
            bench.decode_case(1, ctx, heads, kv_heads, "float16", copy_bw)["ms"] * 1e3
        )
        for name, run in runs.items():
            times[name].append(time_cuda_graph(run, inputs).median_ms * 1e3)
    qo = 4 * heads * HEAD
    return (
        f"{heads}/{kv_heads} 1 x {ctx}: "
        + "  ".join(
            f"{name} {min(t):.2f} us ({100 * (kv_bytes + qo) / (min(t) * 1e-6) / copy_bw:.1f}%"
            f", runs {'/'.join(f'{x:.2f}' for x in t)})"
            for name, t in times.items()
        )
        + f"  max|diff| {max(diffs.values()):.1e}"
    )


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    copy_bw = bench.copy_bandwidth()
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    lines = [case(heads, 8, ctx, copy_bw) for ctx in (8192, 32768) for heads in (32, 64)]
    print("\n== us, best of two alternating runs")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
