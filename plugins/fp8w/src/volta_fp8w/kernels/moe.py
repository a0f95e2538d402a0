"""The fused-MoE kernels: every local expert's FP8 weights stacked ``[E, n, k]`` (uint8 e4m3fn
codes, rows contiguous, and float32 scales ``[E, ceil(n / QN), ceil(k / QK)]``, the layout of
:mod:`volta_fp8w.layout` per expert), fp16 activations, fp32 accumulation.

Codes are decoded by :func:`~volta_fp8w.kernels.e4m3.e4m3_scaled_fp16` (the value times
``2**-8``); a partial sum over one input tile is multiplied by its block's scale once per
(output, tile), never per weight, and ``2**8`` is multiplied back once per output. Every input
tile (``BLOCK_K``) lies inside one scale column: the launcher picks a ``BLOCK_K`` dividing
``QK``.

* Decode (1 to 16 tokens), straight from the router's ids: :func:`moe_gemv_gate_up_kernel`, a
  GEMV per routed (token, slot) pair over gate and up with ``SiLU(gate) * up`` in its epilogue,
  :func:`moe_gemv_down_kernel`, the down GEMV per pair times its router weight, and
  :func:`moe_sum_kernel`, each token's slots added in order (deterministic: no atomics, no
  memset). A GEMV program streams its rows' tiles through ``tl.range``'s software pipeline.
* Prefill: the pairs counted and placed by expert into blocks of ``BLOCK_M`` rows
  (:func:`moe_count_kernel`, :func:`moe_place_kernel`), then a grouped GEMM over the blocks with
  ``tl.dot`` on decoded fp16 tiles: :func:`moe_gate_up_kernel` (SiLU product in the epilogue)
  and :func:`moe_down_kernel` (each pair's row, weighted, added atomically into its token's fp32
  row). The GEMM programs find their block's expert from the counts, so nothing is read back
  to the host. On a V100 the CUDA tensor-core GEMM (:mod:`volta_fp8w.cuda.moe_mma`) takes the
  same placed pairs and counts.

A pair whose id is negative, past the experts, or mapped to -1 by the expert map (another
rank's expert) is run by no program. Everything is sized by the batch alone, so a step can be
captured in a CUDA graph.
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_fp8w.kernels.e4m3 import e4m3_scaled_fp16

# ``2**8`` (``volta_fp8w.kernels.e4m3.E4M3_FOLD``) is written as the literal 256.0 below:
# a jitted function reads no module global that is not a ``tl.constexpr``.

#: The experts' integer arguments Triton's JIT does not specialize (it would otherwise build
#: another kernel for an argument's value of 1 and for multiples of 16,
#: ``triton/runtime/jit.py``; it matches them by name, so each kernel takes those it has), so
#: that one build serves every batch and model, as the gate and warmup declare it: the pair
#: count only bounds the pairs, the local and global expert counts are compared with each
#: pair's id, the router's top-k turns a pair into its token (and bounds the slot sum's loop),
#: and the scales' row length and expert stride only index one scale per row and input tile,
#: as the layer kernels' scale arguments (:data:`volta_fp8w.kernels.dequant.SCALE_ARGS`).
UNSPECIALIZED = ("PAIRS", "EXPERTS", "GLOBAL", "TOP_K", "S_COLS", "stride_se")


@triton.jit
def local_expert(ids_ptr, map_ptr, p, ok, EXPERTS, GLOBAL, HAS_MAP: tl.constexpr):
    """Pair ``p``'s local expert where ``ok`` (scalar or vector), -1 where none runs it: an id
    outside ``0 .. GLOBAL - 1``, one the expert map (``HAS_MAP``) sends to -1, or a local id
    outside ``0 .. EXPERTS - 1``."""
    e = tl.load(ids_ptr + p, mask=ok, other=-1).to(tl.int32)
    ok = ok & (e >= 0) & (e < GLOBAL)
    if HAS_MAP:
        e = tl.load(map_ptr + e, mask=ok, other=-1).to(tl.int32)
    return tl.where(ok & (e >= 0) & (e < EXPERTS), e, -1)


@triton.jit
def gemv_rows(
    x_row, w_e, s_e, rows, r_ok, K, S_COLS,
    QN: tl.constexpr, QK: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    """``sum_k x[k] * W[r, k]`` in fp32 for the rows ``rows`` (where ``r_ok``) of one expert's
    weight at ``w_e`` (``K`` codes a row) and scales at ``s_e`` (``S_COLS`` a row of blocks)."""
    acc = tl.zeros([rows.shape[0]], dtype=tl.float32)
    w_rows = w_e + rows[:, None] * K
    s_rows = s_e + (rows // QN) * S_COLS
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        x = tl.load(x_row + kk, mask=k_ok, other=0.0).to(tl.float32)
        codes = tl.load(w_rows + kk[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0)
        part = tl.sum(e4m3_scaled_fp16(codes).to(tl.float32) * x[None, :], axis=1)
        acc += part * tl.load(s_rows + k0 // QK, mask=r_ok, other=0.0)
    return acc * 256.0


@triton.jit(do_not_specialize=UNSPECIALIZED)
def moe_gemv_gate_up_kernel(
    x_ptr, w_ptr, s_ptr, act_ptr, rw_ptr, ids_ptr, map_ptr,
    HIDDEN, INTER, EXPERTS, GLOBAL, TOP_K, S_COLS, stride_xm, stride_we, stride_se,
    QN: tl.constexpr, QK: tl.constexpr, HAS_MAP: tl.constexpr, MUL_INPUT: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    """``act[p, j] = SiLU(g) * u``, ``g = x[t] . W_e[j]``, ``u = x[t] . W_e[INTER + j]`` for
    routed pair ``p`` (token ``t = p // TOP_K``, local expert ``e``) and ``BLOCK_N`` of its
    ``INTER`` intermediate columns ``j``; ``g`` and ``u`` times the pair's router weight first
    with ``MUL_INPUT``. Grid ``(pairs, cdiv(INTER, BLOCK_N))``; ``act`` fp32 ``[pairs, INTER]``,
    the row of a pair no local expert runs left unwritten (down never reads it)."""
    p = tl.program_id(0)
    e = local_expert(ids_ptr, map_ptr, p, p >= 0, EXPERTS, GLOBAL, HAS_MAP)
    if e < 0:
        return
    e64 = e.to(tl.int64)
    c = tl.arange(0, 2 * BLOCK_N)
    j = tl.program_id(1) * BLOCK_N + c % BLOCK_N
    rows = (c // BLOCK_N) * INTER + j  # gate's block, then up's
    gu = gemv_rows(
        x_ptr + (p // TOP_K).to(tl.int64) * stride_xm, w_ptr + e64 * stride_we,
        s_ptr + e64 * stride_se, rows, j < INTER, HIDDEN, S_COLS, QN, QK, BLOCK_K, NUM_STAGES,
    )  # fmt: skip
    if MUL_INPUT:
        gu *= tl.load(rw_ptr + p)
    g, u = tl.split(tl.permute(tl.reshape(gu, (2, BLOCK_N)), (1, 0)))
    act = g / (1.0 + tl.exp(-g)) * u
    jj = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(act_ptr + p.to(tl.int64) * INTER + jj, act, mask=jj < INTER)


@triton.jit(do_not_specialize=UNSPECIALIZED)
def moe_gemv_down_kernel(
    act_ptr, w_ptr, s_ptr, part_ptr, rw_ptr, ids_ptr, map_ptr,
    HIDDEN, INTER, EXPERTS, GLOBAL, S_COLS, stride_we, stride_se,
    QN: tl.constexpr, QK: tl.constexpr, HAS_MAP: tl.constexpr, MUL_ROUTER: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    """``part[p, n] = r[p] * act[p] . W_e[n]`` for routed pair ``p`` (``e`` its local expert;
    ``r`` the router weight with ``MUL_ROUTER``, else 1; 0 where no local expert runs the pair)
    and ``BLOCK_N`` outputs ``n``, fp32. Grid ``(pairs, cdiv(HIDDEN, BLOCK_N))``."""
    p = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < HIDDEN
    e = local_expert(ids_ptr, map_ptr, p, p >= 0, EXPERTS, GLOBAL, HAS_MAP)
    y = tl.zeros([BLOCK_N], dtype=tl.float32)
    if e >= 0:
        e64 = e.to(tl.int64)
        y = gemv_rows(
            act_ptr + p.to(tl.int64) * INTER, w_ptr + e64 * stride_we, s_ptr + e64 * stride_se,
            rn, n_ok, INTER, S_COLS, QN, QK, BLOCK_K, NUM_STAGES,
        )  # fmt: skip
        if MUL_ROUTER:
            y *= tl.load(rw_ptr + p)
    tl.store(part_ptr + p.to(tl.int64) * HIDDEN + rn, y, mask=n_ok)


@triton.jit(do_not_specialize=UNSPECIALIZED)
def moe_sum_kernel(part_ptr, out_ptr, HIDDEN, TOP_K, stride_om, BLOCK: tl.constexpr):
    """``out[t, n] = sum_s part[t * TOP_K + s, n]``, the slots added in order (deterministic),
    stored in the output's dtype. Grid ``(tokens, cdiv(HIDDEN, BLOCK))``."""
    t = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = rn < HIDDEN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, TOP_K):
        acc += tl.load(part_ptr + (t * TOP_K + s) * HIDDEN + rn, mask=ok, other=0.0)
    tl.store(out_ptr + t * stride_om + rn, acc.to(out_ptr.dtype.element_ty), mask=ok)


