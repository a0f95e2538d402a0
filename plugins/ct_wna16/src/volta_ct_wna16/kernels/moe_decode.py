"""The fused-MoE decode kernels (1 to 16 tokens): the routed (token, slot) pairs read straight
from vLLM's ``topk_ids`` (or routed from the router's logits in the same launch), with no sort
into blocks (:mod:`volta_ct_wna16.kernels.routing`).

One launch (:func:`moe_decode_step_kernel`): gate/up and down in one grid, each down program
reading its weights before it waits for its token's gate/up rows, so the two projections'
bytes stream together. Two launches (:func:`moe_decode_gate_up_kernel`, then
:func:`moe_decode_down_kernel`), each split over the input:

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
from volta_ct_wna16.kernels.gemv import (
    GEMV_SUB,
    field_shift,
    gemv_sub,
    high_shift,
    slot_minus,
    sub_tile,
    x_tile,
    zero_points,
)
from volta_ct_wna16.kernels.routing import topk_softmax


@triton.jit
def to_local(e, ok, map_ptr, EXPERTS, HAS_MAP: tl.constexpr):
    """Global expert ids ``e`` (where ``ok``) as local experts, -1 where no local expert runs
    them: another rank's (the expert map's -1, ``HAS_MAP``), or an id outside
    ``0 .. EXPERTS - 1``."""
    if HAS_MAP:
        e = tl.load(map_ptr + e, mask=ok & (e >= 0), other=-1).to(tl.int32)
    return tl.where(ok & (e >= 0) & (e < EXPERTS), e, -1)


@triton.jit
def local_experts(ids_ptr, map_ptr, idx, ok, EXPERTS, HAS_MAP: tl.constexpr):
    """Pair ``idx``'s local expert (where ``ok``) from the router's ids (:func:`to_local`)."""
    e = tl.load(ids_ptr + idx, mask=ok, other=-1).to(tl.int32)
    return to_local(e, ok, map_ptr, EXPERTS, HAS_MAP)


@triton.jit
def rows_dot(
    x_row,
    w_e,
    s_e,
    z_e,
    k_begin,
    k_end,
    rn,
    n_ok,
    N,
    KW,
    GROUP,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """``x . W[n]`` in fp32 for the weight rows ``rn`` (where ``n_ok``) over the inputs
    ``k_begin .. k_end`` of one activation row: :func:`~volta_ct_wna16.kernels.gemv.gemv_sub`
    over ``BLOCK_K`` inputs a step, ``NUM_STAGES`` steps in flight."""
    PACK: tl.constexpr = 32 // BITS
    SUBS: tl.constexpr = BLOCK_K // GEMV_SUB
    acc2 = tl.zeros([GEMV_SUB // PACK, rn.shape[0]], dtype=tl.float32)
    for k0 in tl.range(k_begin, k_end, BLOCK_K, num_stages=NUM_STAGES):
        xt = x_tile(x_row, k0, k_end, PACK, SUBS, False)
        for sub in tl.static_range(SUBS):
            acc2 += gemv_sub(
                sub_tile(xt, sub, SUBS), w_e, s_e, z_e, k0 + sub * GEMV_SUB, k_end, rn, n_ok, N,
                KW, GROUP, BITS, HAS_ZP, False,
            )  # fmt: skip
    return tl.sum(acc2, axis=0)


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
    res = rows_dot(
        x_row, w_e, s_e, z_e, k_begin, k_end, rn, n_ok, N, KW, GROUP, BITS, HAS_ZP, BLOCK_K,
        NUM_STAGES,
    )[None, :]  # fmt: skip
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


#: Prefetch points per row of a tile: one per 16 words (64 bytes) and the row's last word, so
#: every 128-byte L2 line a row touches is asked for whatever the row's alignment.
PREFETCH_STRIDE = tl.constexpr(16)

#: Word rows a prefetch loop covers per step.
PREFETCH_ROWS = tl.constexpr(64)


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the lines at ``ptrs`` (PTX ``prefetch.global.L2``): no register is held and
    nothing waits, so a program starts every read it will make at once, and its loads later hit
    L2. A hint: the results never depend on it."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip


@triton.constexpr_function
def _points(width: int) -> int:
    """Prefetch points of a row at most ``width`` words wide (:func:`_row_points`)."""
    return triton.next_power_of_2(width // 16 + 1)


@triton.jit
def _row_points(width, WIDTH_POW2: tl.constexpr):
    """Offsets in a row of ``width`` words that touch each of its L2 lines: every
    :data:`PREFETCH_STRIDE` words and the last (``WIDTH_POW2 // 16 + 1`` points, padded to a
    power of two by repeating the last)."""
    return tl.minimum(tl.arange(0, _points(WIDTH_POW2)) * PREFETCH_STRIDE, width - 1)


@triton.jit
def _prefetch_rows(base, rows, N, cols):
    """Prefetch rows ``0 .. rows - 1`` (stride ``N``) of ``base`` (a pointer per leading index,
    ``[A]``) at the columns ``cols`` (``[C]``)."""
    for r0 in range(0, rows, PREFETCH_ROWS):
        r = tl.minimum(r0 + tl.arange(0, PREFETCH_ROWS), rows - 1)
        prefetch_l2(base[:, None, None] + r[None, :, None] * N + cols[None, None, :])


@triton.jit
def _down_tile(
    w_ptr,
    s_ptr,
    z_ptr,
    e64,
    live_slot,
    rn,
    n_ok,
    N,
    KW,
    GROUP,
    stride_we,
    stride_se,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    KW_POW2: tl.constexpr,
):
    """The down weights ``[slots, KW_POW2, outputs]`` of the local experts ``e64`` (one per
    slot; zeros where not ``live_slot``) for outputs ``rn``: the words, their scales and
    (``HAS_ZP``) fp32 zero points."""
    PACK: tl.constexpr = 32 // BITS
    kp = tl.arange(0, KW_POW2)
    ok = live_slot[:, None, None] & (kp < KW)[None, :, None] & n_ok[None, None, :]
    col = kp[None, :, None] * N + rn[None, None, :]
    words = tl.load(w_ptr + e64[:, None, None] * stride_we + col, mask=ok, other=0)
    g = (kp * PACK // GROUP)[None, :, None] * N + rn[None, None, :]
    scales = tl.load(s_ptr + e64[:, None, None] * stride_se + g, mask=ok, other=0.0)
    if HAS_ZP:
        zeros = zero_points(tl.load(z_ptr + e64[:, None, None] * stride_se + g, mask=ok, other=0))
    else:
        zeros = tl.zeros([1, 1, 1], dtype=tl.float32)
    return words.to(tl.uint32, bitcast=True), scales, zeros


@triton.jit
def _down_dot(
    words,
    scales,
    zeros,
    a_rows,
    a_ok,
    KW,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    KW_POW2: tl.constexpr,
):
    """``sum_k act[s, k] * dequant(W_s)[n, k]`` per slot ``s`` (``[slots, outputs]``, fp32) for
    a :func:`_down_tile`, the activations read past L1 (another program wrote them) from the
    rows ``a_rows`` where ``a_ok``; per weight one AND-OR, one subtraction and one FMA, as
    :func:`~volta_ct_wna16.kernels.gemv.gemv_sub`."""
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    if HAS_ZP:
        ZC: tl.constexpr = 0
    else:
        ZC: tl.constexpr = 1 << (BITS - 1)
    kp = tl.arange(0, KW_POW2)
    x_ok = a_ok[:, None] & (kp < KW)[None, :]
    x_ptrs = a_rows[:, None] + kp[None, :] * PACK
    live = (KW >= 0).to(tl.uint32)
    acc = tl.zeros(words.shape, dtype=tl.float32)
    xsum = tl.zeros([words.shape[0], words.shape[1]], dtype=tl.float32)
    for j in tl.static_range(PACK):
        xj = tl.load(x_ptrs + j, mask=x_ok, other=0.0, cache_modifier=".cg")
        if HAS_ZP:
            xsum += xj
        if field_shift(BITS, j) == 0:
            acc += xj[:, :, None] * slot_minus(words, live, BITS * j, MASK, ZC)
        else:
            # The shifted copy is made per field, not held: the tile's registers are the limit.
            hi = words >> high_shift(BITS)
            acc += xj[:, :, None] * slot_minus(hi, live, BITS * j - field_shift(BITS, j), MASK, ZC)
    if HAS_ZP:
        acc -= xsum[:, :, None] * zeros
    return tl.sum(acc * scales.to(tl.float32), axis=1)


@triton.jit
def moe_decode_step_kernel(
    x_ptr,
    w13_ptr,
    s13_ptr,
    z13_ptr,
    w2_ptr,
    s2_ptr,
    z2_ptr,
    out_ptr,
    act_ptr,
    rw_ptr,
    ids_ptr,
    map_ptr,
    logits_ptr,
    sync_ptr,
    TOKENS,
    HIDDEN,
    INTER,
    KW13,
    GROUP13,
    GROUP2,
    EXPERTS,
    ROUTER_EXPERTS,
    TOP_K,
    RENORMALIZE,
    stride_xm,
    stride_om,
    stride_lm,
    stride_we13,
    stride_se13,
    stride_we2,
    stride_se2,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_MAP: tl.constexpr,
    WEIGHT_ON_INPUT: tl.constexpr,
    ROUTE: tl.constexpr,
    PREFETCH: tl.constexpr,
    GATE_ROWS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOWN_N: tl.constexpr,
    DOWN_CHUNKS: tl.constexpr,
    TOPK_POW2: tl.constexpr,
    KW2_POW2: tl.constexpr,
    E_POW2: tl.constexpr,
    SYNC_POW2: tl.constexpr,
):
    """The decode step ``out[t] = sum_s r[t, s] * down_e(SiLU(gate_e(x[t])) * up_e(x[t]))`` for
    ``TOKENS`` tokens in one launch (``e`` slot ``s``'s local expert, ``r`` its router weight).

    Two kinds of program. A gate/up program computes ``GATE_ROWS`` gate rows and the same up
    rows of one routed pair over the whole input (:func:`rows_dot`) and stores their
    ``SiLU(gate) * up`` (fp32) in the pair's row of ``act_ptr`` (``[TOKENS * TOP_K, INTER]``);
    a down program computes ``DOWN_CHUNKS`` runs of ``DOWN_N`` outputs of one token over all
    its slots (:func:`_down_dot`), the weighted sum over top-k included, and stores them in
    ``x``'s dtype. With ``PREFETCH`` every program first asks L2 for every line it will read
    (:func:`prefetch_l2`), a down program before it waits for its token's gate/up programs to
    arrive on the token's counter: the two projections' bytes stream together from the start,
    and the down programs, once released, read L2.

    Waiting inside a launch is safe because the kind of work is handed out by a ticket (an
    atomic count, ``sync_ptr[0]``), not by the program id: gate/up work takes the first
    tickets, so every program a down program waits on took its ticket earlier, is resident
    and never waits (the dynamic block index of a decoupled look-back scan: Merrill and
    Garland, "Single-pass Parallel Prefix Scan with Decoupled Look-back", NVIDIA 2016). Each
    arrival is a barrier and a release increment at GPU scope; the wait an acquire read at GPU
    scope, the rows then read past L1. The last program to finish (``sync_ptr[1]``) puts the
    ticket, its own count and the token counters (``sync_ptr[2:]``) back to zero, so the next
    launch, a CUDA graph replay included, needs no memset.

    ``ROUTE``: the top-k comes from the router's logits (``logits_ptr``, ``ROUTER_EXPERTS``
    per token, :func:`~volta_ct_wna16.kernels.routing.topk_softmax`), computed by every
    program for its token, and the first gate/up program of each token stores it in
    ``rw_ptr`` (fp32) and ``ids_ptr`` (int32); otherwise both are read from there. Router
    weights scale the input with ``WEIGHT_ON_INPUT`` (the gate/up outputs, which is the same
    by linearity), else the down outputs.
    """
    gate_tiles = tl.cdiv(INTER, GATE_ROWS)
    gate_work = TOKENS * TOP_K * gate_tiles
    total = gate_work + TOKENS * tl.cdiv(HIDDEN, DOWN_N * DOWN_CHUNKS)
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    if ticket < gate_work:
        _gate_up_work(
            ticket, gate_tiles, x_ptr, w13_ptr, s13_ptr, z13_ptr, act_ptr, rw_ptr, ids_ptr,
            map_ptr, logits_ptr, sync_ptr, HIDDEN, INTER, KW13, GROUP13, EXPERTS, ROUTER_EXPERTS,
            TOP_K, RENORMALIZE, stride_xm, stride_lm, stride_we13, stride_se13, BITS, HAS_ZP,
            HAS_MAP, WEIGHT_ON_INPUT, ROUTE, PREFETCH, GATE_ROWS, BLOCK_K, NUM_STAGES, TOPK_POW2,
            E_POW2,
        )  # fmt: skip
    else:
        _down_work(
            ticket - gate_work, TOP_K * gate_tiles, w2_ptr, s2_ptr, z2_ptr, out_ptr, act_ptr,
            rw_ptr, ids_ptr, map_ptr, logits_ptr, sync_ptr, HIDDEN, INTER, GROUP2, EXPERTS,
            ROUTER_EXPERTS, TOP_K, RENORMALIZE, stride_om, stride_lm, stride_we2, stride_se2,
            BITS, HAS_ZP, HAS_MAP, WEIGHT_ON_INPUT, ROUTE, PREFETCH, DOWN_N, DOWN_CHUNKS,
            TOPK_POW2, KW2_POW2, E_POW2,
        )  # fmt: skip
    if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu") == total - 1:
        c = tl.arange(0, SYNC_POW2)
        tl.store(sync_ptr + c, tl.zeros([SYNC_POW2], dtype=tl.int32), mask=c < 2 + TOKENS)


@triton.jit
def _gate_up_work(
    ticket,
    gate_tiles,
    x_ptr,
    w13_ptr,
    s13_ptr,
    z13_ptr,
    act_ptr,
    rw_ptr,
    ids_ptr,
    map_ptr,
    logits_ptr,
    sync_ptr,
    HIDDEN,
    INTER,
    KW13,
    GROUP13,
    EXPERTS,
    ROUTER_EXPERTS,
    TOP_K,
    RENORMALIZE,
    stride_xm,
    stride_lm,
    stride_we13,
    stride_se13,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_MAP: tl.constexpr,
    WEIGHT_ON_INPUT: tl.constexpr,
    ROUTE: tl.constexpr,
    PREFETCH: tl.constexpr,
    GATE_ROWS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    TOPK_POW2: tl.constexpr,
    E_POW2: tl.constexpr,
):
    """Gate/up work ``ticket`` of :func:`moe_decode_step_kernel`: pair ``p``'s ``GATE_ROWS``
    rows from ``j0``, then the arrival on its token's counter."""
    p = ticket // gate_tiles
    j0 = (ticket - p * gate_tiles) * GATE_ROWS
    t = p // TOP_K
    if ROUTE:
        slots = tl.arange(0, TOPK_POW2)
        weights, ids = topk_softmax(
            logits_ptr + t.to(tl.int64) * stride_lm, ROUTER_EXPERTS, TOP_K, RENORMALIZE,
            TOPK_POW2, E_POW2,
        )  # fmt: skip
        pick = slots == p - t * TOP_K
        r = tl.sum(tl.where(pick, weights, 0.0), axis=0)
        e = to_local(tl.sum(tl.where(pick, ids, 0), axis=0), True, map_ptr, EXPERTS, HAS_MAP)
        if p == t * TOP_K and j0 == 0:
            taken = slots < TOP_K
            tl.store(rw_ptr + t * TOP_K + slots, weights, mask=taken)
            tl.store(ids_ptr + t * TOP_K + slots, ids, mask=taken)
    else:
        e = local_experts(ids_ptr, map_ptr, p, True, EXPERTS, HAS_MAP)
        r = tl.load(rw_ptr + p)
    if e >= 0:
        e64 = e.to(tl.int64)
        w_e = w13_ptr + e64 * stride_we13
        s_e = s13_ptr + e64 * stride_se13
        z_e = z13_ptr + e64 * stride_se13 if HAS_ZP else z13_ptr
        if PREFETCH:
            # Gate's rows and up's, ``INTER`` further on.
            halves = j0 + tl.arange(0, 2) * INTER
            cols = _row_points(tl.minimum(GATE_ROWS, INTER - j0), GATE_ROWS)
            _prefetch_rows(w_e + halves, KW13, 2 * INTER, cols)
            groups = tl.cdiv(HIDDEN, GROUP13)
            _prefetch_rows(s_e + halves, groups, 2 * INTER, cols)
            if HAS_ZP:
                _prefetch_rows(z_e + halves, groups, 2 * INTER, cols)
        a = tl.arange(0, 2 * GATE_ROWS)
        jj = j0 + a % GATE_ROWS
        rn = jj + (a // GATE_ROWS) * INTER
        res = rows_dot(
            x_ptr + t.to(tl.int64) * stride_xm, w_e, s_e, z_e, 0, HIDDEN, rn, jj < INTER,
            2 * INTER, KW13, GROUP13, BITS, HAS_ZP, BLOCK_K, NUM_STAGES,
        )  # fmt: skip
        if WEIGHT_ON_INPUT:
            res *= r
        gate, up = tl.split(tl.trans(tl.reshape(res, (2, GATE_ROWS))))
        jo = j0 + tl.arange(0, GATE_ROWS)
        tl.store(act_ptr + p.to(tl.int64) * INTER + jo, gate / (1.0 + tl.exp(-gate)) * up,
                 mask=jo < INTER)  # fmt: skip
    tl.debug_barrier()
    tl.atomic_add(sync_ptr + 2 + t, 1, sem="release", scope="gpu")


@triton.jit
def _down_work(
    d,
    need,
    w2_ptr,
    s2_ptr,
    z2_ptr,
    out_ptr,
    act_ptr,
    rw_ptr,
    ids_ptr,
    map_ptr,
    logits_ptr,
    sync_ptr,
    HIDDEN,
    INTER,
    GROUP2,
    EXPERTS,
    ROUTER_EXPERTS,
    TOP_K,
    RENORMALIZE,
    stride_om,
    stride_lm,
    stride_we2,
    stride_se2,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_MAP: tl.constexpr,
    WEIGHT_ON_INPUT: tl.constexpr,
    ROUTE: tl.constexpr,
    PREFETCH: tl.constexpr,
    DOWN_N: tl.constexpr,
    DOWN_CHUNKS: tl.constexpr,
    TOPK_POW2: tl.constexpr,
    KW2_POW2: tl.constexpr,
    E_POW2: tl.constexpr,
):
    """Down work ``d`` of :func:`moe_decode_step_kernel`: ``DOWN_CHUNKS * DOWN_N`` outputs of
    token ``t`` over its slots, its lines prefetched before the wait for ``need`` gate/up
    arrivals."""
    WIDTH: tl.constexpr = DOWN_N * DOWN_CHUNKS
    down_tiles = tl.cdiv(HIDDEN, WIDTH)
    t = d // down_tiles
    n0 = (d - t * down_tiles) * WIDTH
    slots = tl.arange(0, TOPK_POW2)
    taken = slots < TOP_K
    q = t * TOP_K + slots
    if ROUTE:
        r, ids = topk_softmax(
            logits_ptr + t.to(tl.int64) * stride_lm, ROUTER_EXPERTS, TOP_K, RENORMALIZE,
            TOPK_POW2, E_POW2,
        )  # fmt: skip
        e = to_local(ids, taken, map_ptr, EXPERTS, HAS_MAP)
    else:
        e = local_experts(ids_ptr, map_ptr, q, taken, EXPERTS, HAS_MAP)
        r = tl.load(rw_ptr + q, mask=taken, other=0.0)
    live_slot = e >= 0
    # A slot no local expert runs reads (and prefetches) another slot's expert, masked.
    e64 = tl.where(live_slot, e, tl.maximum(tl.max(e, axis=0), 0)).to(tl.int64)
    kw2 = INTER // (32 // BITS)
    if PREFETCH:
        cols = n0 + _row_points(tl.minimum(WIDTH, HIDDEN - n0), WIDTH)
        _prefetch_rows(w2_ptr + e64 * stride_we2, kw2, HIDDEN, cols)
        groups = tl.cdiv(INTER, GROUP2)
        _prefetch_rows(s2_ptr + e64 * stride_se2, groups, HIDDEN, cols)
        if HAS_ZP:
            _prefetch_rows(z2_ptr + e64 * stride_se2, groups, HIDDEN, cols)
    arrived = tl.atomic_add(sync_ptr + 2 + t, 0, sem="acquire", scope="gpu")
    while arrived < need:
        arrived = tl.atomic_add(sync_ptr + 2 + t, 0, sem="acquire", scope="gpu")
    for c in range(DOWN_CHUNKS):
        rn = n0 + c * DOWN_N + tl.arange(0, DOWN_N)
        n_ok = rn < HIDDEN
        words, scales, zeros = _down_tile(
            w2_ptr, s2_ptr, z2_ptr, e64, live_slot, rn, n_ok, HIDDEN, kw2, GROUP2, stride_we2,
            stride_se2, BITS, HAS_ZP, KW2_POW2,
        )  # fmt: skip
        part = _down_dot(
            words, scales, zeros, act_ptr + q.to(tl.int64) * INTER, live_slot, kw2, BITS,
            HAS_ZP, KW2_POW2,
        )  # fmt: skip
        if not WEIGHT_ON_INPUT:
            part *= r[:, None]
        res = tl.sum(part, axis=0)
        tl.store(out_ptr + t.to(tl.int64) * stride_om + rn, res.to(out_ptr.dtype.element_ty),
                 mask=n_ok)  # fmt: skip
