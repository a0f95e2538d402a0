"""The fused-MoE decode kernels (1 to 16 tokens): the routed (token, slot) pairs read straight
from vLLM's ``topk_ids``, with no sort into blocks (:mod:`volta_ct_wna16.kernels.routing`).

Two launches, one row a program, on the 1-token GEMV's FMA sub-tile
(:func:`volta_ct_wna16.kernels.gemv.gemv_sub`) over a split of the input, the splits summed in
the same launch by the split-K tree (:func:`volta_ct_wna16.kernels.epilogue.reduce_splits`:
deterministic, no atomic adds of values, no memset): gate/up is a GEMV per (token, slot) pair
(:func:`moe_decode_gate_up_kernel`), down one per token whose splits cover each of its slots'
experts in turn (:func:`moe_decode_down_kernel`), so the tree also makes the weighted sum over
top-k; down reads the gate/up rows as ``SiLU(gate) * up``. A pair's expert is read once per
pair: at 16 tokens, pairs that share an expert read it again, mostly from L2; grouping them per
expert on the dot tile was slower on the H100 (docs/perf/ct_wna16/moe_decode/README.md).

Or one launch (:func:`moe_decode_fused_kernel`), where no program waits on another: each takes
a block of one pair's intermediate rows through gate/up, SiLU and down, and adds its partial
output atomically (faster at 1-4 tokens on the H100, where the two launches' fixed costs are
most of the time). Both are sized by the batch alone (CUDA-graph capture).
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_ct_wna16.kernels.epilogue import reduce_splits, take_sums
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


#: The two-launch decode kernels' integer arguments Triton's JIT does not specialize (it would
#: otherwise build another kernel for an argument's value of 1 and for multiples of 16,
#: ``triton/runtime/jit.py``; it matches them by name, so each kernel takes those it has), so
#: that one build serves every batch and model, as the gate and warmup declare it: the pair
#: and token counts only bound the rows, the expert count is compared with each pair's
#: expert, and the router's top-k and down's splits per slot only turn a program's index into
#: its pair and input range, a few scalar operations a program.
UNSPECIALIZED = ("PAIRS", "TOKENS", "EXPERTS", "TOP_K", "SLOT_SPLITS")


@triton.jit(do_not_specialize=UNSPECIALIZED)
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


@triton.jit(do_not_specialize=UNSPECIALIZED)
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


@triton.jit
def _act_sub(act, SUB: tl.constexpr, SUBS: tl.constexpr, PACK: tl.constexpr):
    """Down's input sub-tile ``SUB`` (``[rows, PACK]``, the GEMV's layout) of the ``32 * SUBS``
    SiLU products ``act`` of one program's intermediate block."""
    ROWS: tl.constexpr = GEMV_SUB // PACK
    x = tl.permute(tl.reshape(act, (SUBS, ROWS, PACK)), (1, 2, 0))
    return sub_tile(x, SUB, SUBS)


