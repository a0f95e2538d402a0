"""Probe (not shipped): what the shipped decode loop's generality costs at 1 x 8K fp16, H100.

`docs/perf/attn_v100/register_prefetch/` timed a copy of the decode loop stripped to the 1 x 8K case (page
size a constant, no soft-cap, no masked tiles; the shipped grid, tile, warps, 2 stages and
combine) at 17.68 us (32/8) and 18.51 us (64/8) against the shipped launch's 19.22 and 20.07.
This probe adds the shipped loop's general parts back one at a time to that stripped loop:
``RUNTIME_PAGE`` (the page size a runtime argument: an integer division and remainder of every
key position, before the block-table load and the row offsets), ``SOFTCAP`` (the soft-cap
behind a runtime branch in every tile), ``MASKED_LOOP`` (whole tiles, then a second loop of
masked tiles, empty here, as the shipped decode has); each launched with ``num_stages=2`` as the
shipped decode is.

fp16, head size 128, block 16, no window or sinks; contexts of whole 64-key tiles and one that is
not (8000 keys, where the variants without the masked loop are not run). Checked against the
shipped launch first; graph-timed with rotating inputs as the benchmark, best of
two alternating runs.

Run from the repository root: PYTHONPATH=<root>/core/src:<root>/plugins/attn_v100/src python3
docs/perf/attn_v100/decode_generality/probe_generality.py
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
LOG2E_K = tl.constexpr(LOG2E)
#: Contexts timed (one sequence each).
CONTEXTS = (8192, 8000, 32768)
#: Variants: name -> (RUNTIME_PAGE, SOFTCAP, MASKED_LOOP, stages of the masked loop).
VARIANTS = {
    "stripped": (False, False, False, 2),
    "masked loop": (False, False, True, 2),
    "all three": (True, True, True, 2),
    "masked loop, 1 stage": (False, False, True, 1),
    "all three, tail 1 stage": (True, True, True, 1),
    "page + softcap": (True, True, False, 2),
}


@triton.jit
def tile_rows(bt_row, tile, kv_head, page_size, stride_blk, stride_kvh, stride_slot,
              BLOCK_N: tl.constexpr, MASKED: tl.constexpr, seq_len):  # fmt: skip
    k_pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    if MASKED:
        page = tl.load(bt_row + k_pos // page_size, mask=k_pos < seq_len, other=0)
    else:
        page = tl.load(bt_row + k_pos // page_size)
    row = page.to(tl.int64) * stride_blk + (k_pos % page_size) * stride_slot
    return k_pos, row + kv_head * stride_kvh


@triton.jit
def attend_tile(q, k, v, m_i, l_i, acc, qk_scale, softcap, k_pos, seq_len,
                SOFTCAP: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if SOFTCAP:  # noqa: SIM102 (a constexpr test, then a runtime one, as two ifs)
        if softcap > 0:
            cap = softcap * LOG2E_K
            s = cap * (1.0 - 2.0 / (tl.exp(2.0 * s / cap) + 1.0))
    if MASKED:
        s = tl.where((k_pos < seq_len)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
    return m_new, l_i, acc


@triton.jit
def generality_kernel(
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
    softcap,
    num_splits,
    page_size,
    stride_blk,
    stride_kvh,
    stride_slot,
    stride_bt,
    stride_qt,
    stride_qh,
    GROUP: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    HEAD: tl.constexpr,
    CHUNK: tl.constexpr,
    RUNTIME_PAGE: tl.constexpr,
    SOFTCAP: tl.constexpr,
    MASKED_LOOP: tl.constexpr,
    TAIL_STAGES: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
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
    ps = page_size if RUNTIME_PAGE else PAGE
    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    per = tl.cdiv(num_tiles, num_splits)
    lo = split * per
    hi = tl.minimum(lo + per, num_tiles)
    whole_hi = tl.maximum(tl.minimum(seq_len // BLOCK_N, hi), lo) if MASKED_LOOP else hi
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    m_i = tl.full([ROWS], NEG_BIG, tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD], tl.float32)
    for t in range(lo, whole_hi):
        k_pos, off = tile_rows(bt_row, t, kv_head, ps, stride_blk, stride_kvh, stride_slot,
                               BLOCK_N, False, seq_len)  # fmt: skip
        k = tl.load(kv_ptr + off[:, None] + d[None, :])
        v = tl.load(kv_ptr + off[:, None] + HEAD + d[None, :])
        m_i, l_i, acc = attend_tile(q, k, v, m_i, l_i, acc, qk_scale, softcap, k_pos, seq_len,
                                    SOFTCAP, False)  # fmt: skip
    if MASKED_LOOP:
        for t in tl.range(whole_hi, hi, num_stages=TAIL_STAGES):
            k_pos, off = tile_rows(bt_row, t, kv_head, ps, stride_blk, stride_kvh, stride_slot,
                                   BLOCK_N, True, seq_len)  # fmt: skip
            live = (k_pos < seq_len)[:, None]
            k = tl.load(kv_ptr + off[:, None] + d[None, :], mask=live, other=0.0)
            v = tl.load(kv_ptr + off[:, None] + HEAD + d[None, :], mask=live, other=0.0)
            m_i, l_i, acc = attend_tile(q, k, v, m_i, l_i, acc, qk_scale, softcap, k_pos,
                                        seq_len, SOFTCAP, True)  # fmt: skip
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


def launcher(heads: int, kv_heads: int, out: torch.Tensor, flags: tuple[bool, bool, bool, int]):
    group = heads // kv_heads
    part_acc = torch.empty(heads * SPLITS, HEAD, device="cuda")
    part_ml = torch.empty(heads * SPLITS, 2, device="cuda")
    counters = torch.zeros(kv_heads, dtype=torch.int32, device="cuda")
    chunk = min(SPLITS, COMBINE_FLOATS // (group * HEAD))
    runtime_page, softcap, masked_loop, tail_stages = flags

    def run(q, kv, table, seq_lens, q_start):
        generality_kernel[(1, kv_heads, SPLITS)](
            q, kv, table, seq_lens, q_start, out, part_acc, part_ml, counters,
            HEAD**-0.5 * LOG2E, 0.0, SPLITS, kv.shape[2],
            kv.stride(0), kv.stride(1), kv.stride(2), table.stride(0), q.stride(0), q.stride(1),
            GROUP=group, ROWS=max(16, group), BLOCK_N=BLOCK_N, PAGE=PAGE, HEAD=HEAD,
            CHUNK=chunk, RUNTIME_PAGE=runtime_page, SOFTCAP=softcap, MASKED_LOOP=masked_loop,
            TAIL_STAGES=tail_stages,
            num_warps=4, num_stages=2,
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
    for name, flags in VARIANTS.items():
        if ctx % BLOCK_N and not flags[2]:
            continue  # without the masked loop a partial last tile would read past the table
        ours = torch.full_like(inputs[0][0], float("nan"))
        runs[name] = launcher(heads, kv_heads, ours, flags)
        runs[name](*inputs[0])
        torch.cuda.synchronize()
        diffs[name] = (ours.float() - shipped.float()).abs().max().item()
        assert diffs[name] < 2e-3, (name, diffs[name])
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
    lines = [case(heads, 8, ctx, copy_bw) for ctx in CONTEXTS for heads in (32, 64)]
    print("\n== us, best of two alternating runs")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
