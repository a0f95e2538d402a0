"""Pieces shared by the decode and prefill kernels: KV tile loads and the online-softmax loop.

Both kernels read keys and values from vLLM's paged cache, one layer's view
``[num_blocks, num_kv_heads, block_size, head_size_k + head_size_v]`` with K in the first
``HEAD_SIZE`` elements of the last dimension and V in the next ``HEAD_SIZE``. The block, head
and slot strides are passed in, so any physical order vLLM's ``KVCacheLayout`` picks works as
long as the last dimension is contiguous (the launchers check that).

A program owns ``BLOCK_M`` query rows: some query tokens of one sequence times some query heads
that share one KV head (GQA), so each KV tile is read once for the whole head group.
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_attn_v100 import limits
from volta_core.kernel_api import FP8_FORMAT_CODES, dequantize_tile

#: ``FP8_DECODE`` values (:func:`volta_attn_v100.limits.fp8_decode`) as kernel constants.
E5M2_NATIVE = tl.constexpr(limits.FP8_E5M2_NATIVE)
E4M3_NATIVE = tl.constexpr(limits.FP8_E4M3_NATIVE)
E4M3_INTEGER = tl.constexpr(limits.FP8_E4M3_INTEGER)
#: The host codec's ``FMT`` of e4m3 (:data:`volta_core.kernel_api.FP8_FORMAT_CODES`).
E4M3_FORMAT = tl.constexpr(FP8_FORMAT_CODES["fp8_e4m3"])

#: Integer arguments of both kernels the JIT does not specialize (``triton.jit``'s
#: ``do_not_specialize``; Triton specializes an integer of 1 into a constant and a multiple of
#: 16 into a divisible one, ``triton/runtime/jit.py``): one build's launches pass them of every
#: class (MHA and GQA groups, sinks or none, per-tensor or per-head scales, any block-table
#: width) and their class changes only a division or a branch a program takes once, before
#: its key loop, so each build is one compile, which ``vllm-volta warmup`` can name.
UNSPECIALIZED = (
    "window",
    "has_sinks",
    "group",
    "heads_per_prog",
    "head_chunks",
    "scale_stride",
    "stride_bt",
)

#: Running max of a row that has seen no key yet. Finite, so a fully masked tile gives
#: ``exp2(-inf - NEG_BIG) = 0`` instead of ``exp2(-inf + inf) = nan``.
NEG_BIG = tl.constexpr(-1.0e30)

#: ``log2(e)``: scores are kept in base-2 units (``s * log2(e)``) so every exponential is one
#: ``exp2`` (``ex2.approx``) with no multiply in front; partial maxima and sinks use the same
#: units.
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def load_kv_tile(ptrs, mask, KV_FP8: tl.constexpr, FP8_DECODE: tl.constexpr):
    """Load a K or V tile as fp16; fp8 codes decode exactly, as ``FP8_DECODE`` says
    (:func:`volta_attn_v100.limits.fp8_decode`).

    fp8 e5m2 is the high byte of an fp16 with the same sign, exponent width and bias, so its
    exact decode is ``byte << 8`` reinterpreted as fp16: no fp8 conversion instruction, which
    SM70 lacks and the Triton interpreter gets wrong. From SM89 the hardware converts e5m2, and
    e4m3 (only declared there), to fp16 in fewer instructions. Under the interpreter e4m3
    goes through the host's integer codec.
    """
    if KV_FP8:
        raw = tl.load(ptrs, mask=mask, other=0)
        if FP8_DECODE == E5M2_NATIVE:
            return raw.to(tl.float8e5, bitcast=True).to(tl.float16)
        elif FP8_DECODE == E4M3_NATIVE:
            return raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
        elif FP8_DECODE == E4M3_INTEGER:
            # The codec's decode at unit scale: exact, as every e4m3 value is an fp16 one.
            return dequantize_tile(raw, 1.0, E4M3_FORMAT).to(tl.float16)
        else:
            return (raw.to(tl.int16) << 8).to(tl.float16, bitcast=True)
    else:
        return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def halves(x, HALF: tl.constexpr):
    """``x[:, :HALF]`` and ``x[:, HALF:]`` of a ``[rows, 2 * HALF]`` tile (Triton slices only a
    trailing axis of 2, hence the reshape and permute)."""
    return tl.split(tl.permute(tl.reshape(x, (x.shape[0], 2, HALF)), (0, 2, 1)))


@triton.jit
def joined(lo, hi):
    """The ``[rows, 2 * HALF]`` tile whose :func:`halves` are ``lo`` and ``hi``."""
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (lo.shape[0], 2 * lo.shape[1]))


#: Which tiles of an :func:`attend_tiles` loop apply the masks: none, all, or those from
#: ``mask_from`` on (a branch inside the loop).
NO_MASKS = tl.constexpr(0)
ALL_MASKED = tl.constexpr(1)
MASKED_FROM = tl.constexpr(2)


@triton.jit
def tile_rows(
    bt_row_ptr,
    tile,
    seq_len,
    PAGE_SIZE: tl.constexpr,
    stride_blk,
    stride_slot,
    kv_head_off,
    BLOCK_N: tl.constexpr,
    MASKS: tl.constexpr,
):
    """Key positions of a tile and the offset of each key's cache row (its page from the block
    table).

    Keys past the sequence exist only in tiles that are masked (a whole tile lies below the
    lowest query), and :func:`softmax_step` masks them out of the scores. ``ALL_MASKED`` loops
    mask their loads for them (:func:`load_mask`). A ``MASKED_FROM`` loop instead reads the
    last key's row for them, so its loads carry no row mask whichever tile it is on; what
    they read adds nothing. ``NO_MASKS`` loops have no such keys.

    The row offsets take ``stride_blk``'s integer width: the kernels pass it as 64 bits unless
    the whole cache is addressable with 32-bit offsets (``CACHE_OFFSETS_32``), where every
    partial sum of an offset is at most the cache's highest one.
    """
    k_pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    if MASKS == ALL_MASKED:
        page = tl.load(bt_row_ptr + k_pos // PAGE_SIZE, mask=k_pos < seq_len, other=0)
        src = k_pos
    else:
        src = tl.minimum(k_pos, seq_len - 1) if MASKS == MASKED_FROM else k_pos
        page = tl.load(bt_row_ptr + src // PAGE_SIZE)
    row_off = page * stride_blk + (src % PAGE_SIZE) * stride_slot + kv_head_off
    return k_pos, row_off


@triton.jit
def load_mask(k_pos, seq_len, cols, MASKS: tl.constexpr):
    """The mask of a K or V tile load: the head columns ``cols`` (``[1, head]``), and in an
    ``ALL_MASKED`` loop the keys that exist (:func:`tile_rows`)."""
    return (k_pos < seq_len)[:, None] & cols if MASKS == ALL_MASKED else cols


@triton.jit
def softmax_step(
    s,
    m_i,
    l_i,
    k_pos,
    masked,
    seq_len,
    q_abs,
    qk_scale,
    v_scale,
    softcap,
    window,
    row_kv,
    head,
    KV_PER_PROG: tl.constexpr,
):
    """One tile of the online softmax from the raw scores ``s = q . k``: the new running max
    and sum, the factor ``alpha`` that rescales the output so far, and the fp16 probabilities
    (V scale applied) for P.V. See :func:`attend` for the scale folding and masks; ``masked``
    (a constant, or the same for the whole program) says whether this tile needs them. With
    ``KV_PER_PROG > 1`` the tile belongs to the program's KV head ``head``, and only the rows
    whose ``row_kv`` is that head see it (the others score ``-inf``: ``p = 0``, ``alpha = 1``)."""
    s = s * (qk_scale * LOG2E)
    if softcap > 0:
        # softcap * tanh(x / softcap) in base-2 units: the cap scales by LOG2E too.
        cap = softcap * LOG2E
        s = cap * (1.0 - 2.0 / (tl.exp(2.0 * s / cap) + 1.0))
    if masked:
        keep = (k_pos[None, :] < seq_len) & (k_pos[None, :] <= q_abs[:, None])
        if window > 0:
            keep = keep & ((q_abs[:, None] - k_pos[None, :]) < window)
        s = tl.where(keep, s, float("-inf"))
    if KV_PER_PROG > 1:
        s = tl.where(row_kv[:, None] == head, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    return m_new, l_i, alpha, (p * v_scale).to(tl.float16)


@triton.jit
def attend_tiles(
    q,
    m_i,
    l_i,
    acc,
    kv_ptr,
    bt_row_ptr,
    kv_head_off,
    stride_blk,
    stride_slot,
    PAGE_SIZE: tl.constexpr,
    q_abs,
    seq_len,
    tile_lo,
    tile_hi,
    mask_from,
    qk_scale,
    v_scale,
    softcap,
    window,
    row_kv,
    stride_kvh,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_FP8: tl.constexpr,
    FP8_DECODE: tl.constexpr,
    HALVES: tl.constexpr,
    MASKS: tl.constexpr,
    AHEAD: tl.constexpr = False,
    KV_PER_PROG: tl.constexpr = 1,
    PIPELINED: tl.constexpr = True,
    gap_from=0,
    gap=0,
):
    """Run the online softmax of ``q`` over key tiles ``[tile_lo, tile_hi)`` of one sequence,
    masking the tiles ``MASKS`` names (see :func:`attend`).

    ``PIPELINED``: the loop runs on the launch's software pipeline (``num_stages``); False
    gives it one stage, each tile loaded where it is used (decode's masked tiles, one to four a
    sequence: see :func:`attend`), and steps over the ``gap`` tiles from ``gap_from`` on, so
    one loop takes the masked tiles on both sides of the whole ones.

    The loops walk ``KV_PER_PROG`` KV heads' tiles as one stream, the heads of each key tile
    in turn: step ``it`` is key tile ``it // KV_PER_PROG`` of head ``it % KV_PER_PROG``
    (``kv_head_off`` is head 0's offset, the next ones ``stride_kvh`` apart), so each software
    pipeline runs across the heads with no refill between them (:func:`softmax_step` keeps
    every row to its own head's tiles). With one head per program this is the plain loop.

    ``HALVES``: the head dimension in two halves, Q.K as two dots accumulated into one score
    tile and P.V into two output halves, so only half of each K and V tile is converted and
    live at a time. For fp8 KV on SM80+ the converted e5m2 tiles feed the dot from registers:
    whole, the 128-key sm_90 tile took 255 registers and spilled about 130 B, and fp8 decode
    read at 66-77% of copy bandwidth on the H100; in halves it spilled 28-36 B and read at
    78-83%. ``AHEAD`` (whole tiles in halves only, ``NO_MASKS``): each tile's scores are taken one
    iteration ahead (:func:`volta_attn_v100.launch.takes_ahead` says where).
    """
    P: tl.constexpr = KV_PER_PROG
    STAGES: tl.constexpr = None if PIPELINED else 1
    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d < HEAD_SIZE
    if HALVES:
        HALF: tl.constexpr = HEAD_PAD // 2
        q_lo, q_hi = halves(q, HALF)
        acc_lo, acc_hi = halves(acc, HALF)
        offs_h = tl.arange(0, HALF)
        lo_cols = (offs_h < HEAD_SIZE)[None, :]
        hi_cols = (offs_h + HALF < HEAD_SIZE)[None, :]
        if AHEAD:
            # The first tile's scores before the loop, its loads masked off when the range is
            # empty; then each iteration scores the next tile beside this one's softmax and
            # P.V, which do not depend on it, so a warp has tensor-core work to issue while
            # its exponentials and row reductions wait on each other.
            k_pos, row_off = tile_rows(
                bt_row_ptr, tile_lo, tl.where(tile_lo < tile_hi, seq_len, 0), PAGE_SIZE,
                stride_blk, stride_slot, kv_head_off, BLOCK_N, ALL_MASKED,
            )  # fmt: skip
            live = (tile_lo < tile_hi) & (k_pos < seq_len)
            s = half_scores(
                q_lo, q_hi, kv_ptr, row_off, live[:, None] & lo_cols, live[:, None] & hi_cols,
                HALF, KV_FP8, FP8_DECODE,
            )  # fmt: skip
            for it in range(tile_lo * P, tile_hi * P - 1):
                m_i, l_i, alpha, p = softmax_step(
                    s, m_i, l_i, k_pos, False, seq_len, q_abs, qk_scale, v_scale, softcap,
                    window, row_kv, it % P, P,
                )  # fmt: skip
                v_ptrs = kv_ptr + row_off[:, None] + HEAD_SIZE + offs_h[None, :]
                k_pos, row_off = tile_rows(
                    bt_row_ptr, (it + 1) // P, seq_len, PAGE_SIZE, stride_blk, stride_slot,
                    kv_head_off + (it + 1) % P * stride_kvh, BLOCK_N, NO_MASKS,
                )  # fmt: skip
                s = half_scores(
                    q_lo, q_hi, kv_ptr, row_off, lo_cols, hi_cols, HALF, KV_FP8, FP8_DECODE
                )
                acc_lo, acc_hi = half_values(
                    acc_lo, acc_hi, alpha, p, v_ptrs, lo_cols, hi_cols, HALF, KV_FP8, FP8_DECODE
                )
            if tile_lo < tile_hi:
                m_i, l_i, alpha, p = softmax_step(
                    s, m_i, l_i, k_pos, False, seq_len, q_abs, qk_scale, v_scale, softcap,
                    window, row_kv, P - 1, P,
                )  # fmt: skip
                v_ptrs = kv_ptr + row_off[:, None] + HEAD_SIZE + offs_h[None, :]
                acc_lo, acc_hi = half_values(
                    acc_lo, acc_hi, alpha, p, v_ptrs, lo_cols, hi_cols, HALF, KV_FP8, FP8_DECODE
                )
        else:
            for it in tl.range(tile_lo * P, tile_hi * P, num_stages=STAGES):
                tile = it // P
                if not PIPELINED:
                    tile += tl.where(tile >= gap_from, gap, 0)
                masked = tile >= mask_from if MASKS == MASKED_FROM else MASKS == ALL_MASKED
                k_pos, row_off = tile_rows(
                    bt_row_ptr, tile, seq_len, PAGE_SIZE, stride_blk, stride_slot,
                    kv_head_off + it % P * stride_kvh, BLOCK_N, MASKS,
                )  # fmt: skip
                lo = load_mask(k_pos, seq_len, lo_cols, MASKS)
                hi = load_mask(k_pos, seq_len, hi_cols, MASKS)
                s = half_scores(q_lo, q_hi, kv_ptr, row_off, lo, hi, HALF, KV_FP8, FP8_DECODE)
                m_i, l_i, alpha, p = softmax_step(
                    s, m_i, l_i, k_pos, masked, seq_len, q_abs, qk_scale, v_scale, softcap,
                    window, row_kv, it % P, P,
                )  # fmt: skip
                v_ptrs = kv_ptr + row_off[:, None] + HEAD_SIZE + offs_h[None, :]
                acc_lo, acc_hi = half_values(
                    acc_lo, acc_hi, alpha, p, v_ptrs, lo, hi, HALF, KV_FP8, FP8_DECODE
                )
        acc = joined(acc_lo, acc_hi)
    else:
        for it in tl.range(tile_lo * P, tile_hi * P, num_stages=STAGES):
            tile = it // P
            if not PIPELINED:
                tile += tl.where(tile >= gap_from, gap, 0)
            masked = tile >= mask_from if MASKS == MASKED_FROM else MASKS == ALL_MASKED
            k_pos, row_off = tile_rows(
                bt_row_ptr, tile, seq_len, PAGE_SIZE, stride_blk, stride_slot,
                kv_head_off + it % P * stride_kvh, BLOCK_N, MASKS,
            )  # fmt: skip
            k_ptrs = kv_ptr + row_off[:, None] + offs_d[None, :]
            kv_mask = load_mask(k_pos, seq_len, d_mask[None, :], MASKS)
            k = load_kv_tile(k_ptrs, kv_mask, KV_FP8, FP8_DECODE)
            m_i, l_i, alpha, p = softmax_step(
                tl.dot(q, tl.trans(k)), m_i, l_i, k_pos, masked, seq_len, q_abs, qk_scale,
                v_scale, softcap, window, row_kv, it % P, P,
            )  # fmt: skip
            v = load_kv_tile(k_ptrs + HEAD_SIZE, kv_mask, KV_FP8, FP8_DECODE)
            acc = acc * alpha[:, None] + tl.dot(p, v)
    return m_i, l_i, acc


@triton.jit
def half_scores(q_lo, q_hi, kv_ptr, row_off, lo, hi, HALF: tl.constexpr, KV_FP8, FP8_DECODE):
    """``q . k`` of one key tile whose rows start at ``row_off``, in head halves."""
    offs_h = tl.arange(0, HALF)
    k_ptrs = kv_ptr + row_off[:, None] + offs_h[None, :]
    s = tl.dot(q_lo, tl.trans(load_kv_tile(k_ptrs, lo, KV_FP8, FP8_DECODE)))
    return tl.dot(q_hi, tl.trans(load_kv_tile(k_ptrs + HALF, hi, KV_FP8, FP8_DECODE)), s)


@triton.jit
def half_values(acc_lo, acc_hi, alpha, p, v_ptrs, lo, hi, HALF: tl.constexpr, KV_FP8, FP8_DECODE):
    """The output halves rescaled by ``alpha`` plus ``p . v`` of one key tile, ``v_ptrs`` its
    low half's V pointers, one half at a time.

    It takes pointers, not the tile's row offsets: the ahead loop forms them before it loads
    the next tile's block-table entries, and formed here after them instead, its sm_90 build
    took 1347 SASS instructions an iteration instead of 1200."""
    acc_lo = acc_lo * alpha[:, None] + tl.dot(p, load_kv_tile(v_ptrs, lo, KV_FP8, FP8_DECODE))
    v_hi = load_kv_tile(v_ptrs + HALF, hi, KV_FP8, FP8_DECODE)
    return acc_lo, acc_hi * alpha[:, None] + tl.dot(p, v_hi)


@triton.jit
def attend(
    q,
    m_i,
    l_i,
    acc,
    kv_ptr,
    bt_row_ptr,
    kv_head_off,
    stride_blk,
    stride_slot,
    PAGE_SIZE: tl.constexpr,
    q_abs,
    lowest_q_abs,
    seq_len,
    tile_lo,
    tile_hi,
    qk_scale,
    v_scale,
    softcap,
    window,
    row_kv,
    stride_kvh,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_FP8: tl.constexpr,
    FP8_DECODE: tl.constexpr,
    HALVES: tl.constexpr,
    ONE_LOOP: tl.constexpr,
    AHEAD: tl.constexpr = False,
    KV_PER_PROG: tl.constexpr = 1,
    ONE_STAGE_TAIL: tl.constexpr = False,
):
    """The online softmax of ``q`` over key tiles ``[tile_lo, tile_hi)`` of one sequence.

    Scale folding (the fp8 KV algebra): scores are ``(q . k_stored) * sm_scale * k_scale``, so the
    K scale is applied after Q.K on the small score tile, and the V scale multiplies the
    probabilities before P.V, so no K or V tile is ever dequantized by a multiply. ``l_i`` sums
    the unscaled probabilities, so ``acc / l_i`` is the attention output in real units. Scores,
    ``m_i`` and the returned maxima are in base-2 units (``LOG2E``).

    Masks: key position ``< seq_len``, causal ``k_pos <= q_abs`` and, when ``window > 0``, the
    sliding window ``q_abs - k_pos < window`` (vLLM's ``sliding_window`` convention). A tile
    is whole when its last key is at or below ``lowest_q_abs`` (the smallest query position
    among the program's rows: causal masking cuts nothing in it, and every key is below
    ``seq_len``) and, with a window, its first key is inside every row's window (only with
    ``ONE_STAGE_TAIL``; otherwise a window masks every tile); whole tiles skip the masks
    (rows that are padding compute values nobody stores). ``softcap > 0`` applies
    ``softcap * tanh(s / softcap)`` to the scaled scores.

    ``AHEAD``: the whole tiles' loop takes each tile's scores one iteration ahead
    (:func:`attend_tiles`; not with ``ONE_LOOP``).

    ``KV_PER_PROG``: the program's rows belong to that many consecutive KV heads, row ``r``
    to head ``row_kv[r]`` (0 for the first, whose offset is ``kv_head_off``; the next ones
    ``stride_kvh`` further each); every loop then walks those heads' tiles as one stream
    (:func:`attend_tiles`). ``qk_scale`` and ``v_scale`` may be per-row columns
    (``[BLOCK_M, 1]``: per-head scales of several heads).

    ``ONE_LOOP``: whole and masked tiles in one loop, the masks behind a branch the whole
    program takes alike (prefill). Otherwise (decode) the whole tiles run in their own loop, on
    the launch's software pipeline, and the masked ones after it, pipelined too by default;
    ``ONE_STAGE_TAIL`` (:func:`volta_attn_v100.launch.takes_one_stage_tail` says where) runs them
    in one loop of one stage instead: those below the whole range (with a window, the tiles its
    start cuts) and those above it (the sequence's last tile, the speculative queries'
    diagonal). Each form is the faster one where it is taken
    (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#loop_forms). A tile is then whole, window or
    not, when every key in it is inside the window of the highest query, ``seq_len - 1``, hence
    of all the rows.
    """
    whole_hi = (lowest_q_abs + 1) // BLOCK_N
    if ONE_LOOP:
        whole_hi = tl.where(window > 0, tile_lo, whole_hi)
        m_i, l_i, acc = attend_tiles(
            q, m_i, l_i, acc, kv_ptr, bt_row_ptr, kv_head_off, stride_blk, stride_slot,
            PAGE_SIZE, q_abs, seq_len, tile_lo, tile_hi, whole_hi, qk_scale, v_scale, softcap,
            window, row_kv, stride_kvh, HEAD_SIZE, HEAD_PAD, BLOCK_N, KV_FP8, FP8_DECODE, HALVES,
            MASKED_FROM, False, KV_PER_PROG,
        )  # fmt: skip
    else:
        if ONE_STAGE_TAIL:
            # The whole tiles start where the highest query's window does.
            whole_lo = tl.where(window > 0, tl.cdiv(tl.maximum(seq_len - window, 0), BLOCK_N), 0)
            whole_lo = tl.minimum(tl.maximum(whole_lo, tile_lo), tile_hi)
        else:
            whole_lo = tile_lo
            whole_hi = tl.where(window > 0, tile_lo, whole_hi)
        whole_hi = tl.maximum(tl.minimum(whole_hi, tile_hi), whole_lo)
        m_i, l_i, acc = attend_tiles(
            q, m_i, l_i, acc, kv_ptr, bt_row_ptr, kv_head_off, stride_blk, stride_slot,
            PAGE_SIZE, q_abs, seq_len, whole_lo, whole_hi, whole_hi, qk_scale, v_scale, softcap,
            window, row_kv, stride_kvh, HEAD_SIZE, HEAD_PAD, BLOCK_N, KV_FP8, FP8_DECODE, HALVES,
            NO_MASKS, AHEAD, KV_PER_PROG,
        )  # fmt: skip
        if ONE_STAGE_TAIL:
            # [tile_lo, whole_lo), then past the whole tiles' gap [whole_hi, tile_hi).
            masked_lo = tile_lo
            masked_hi = tile_hi - (whole_hi - whole_lo)
        else:
            masked_lo = whole_hi
            masked_hi = tile_hi
        m_i, l_i, acc = attend_tiles(
            q, m_i, l_i, acc, kv_ptr, bt_row_ptr, kv_head_off, stride_blk, stride_slot,
            PAGE_SIZE, q_abs, seq_len, masked_lo, masked_hi, whole_hi, qk_scale, v_scale, softcap,
            window, row_kv, stride_kvh, HEAD_SIZE, HEAD_PAD, BLOCK_N, KV_FP8, FP8_DECODE, HALVES,
            ALL_MASKED, False, KV_PER_PROG, not ONE_STAGE_TAIL, whole_lo, whole_hi - whole_lo,
        )  # fmt: skip
    return m_i, l_i, acc


@triton.jit
def finish_rows(m_i, l_i, acc, sink):
    """Normalise a program's rows into the attention output (float32), attention sinks included.

    With sinks, the sink logit joins the softmax denominator (it attends to no value):
    ``out = acc e^(m - M) / (l e^(m - M) + e^(sink - M))`` with ``M = max(m, sink)``, in base-2
    units (``sink`` from :func:`load_sinks`). Without sinks the sink is ``NEG_BIG``, whose term
    is exactly zero. ``m_i``, ``l_i`` and ``acc`` are a row's running max, sum and unnormalised
    output over all its keys (one program's, or the combined splits').
    """
    m_fin = tl.maximum(m_i, sink)
    alpha = tl.exp2(m_i - m_fin)
    denom = l_i * alpha + tl.exp2(sink - m_fin)
    return acc * (alpha / tl.where(denom > 0, denom, 1.0))[:, None]


@triton.jit
def load_sinks(sinks_ptr, q_head, row_valid, has_sinks):
    """The rows' sink logits in base-2 units (``NEG_BIG`` without sinks), for :func:`finish_rows`.

    Loaded before the key loop and kept as values: loaded after the loop instead, the sm_90
    decode kernel took 150 registers per thread instead of 119 (ptxas), 3 programs per SM
    instead of 4, and the H100 decode of 64 sequences x 4-8K fell from 93-97% to 85% of copy
    bandwidth.
    """
    sink = tl.load(sinks_ptr + q_head, mask=row_valid & (has_sinks > 0), other=NEG_BIG)
    return sink.to(tl.float32) * LOG2E


@triton.jit
def first_tile(lowest_q_abs, window, BLOCK_N: tl.constexpr):
    """The first key tile any row can see: 0, or the sliding window's start."""
    start = tl.where(window > 0, tl.maximum(lowest_q_abs - window + 1, 0), 0)
    return start // BLOCK_N