@triton.jit
def _gate_up_gemv(
    x_row, w_ptr, s_ptr, z_ptr, cols, c_ok, K, N, KW, GROUP, BITS: tl.constexpr,
    HAS_ZP: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, WHOLE: tl.constexpr,
):  # fmt: skip
    """``x . W[cols]`` over the whole input on the GEMV's FMA sub-tile: ``[len(cols)]`` fp32."""
    PACK: tl.constexpr = 32 // BITS
    SUBS: tl.constexpr = BLOCK_K // GEMV_SUB
    acc2 = tl.zeros([GEMV_SUB // PACK, cols.shape[0]], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        xt = x_tile(x_row, k0, K, PACK, SUBS, WHOLE)
        for sub in tl.static_range(SUBS):
            acc2 += gemv_sub(
                sub_tile(xt, sub, SUBS), w_ptr, s_ptr, z_ptr, k0 + sub * GEMV_SUB, K, cols, c_ok,
                N, KW, GROUP, BITS, HAS_ZP, WHOLE,
            )  # fmt: skip
    return tl.sum(acc2, axis=0)


@triton.jit
def moe_decode_fused_kernel(
    x_ptr,
    w13_ptr,
    s13_ptr,
    z13_ptr,
    w2_ptr,
    s2_ptr,
    z2_ptr,
    out_ptr,
    rw_ptr,
    ids_ptr,
    map_ptr,
    acc_ptr,
    cnt_ptr,
    PAIRS,
    HIDDEN,
    INTER,
    KW13,
    KW2,
    EXPERTS,
    TOP_K,
    stride_xm,
    stride_om,
    stride_w13e,
    stride_s13e,
    stride_w2e,
    stride_s2e,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_MAP: tl.constexpr,
    MUL_INPUT: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    GROUP13: tl.constexpr,
    GROUP2: tl.constexpr,
    WHOLE: tl.constexpr,
):
    """The whole decode step in one launch, with no program waiting on another:
    ``out[t] = sum_s r[t, s] * sum_jb W2_e[:, jb] . act_jb`` where program ``(p, jb)`` computes
    ``act_jb = SiLU(x[t] . G_e[jb]) * (x[t] . U_e[jb])`` for intermediate block ``jb``
    (``BLOCK_J`` gate rows and the matching up rows, over the whole input) and multiplies it
    by the matching ``BLOCK_J`` input columns of down at once. Down's product is linear in its
    input, so the blocks' partial outputs simply add: each program adds its ``[HIDDEN]``
    partial (times the router weight, unless ``MUL_INPUT`` put it on the input) into the
    token's fp32 row of ``acc_ptr`` atomically (relaxed, results unused; done by L2), and the
    token's last arriver (the serial split-K pattern of
    :func:`~volta_ct_wna16.kernels.epilogue.accumulate_splits`) takes the sums
    (:func:`~volta_ct_wna16.kernels.epilogue.take_sums`, which zeroes the row), writes them in
    the output's dtype and puts its counter back to zero.

    Grid ``(PAIRS, cdiv(INTER, BLOCK_J))``; ``p`` is pair ``t * TOP_K + s``, ``e`` its local
    expert (a pair no local expert runs only arrives). Both projections run on the 1-token
    GEMV's sub-tile (:func:`~volta_ct_wna16.kernels.gemv.gemv_sub`): gate/up on ``2 * BLOCK_J``
    columns (gate's block, then up's) in ``BLOCK_K`` input steps, down on ``BLOCK_N`` outputs
    at a time, the next ``BLOCK_N`` copied while one is used. The group sizes are
    ``tl.constexpr`` (a group index is then a shift, not a division); ``WHOLE``: every tile
    lies inside the layer (``BLOCK_K`` and ``BLOCK_N`` divide ``HIDDEN``, ``BLOCK_J`` divides
    ``INTER``), so no weight or activation load is masked. The order of the atomic adds is
    the order they reach L2, so the fp32 sum (and, rarely, the output's last bit) can differ
    between launches.
    """
    PACK: tl.constexpr = 32 // BITS
    SUBS_J: tl.constexpr = BLOCK_J // GEMV_SUB
    p = tl.program_id(0)
    t = p // TOP_K
    j0 = tl.program_id(1) * BLOCK_J
    e = local_experts(ids_ptr, map_ptr, p, p < PAIRS, EXPERTS, HAS_MAP)
    acc_row = acc_ptr + t.to(tl.int64) * HIDDEN
    if e >= 0:
        e64 = e.to(tl.int64)
        w13_e = w13_ptr + e64 * stride_w13e
        s13_e = s13_ptr + e64 * stride_s13e
        z13_e = z13_ptr + e64 * stride_s13e if HAS_ZP else z13_ptr
        c = tl.arange(0, 2 * BLOCK_J)
        jj = j0 + c % BLOCK_J
        cols = (c // BLOCK_J) * INTER + jj
        c_ok = jj < INTER
        gu = _gate_up_gemv(
            x_ptr + t.to(tl.int64) * stride_xm, w13_e, s13_e, z13_e, cols, c_ok, HIDDEN,
            2 * INTER, KW13, GROUP13, BITS, HAS_ZP, BLOCK_K, NUM_STAGES, WHOLE,
        )  # fmt: skip
        r = tl.load(rw_ptr + p)
        if MUL_INPUT:
            gu *= r
        g, u = tl.split(tl.permute(tl.reshape(gu, (2, BLOCK_J)), (1, 0)))
        act = g / (1.0 + tl.exp(-g)) * u
        w2_e = w2_ptr + e64 * stride_w2e
        s2_e = s2_ptr + e64 * stride_s2e
        z2_e = z2_ptr + e64 * stride_s2e if HAS_ZP else z2_ptr
        # Pipelined a tile ahead: the next tile's words are copied while this one is used,
        # where a plain loop waited on each tile's loads in turn.
        for n0 in tl.range(0, HIDDEN, BLOCK_N, num_stages=2):
            rn = n0 + tl.arange(0, BLOCK_N)
            n_ok = rn < HIDDEN
            part = tl.zeros([GEMV_SUB // PACK, BLOCK_N], dtype=tl.float32)
            for sub in tl.static_range(SUBS_J):
                part += gemv_sub(
                    _act_sub(act, sub, SUBS_J, PACK), w2_e, s2_e, z2_e, j0 + sub * GEMV_SUB,
                    INTER, rn, n_ok, HIDDEN, KW2, GROUP2, BITS, HAS_ZP, WHOLE,
                )  # fmt: skip
            res = tl.sum(part, axis=0)
            if not MUL_INPUT:
                res *= r
            tl.atomic_add(acc_row + rn, res, mask=n_ok, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    counter = cnt_ptr + t
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == TOP_K * tl.num_programs(1) - 1:
        out_row = out_ptr + t.to(tl.int64) * stride_om
        for n0 in range(0, HIDDEN, BLOCK_N):
            rn = n0 + tl.arange(0, BLOCK_N)
            n_ok = rn < HIDDEN
            total = take_sums(acc_row + rn, n_ok)
            tl.store(out_row + rn, total.to(out_ptr.dtype.element_ty), mask=n_ok)
        tl.store(counter, 0)