# -- prefill: routed blocks --------------------------------------------------------------------


@triton.jit(do_not_specialize=UNSPECIALIZED)
def moe_count_kernel(
    ids_ptr, map_ptr, count_ptr, rank_ptr, PAIRS, EXPERTS, GLOBAL,
    HAS_MAP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``rank[p]`` = expert ``e``'s count before pair ``p``'s atomic add, ``count[e] += 1``,
    for each pair with a local expert ``e`` (``count`` zeroed by the launcher): a rank unique
    within the expert, in whatever order the adds land, which is all the placing needs."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e = local_expert(ids_ptr, map_ptr, p, p < PAIRS, EXPERTS, GLOBAL, HAS_MAP)
    local = e >= 0
    rank = tl.atomic_add(count_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=local, sem="relaxed")
    tl.store(rank_ptr + p, rank, mask=local)


@triton.jit
def block_starts(count_ptr, EXPERTS, BLOCK_M: tl.constexpr, E_POW2: tl.constexpr):
    """Each expert's first block and the end of its blocks (``[E_POW2]``, zero blocks past the
    experts): its pairs padded to whole blocks of ``BLOCK_M``, the experts in order."""
    ex = tl.arange(0, E_POW2)
    counts = tl.load(count_ptr + ex, mask=ex < EXPERTS, other=0)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    end = tl.cumsum(blocks, 0)
    return ex, end - blocks, end


@triton.jit(do_not_specialize=UNSPECIALIZED)
def moe_place_kernel(
    ids_ptr, map_ptr, count_ptr, rank_ptr, sorted_ptr, PAIRS, EXPERTS, GLOBAL,
    HAS_MAP: tl.constexpr, BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``sorted[start[e] * BLOCK_M + rank[p]] = p`` for each pair ``p`` of local expert ``e``
    (:func:`block_starts`); the other slots keep the launcher's fill, ``PAIRS`` (padding)."""
    ex, start, _ = block_starts(count_ptr, EXPERTS, BLOCK_M, E_POW2)
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e = local_expert(ids_ptr, map_ptr, p, p < PAIRS, EXPERTS, GLOBAL, HAS_MAP)
    local = e >= 0
    rank = tl.load(rank_ptr + p, mask=local, other=0)
    first = tl.sum(tl.where(e[:, None] == ex[None, :], start[None, :], 0), axis=1)
    tl.store(sorted_ptr + first * BLOCK_M + rank, p, mask=local)


@triton.jit
def block_expert(count_ptr, block, EXPERTS, BLOCK_M: tl.constexpr, E_POW2: tl.constexpr):
    """The expert whose blocks hold block ``block``; ``EXPERTS`` past the routed blocks."""
    ex, _, end = block_starts(count_ptr, EXPERTS, BLOCK_M, E_POW2)
    return tl.sum(((end <= block) & (ex < EXPERTS)).to(tl.int32), axis=0)


@triton.jit
def dot_tile(acc, a, w_cols, kk, k_ok, n_ok, s_cols, k0, QK: tl.constexpr):
    """``acc + (a @ Wt) * s``: ``a`` ``[BLOCK_M, BLOCK_K]`` activations, ``Wt`` the decoded
    ``[BLOCK_K, BLOCK_N]`` tile of the weight columns ``w_cols`` (a pointer per output row of
    ``W``), ``s`` their block's scale in this input tile (one per output)."""
    codes = tl.load(w_cols + kk[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0)
    w = e4m3_scaled_fp16(codes).to(a.dtype)
    s = tl.load(s_cols + k0 // QK, mask=n_ok, other=0.0)
    return acc + tl.dot(a, w) * s[None, :]


@triton.jit(do_not_specialize=UNSPECIALIZED)
def moe_gate_up_kernel(
    x_ptr, w_ptr, s_ptr, act_ptr, rw_ptr, sorted_ptr, count_ptr,
    PAIRS, HIDDEN, INTER, EXPERTS, TOP_K, S_COLS, stride_xm, stride_am, stride_we, stride_se,
    QN: tl.constexpr, QK: tl.constexpr, MUL_INPUT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, E_POW2: tl.constexpr,
):  # fmt: skip
    """``act[p, j] = SiLU(x[t] . W_e[j]) * (x[t] . W_e[INTER + j])`` for the ``BLOCK_M`` pairs
    ``p`` of one block (``t = p // TOP_K``, ``e`` the block's expert) and ``BLOCK_N``
    intermediate columns ``j`` (both products times the router weight with ``MUL_INPUT``),
    stored in ``act``'s dtype. Grid ``(most blocks, cdiv(INTER, BLOCK_N))``: blocks past the
    routed ones return at once."""
    pid_m = tl.program_id(0)
    e = block_expert(count_ptr, pid_m, EXPERTS, BLOCK_M, E_POW2)
    if e >= EXPERTS:
        return
    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    m_ok = pairs < PAIRS
    x_rows = x_ptr + (pairs // TOP_K).to(tl.int64)[:, None] * stride_xm
    j = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    j_ok = j < INTER
    e64 = e.to(tl.int64)
    w_e = w_ptr + e64 * stride_we
    s_e = s_ptr + e64 * stride_se
    g_cols = w_e + j[None, :] * HIDDEN
    u_cols = w_e + (INTER + j)[None, :] * HIDDEN
    g_scales = s_e + (j // QN) * S_COLS
    u_scales = s_e + ((INTER + j) // QN) * S_COLS
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < HIDDEN
        a = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc_g = dot_tile(acc_g, a, g_cols, kk, k_ok, j_ok, g_scales, k0, QK)
        acc_u = dot_tile(acc_u, a, u_cols, kk, k_ok, j_ok, u_scales, k0, QK)
    g = acc_g * 256.0
    u = acc_u * 256.0
    if MUL_INPUT:
        r = tl.load(rw_ptr + pairs, mask=m_ok, other=0.0)[:, None]
        g *= r
        u *= r
    act = g / (1.0 + tl.exp(-g)) * u
    o = act_ptr + pairs.to(tl.int64)[:, None] * stride_am + j[None, :]
    tl.store(o, act.to(act_ptr.dtype.element_ty), mask=m_ok[:, None] & j_ok[None, :])


@triton.jit(do_not_specialize=UNSPECIALIZED)
def moe_down_kernel(
    act_ptr, w_ptr, s_ptr, out_ptr, rw_ptr, sorted_ptr, count_ptr,
    PAIRS, HIDDEN, INTER, EXPERTS, TOP_K, S_COLS, stride_am, stride_om, stride_we, stride_se,
    QN: tl.constexpr, QK: tl.constexpr, MUL_ROUTER: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, E_POW2: tl.constexpr,
):  # fmt: skip
    """``out[p // TOP_K, n] += r[p] * act[p] . W_e[n]`` for the ``BLOCK_M`` pairs ``p`` of one
    block and ``BLOCK_N`` outputs ``n`` (``r`` the router weight with ``MUL_ROUTER``, else 1),
    added atomically into the zeroed fp32 ``out``. Grid ``(most blocks, cdiv(HIDDEN,
    BLOCK_N))``."""
    pid_m = tl.program_id(0)
    e = block_expert(count_ptr, pid_m, EXPERTS, BLOCK_M, E_POW2)
    if e >= EXPERTS:
        return
    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    m_ok = pairs < PAIRS
    a_rows = act_ptr + pairs.to(tl.int64)[:, None] * stride_am
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < HIDDEN
    e64 = e.to(tl.int64)
    w_cols = w_ptr + e64 * stride_we + rn[None, :] * INTER
    scales = s_ptr + e64 * stride_se + (rn // QN) * S_COLS
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < INTER
        a = tl.load(a_rows + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = dot_tile(acc, a, w_cols, kk, k_ok, n_ok, scales, k0, QK)
    acc *= 256.0
    if MUL_ROUTER:
        acc *= tl.load(rw_ptr + pairs, mask=m_ok, other=0.0)[:, None]
    o = out_ptr + (pairs // TOP_K).to(tl.int64)[:, None] * stride_om + rn[None, :]
    tl.atomic_add(o, acc, mask=m_ok[:, None] & n_ok[None, :], sem="relaxed")
