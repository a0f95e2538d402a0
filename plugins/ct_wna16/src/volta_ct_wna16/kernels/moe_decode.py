"""The fused-MoE decode kernels (1 to 16 tokens): the routed (token, slot) pairs read straight
from vLLM's ``topk_ids``, with no sort into blocks (:mod:`volta_ct_wna16.kernels.routing`).

One row a program, on the 1-token GEMV's FMA sub-tile
(:func:`volta_ct_wna16.kernels.gemv.gemv_sub`) over a split of the input, the splits summed in
the same launch by the split-K tree (:func:`volta_ct_wna16.kernels.epilogue.reduce_splits`:
deterministic, no atomic adds of values, no memset): gate/up is a GEMV per (token, slot) pair
(:func:`moe_decode_gate_up_kernel`), down one per token whose splits cover each of its slots'
experts in turn (:func:`moe_decode_down_kernel`), so the tree also makes the weighted sum over
top-k; down reads the gate/up rows as ``SiLU(gate) * up``. Two launches whose sizes depend on
the batch alone (CUDA-graph capture). A pair's expert is read once per pair: at 16 tokens,
pairs that share an expert read it again, mostly from L2; grouping them per expert on the dot
tile was slower on the H100 (docs/perf/ct_wna16/moe_decode/README.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_ct_wna16.kernels.epilogue import reduce_splits
from volta_ct_wna16.kernels.gemv import GEMV_SUB, gemv_sub, sub_tile, x_tile


@triton.jit
def local_experts(ids_ptr, map_ptr, idx, ok, EXPERTS, HAS_MAP: tl.constexpr):
    """Pair ``idx``'s local expert (where ``ok``), -1 where no local expert runs it: another
    rank's (the expert map's -1, ``HAS_MAP``), or an id outside ``0 .. EXPERTS - 1``."""
    e = tl.load(ids_ptr + idx, mask=ok, other=-1).to(tl.int32)
    if HAS_MAP:
        e = tl.load(map_ptr + e, mask=ok & (e >= 0), other=-1).to(tl.int32)
    return tl.where(ok & (e >= 0) & (e < EXPERTS), e, -1)


@triton.jit
def _silu_tile(h_row, k0, k_end, INTER, PACK: tl.constexpr, SUBS: tl.constexpr):
    """``SiLU(g) * u`` in fp32 for the ``32 * SUBS`` inputs from ``k0`` of a gate/up row
    (``g`` its first ``INTER`` columns, ``u`` the next; zero from ``k_end`` on), in the layout of
    :func:`volta_ct_wna16.kernels.gemv.x_tile`: vLLM's ``SiluAndMul`` as down reads its input."""
    ROWS: tl.constexpr = GEMV_SUB // PACK
    kk = (
        k0
        + tl.arange(0, ROWS)[:, None, None] * PACK
        + tl.arange(0, PACK)[None, :, None]
        + tl.arange(0, SUBS)[None, None, :] * GEMV_SUB
    )
    ok = kk < k_end
    g = tl.load(h_row + kk, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(h_row + INTER + kk, mask=ok, other=0.0).to(tl.float32)
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def moe_decode_gate_up_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    h_ptr,
    rw_ptr,
    ids_ptr,
    map_ptr,
    ws_ptr,
    cnt_ptr,
    PAIRS,
    N,
    K,
    KW,
    GROUP,
    EXPERTS,
    TOP_K,
    stride_xm,
    stride_hm,
    stride_we,
    stride_se,
    K_PER_SPLIT,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_MAP: tl.constexpr,
    MUL_INPUT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    FAN_IN: tl.constexpr,
):
    """``h[p, n] = x[t] . W_e[n]`` (times the pair's router weight with ``MUL_INPUT``) for
    routed pair ``p`` (token ``t = p // TOP_K``, local expert ``e``) and ``BLOCK_N`` of the
    ``N = 2 * inter`` gate/up outputs, over one split of ``K_PER_SPLIT`` inputs; grid
    ``(PAIRS, cdiv(N, BLOCK_N), splits)``, the splits summed by the tree of
    :func:`~volta_ct_wna16.kernels.epilogue.reduce_splits` (``ws_ptr`` ``[splits, PAIRS, N]``
    fp32, ``cnt_ptr`` zeroed counters) into fp16 ``h``. ``W_e`` is expert ``e``'s stacked
    gate/up weight at ``e * stride_we`` words and ``e * stride_se`` scales. A pair no local
    expert runs is skipped by all its programs (its row is never read)."""
    PACK: tl.constexpr = 32 // BITS
    SUBS: tl.constexpr = BLOCK_K // GEMV_SUB
    p = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    e = local_experts(ids_ptr, map_ptr, p, p < PAIRS, EXPERTS, HAS_MAP)
    if e < 0:
        return
    e64 = e.to(tl.int64)
    w_e = w_ptr + e64 * stride_we
    s_e = s_ptr + e64 * stride_se
    z_e = z_ptr + e64 * stride_se if HAS_ZP else z_ptr
    k_begin = tl.program_id(2) * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    x_row = x_ptr + (p // TOP_K).to(tl.int64) * stride_xm
    acc2 = tl.zeros([GEMV_SUB // PACK, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(k_begin, k_end, BLOCK_K, num_stages=NUM_STAGES):
        xt = x_tile(x_row, k0, k_end, PACK, SUBS, False)
        for sub in tl.static_range(SUBS):
            acc2 += gemv_sub(
                sub_tile(xt, sub, SUBS), w_e, s_e, z_e, k0 + sub * GEMV_SUB, k_end, rn, n_ok, N,
                KW, GROUP, BITS, HAS_ZP, False,
            )  # fmt: skip
    res = tl.sum(acc2, axis=0)[None, :]
    if MUL_INPUT:
        res *= tl.load(rw_ptr + p)
    rows = p + tl.zeros([1], dtype=tl.int32)
    tile_ok = (rows < PAIRS)[:, None] & n_ok[None, :]
    reduce_splits(
        res, ws_ptr, cnt_ptr, h_ptr, h_ptr, rows, rn, n_ok, tile_ok, PAIRS, N, stride_hm, False,
        FAN_IN,
    )  # fmt: skip


@triton.jit
def moe_decode_down_kernel(
    h_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    rw_ptr,
    ids_ptr,
    map_ptr,
    ws_ptr,
    cnt_ptr,
    TOKENS,
    N,
    K,
    KW,
    GROUP,
    EXPERTS,
    TOP_K,
    stride_hm,
    stride_om,
    stride_we,
    stride_se,
    K_PER_SPLIT,
    SLOT_SPLITS,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_MAP: tl.constexpr,
    MUL_ROUTER: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    FAN_IN: tl.constexpr,
):
    """``out[t, n] = sum_s r[t, s] * act[p] . W_e[n]`` for token ``t`` and ``BLOCK_N`` of its
    ``N`` outputs, ``act[p] = SiLU(gate) * up`` of pair ``p = t * TOP_K + s``'s gate/up row
    ``h[p]`` (``K`` = inter, :func:`_silu_tile`), ``e`` the slot's local expert, ``r`` the
    router weight with ``MUL_ROUTER`` (else 1).

    Grid ``(TOKENS, cdiv(N, BLOCK_N), TOP_K * SLOT_SPLITS)``: split ``j`` is slot
    ``j // SLOT_SPLITS``'s ``K_PER_SPLIT`` inputs from ``(j % SLOT_SPLITS) * K_PER_SPLIT``, so
    the tree of :func:`~volta_ct_wna16.kernels.epilogue.reduce_splits`, which sums splits in
    order, adds the slots in order too. A slot no local expert runs adds a zero partial
    (it must still arrive on the tile's counters).
    """
    PACK: tl.constexpr = 32 // BITS
    SUBS: tl.constexpr = BLOCK_K // GEMV_SUB
    t = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    split = tl.program_id(2)
    s = split // SLOT_SPLITS
    k_begin = (split - s * SLOT_SPLITS) * K_PER_SPLIT
    q = t * TOP_K + s
    e = local_experts(ids_ptr, map_ptr, q, q < TOKENS * TOP_K, EXPERTS, HAS_MAP)
    # A slot no local expert runs reads nothing: its split's input range is empty.
    k_end = tl.where(e >= 0, tl.minimum(k_begin + K_PER_SPLIT, K), k_begin)
    e64 = tl.maximum(e, 0).to(tl.int64)
    w_e = w_ptr + e64 * stride_we
    s_e = s_ptr + e64 * stride_se
    z_e = z_ptr + e64 * stride_se if HAS_ZP else z_ptr
    h_row = h_ptr + q.to(tl.int64) * stride_hm
    acc2 = tl.zeros([GEMV_SUB // PACK, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(k_begin, k_end, BLOCK_K, num_stages=NUM_STAGES):
        xt = _silu_tile(h_row, k0, k_end, K, PACK, SUBS)
        for sub in tl.static_range(SUBS):
            acc2 += gemv_sub(
                sub_tile(xt, sub, SUBS), w_e, s_e, z_e, k0 + sub * GEMV_SUB, k_end, rn, n_ok, N,
                KW, GROUP, BITS, HAS_ZP, False,
            )  # fmt: skip
    res = tl.sum(acc2, axis=0)[None, :]
    if MUL_ROUTER:
        res *= tl.load(rw_ptr + q, mask=e >= 0, other=0.0)
    rows = t + tl.zeros([1], dtype=tl.int32)
    tile_ok = (rows < TOKENS)[:, None] & n_ok[None, :]
    reduce_splits(
        res, ws_ptr, cnt_ptr, out_ptr, out_ptr, rows, rn, n_ok, tile_ok, TOKENS, N, stride_om,
        False, FAN_IN,
    )  # fmt: skip
