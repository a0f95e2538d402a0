"""Split-KV paged decode in one launch: partitions of a sequence's context, combined in place.

Decode reads the whole KV context of every sequence for one or a few query tokens, so it is
bound by memory bandwidth. One KV head per program and all its query heads (GQA) as rows means
each KV tile is read once per head group. With few sequences the grid would leave most SMs idle,
so the context is split into ``num_splits`` partitions. Each partition's program stores its
unnormalised partial result (``acc``, running max ``m``, sum ``l``) and counts itself in on its
(sequence, KV program) arrival counter; the program that arrives last combines every partition
and the attention sinks and writes the output, then sets the counter back to zero
(:mod:`volta_core.kernel_api`). No second kernel: at batch 1 a decode step is a few
microseconds of reading, as long as one extra launch inside a CUDA graph. With one partition
the program normalises its own rows and writes the output directly.

Rows of a program are ``query token x head``: ``row = t * heads_per_prog + g``. Up to
``BLOCK_M // heads_per_prog`` query tokens per sequence are handled, which covers speculative
verification (2..8 tokens per sequence, causal among themselves).
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_attn_v100.kernels.common import (
    NEG_BIG,
    UNSPECIALIZED,
    attend,
    finish_rows,
    first_tile,
    load_sinks,
)


@triton.jit(do_not_specialize=(*UNSPECIALIZED, "num_q_heads", "num_splits"))
def paged_decode_kernel(
    q_ptr,
    kv_ptr,
    bt_ptr,
    seq_lens_ptr,
    q_start_ptr,
    k_scale_ptr,
    v_scale_ptr,
    sinks_ptr,
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    counter_ptr,
    sm_scale,
    softcap,
    window,
    has_sinks,
    group,
    heads_per_prog,
    head_chunks,
    num_q_heads,
    num_splits,
    scale_stride,
    stride_qt,
    stride_qh,
    stride_blk,
    stride_kvh,
    stride_slot,
    stride_bt,
    stride_ot,
    stride_oh,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_FP8: tl.constexpr,
    FP8_DECODE: tl.constexpr,
    HALVES: tl.constexpr,
    COMBINE_M: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    PARTIALS_F16: tl.constexpr,
    AHEAD: tl.constexpr,
    KV_PER_PROG: tl.constexpr,
    ONE_STAGE_TAIL: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    CACHE_OFFSETS_32: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """Grid ``(num_seqs, num_kv_heads * head_chunks, num_splits)``; output ``[token, q_head]``.

    With ``SPLIT`` (``num_splits > 1``), partials go to
    ``part_acc[token, q_head, split, :HEAD_PAD]`` and ``part_ml[token, q_head, split, 0:2]``
    (max in base-2 units, sum), both float32 and contiguous, and
    ``counter_ptr[seq * num_kv_programs + pid_h]`` must be zero at launch (it is again after
    it). As in ct_wna16's split-K: the barrier makes every thread's partial stores precede the
    program's one release-acquire increment (GPU scope), so the program whose increment
    returns ``num_splits - 1`` sees all partials of its rows; it reads them past L1 (``.cg``:
    no stale line), in partition order (deterministic). Without ``SPLIT`` (one partition: the
    combining code is not compiled) none of the three is touched, and the combine's constants
    are the launcher's fixed ones (:meth:`volta_attn_v100.launch.DecodeBuild.unsplit`). Rows
    that are padding (past ``q_len`` or the head group) are neither read nor written, so
    CUDA-graph padding tokens stay untouched.

    ``COMBINE_M`` (a power of two, at most ``BLOCK_M``) covers every row a program can own
    (``query_len_pad x heads_per_prog``): ``BLOCK_M`` is at least 16 for ``tl.dot``, but a
    32/8-head decode owns 4 rows, so the combine loads only those rows' partials and takes
    ``SPLIT_CHUNK`` partitions per L2 round trip (:func:`combine_splits`). ``PARTIALS_F16``:
    ``part_acc`` is fp16 and holds each partial normalised by its own sum
    (:func:`volta_attn_v100.launch.fp16_partials` says where).

    ``AHEAD``: the whole tiles' scores one iteration ahead
    (:func:`volta_attn_v100.launch.takes_ahead` says where).

    ``KV_PER_PROG > 1`` (with ``head_chunks == 1``): program ``pid_h`` owns KV heads
    ``pid_h * KV_PER_PROG ..`` and all their query heads, ``heads_per_prog`` of them at least,
    and walks their tiles as one stream (:func:`volta_attn_v100.kernels.common.attend_tiles`;
    :func:`volta_attn_v100.launch.kv_heads_per_program` says where).

    ``ONE_STAGE_TAIL``: the masked tiles in one loop of one stage after the whole tiles'
    (:func:`volta_attn_v100.kernels.common.attend`;
    :func:`volta_attn_v100.launch.takes_one_stage_tail` says where).

    ``PAGE_SIZE``: the KV block size, a constant of the build (vLLM fixes it per engine), so
    a tile's page lookups divide by a constant.

    ``CACHE_OFFSETS_32``: the cache's rows are addressed with 32-bit offsets (a cache of fewer
    than 2^31 elements; :func:`volta_attn_v100.launch.cache_offsets_32` says where), else
    with 64-bit ones (:func:`volta_attn_v100.kernels.common.tile_rows`).
    """
    if not CACHE_OFFSETS_32:
        stride_blk = stride_blk.to(tl.int64)
    seq = tl.program_id(0)
    pid_h = tl.program_id(1)
    split = tl.program_id(2)
    kv_head = pid_h // head_chunks
    chunk = pid_h % head_chunks
    # The query heads a program's rows are drawn from, and its first KV head.
    group_rows = group * KV_PER_PROG
    kv_first = kv_head * KV_PER_PROG

    q_begin = tl.load(q_start_ptr + seq)
    q_len = tl.load(q_start_ptr + seq + 1) - q_begin
    seq_len = tl.load(seq_lens_ptr + seq)

    t, token, q_head, row_valid = program_rows(
        BLOCK_M, chunk, kv_head, heads_per_prog, group_rows, q_begin, q_len
    )
    row_kv = (q_head - kv_first * group) // group
    q_abs = tl.where(row_valid, seq_len - q_len + t, -1)

    offs_d = tl.arange(0, HEAD_PAD)
    q_ptrs = q_ptr + token[:, None].to(tl.int64) * stride_qt + q_head[:, None] * stride_qh
    q = tl.load(q_ptrs + offs_d[None, :], mask=row_valid[:, None] & (offs_d[None, :] < HEAD_SIZE))

    if KV_FP8 and KV_PER_PROG > 1:
        # Each row's own head's scales, as columns that scale its scores and probabilities.
        scale_off = (kv_first + row_kv) * scale_stride
        k_scale = tl.load(k_scale_ptr + scale_off, mask=row_valid, other=1.0)[:, None]
        v_scale = tl.load(v_scale_ptr + scale_off, mask=row_valid, other=1.0)[:, None]
    elif KV_FP8:
        k_scale = tl.load(k_scale_ptr + kv_head * scale_stride)
        v_scale = tl.load(v_scale_ptr + kv_head * scale_stride)
    else:
        k_scale = 1.0
        v_scale = 1.0

    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    lo = first_tile(seq_len - q_len, window, BLOCK_N)
    if SPLIT:
        per_split = tl.cdiv(num_tiles - lo, num_splits)
        tile_lo = lo + split * per_split
        tile_hi = tl.minimum(tile_lo + per_split, num_tiles)
    else:
        tile_lo = lo
        tile_hi = num_tiles

    sink = load_sinks(sinks_ptr, q_head, row_valid, has_sinks)
    m_i = tl.full([BLOCK_M], NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    m_i, l_i, acc = attend(
        q,
        m_i,
        l_i,
        acc,
        kv_ptr,
        bt_ptr + seq.to(tl.int64) * stride_bt,
        kv_first * stride_kvh,
        stride_blk,
        stride_slot,
        PAGE_SIZE,
        q_abs,
        seq_len - q_len,
        seq_len,
        tile_lo,
        tile_hi,
        sm_scale * k_scale,
        v_scale,
        softcap,
        window,
        row_kv,
        stride_kvh,
        HEAD_SIZE,
        HEAD_PAD,
        BLOCK_N,
        KV_FP8,
        FP8_DECODE,
        HALVES,
        False,
        AHEAD,
        KV_PER_PROG,
        ONE_STAGE_TAIL,
    )

    # A split build launched with one partition writes its rows directly too. The runtime test
    # also keeps ptxas's sm_70 allocation of the split builds: without it two of them spilled.
    if not SPLIT or num_splits == 1:
        out = finish_rows(m_i, l_i, acc, sink)
        store_rows(
            out, out_ptr, token, q_head, row_valid, stride_ot, stride_oh, HEAD_SIZE, HEAD_PAD
        )
    else:
        part_row = (token.to(tl.int64) * num_q_heads + q_head) * num_splits + split
        tl.store(
            part_acc_ptr + part_row[:, None] * HEAD_PAD + offs_d[None, :],
            stored_partial(acc, l_i, PARTIALS_F16),
            mask=row_valid[:, None],
        )
        tl.store(part_ml_ptr + part_row * 2, m_i, mask=row_valid)
        tl.store(part_ml_ptr + part_row * 2 + 1, l_i, mask=row_valid)
        tl.debug_barrier()
        counter = counter_ptr + seq * tl.num_programs(1) + pid_h
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            t_c, token_c, q_head_c, valid_c = program_rows(
                COMBINE_M, chunk, kv_head, heads_per_prog, group_rows, q_begin, q_len
            )
            # Partials of row 0 first: 64-bit once, the rows' offsets from it in 32 bits.
            head0 = kv_head * group_rows + chunk * heads_per_prog
            first = (q_begin.to(tl.int64) * num_q_heads + head0) * num_splits
            rel = (t_c * num_q_heads + q_head_c - head0) * num_splits
            m_c, l_c, acc_c = combine_splits(
                part_acc_ptr + first * HEAD_PAD,
                part_ml_ptr + first * 2,
                rel,
                num_splits,
                valid_c,
                HEAD_PAD,
                SPLIT_CHUNK,
                PARTIALS_F16,
            )
            sink_c = load_sinks(sinks_ptr, q_head_c, valid_c, has_sinks)
            out = finish_rows(m_c, l_c, acc_c, sink_c)
            store_rows(
                out, out_ptr, token_c, q_head_c, valid_c, stride_ot, stride_oh, HEAD_SIZE, HEAD_PAD
            )
            tl.store(counter, 0)


@triton.jit
def stored_partial(acc, l_i, PARTIALS_F16: tl.constexpr):
    """A partition's partial output as ``part_acc`` holds it: fp32 and unnormalised, or
    (``PARTIALS_F16``) normalised by the partition's sum and in fp16. A partition that saw no
    key of a row holds ``l = 0`` and ``acc = 0`` there, and stores 0."""
    if PARTIALS_F16:
        return (acc / tl.where(l_i > 0, l_i, 1.0)[:, None]).to(tl.float16)
    else:
        return acc


@triton.jit
def store_rows(
    out,
    out_ptr,
    token,
    q_head,
    row_valid,
    stride_ot,
    stride_oh,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    """Store the normalised rows as fp16 at ``out[token, q_head, :HEAD_SIZE]`` (valid rows
    only). The output pointers are formed here, after the combine, so they hold no registers
    while the partials are loaded."""
    offs_d = tl.arange(0, HEAD_PAD)
    o_ptrs = out_ptr + token[:, None].to(tl.int64) * stride_ot + q_head[:, None] * stride_oh
    mask = row_valid[:, None] & (offs_d[None, :] < HEAD_SIZE)
    tl.store(o_ptrs + offs_d[None, :], out.to(tl.float16), mask=mask)


@triton.jit
def program_rows(ROWS: tl.constexpr, chunk, kv_head, heads_per_prog, group, q_begin, q_len):
    """The first ``ROWS`` rows of a program: query token index ``t`` within the sequence, token,
    query head and whether the row is real (``row = t * heads_per_prog + g``)."""
    rows = tl.arange(0, ROWS)
    t = rows // heads_per_prog
    head_in_group = chunk * heads_per_prog + rows % heads_per_prog
    row_valid = (t < q_len) & (head_in_group < group)
    return t, q_begin + t, kv_head * group + head_in_group, row_valid


@triton.jit
def combine_splits(
    part_acc_ptr,
    part_ml_ptr,
    rows_base,
    num_splits,
    row_valid,
    HEAD_PAD: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    PARTIALS_F16: tl.constexpr,
):
    """Running max, sum and output of the rows over all partitions' partials (``PARTIALS_F16``:
    each normalised by its own sum, so weighed by it here).

    ``rows_base[r]`` is row ``r``'s first partial (partition 0), counted from the pointers.
    ``SPLIT_CHUNK`` partitions are loaded as one ``[rows, SPLIT_CHUNK, HEAD_PAD]`` tile (past
    L1), so their loads issue together: one L2 round trip per chunk, not one per partition
    (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#loop_forms).
    Rows come first so that each warp sums its own rows' partitions in registers, with no
    exchange between warps.

    Each chunk is folded in as one online-softmax step
    (maxima in base-2 units): ``M' = max(M, max_s m_s)``, ``L' = L e^(M - M') +
    sum_s l_s e^(m_s - M')``, likewise the output. Partitions that saw no key of a row hold
    ``m = NEG_BIG``, ``l = 0``, ``acc = 0`` and add nothing; the order of the sums is fixed by
    the compiled kernel, so the result is deterministic.
    """
    offs_s = tl.arange(0, SPLIT_CHUNK)
    offs_d = tl.arange(0, HEAD_PAD)
    m = tl.full(rows_base.shape, NEG_BIG, tl.float32)
    l_sum = tl.zeros(rows_base.shape, tl.float32)
    acc = tl.zeros([rows_base.shape[0], HEAD_PAD], tl.float32)
    for s0 in range(0, num_splits, SPLIT_CHUNK):
        split = s0 + offs_s
        ok = row_valid[:, None] & (split[None, :] < num_splits)
        row = rows_base[:, None] + split[None, :]
        m_s = tl.load(part_ml_ptr + row * 2, mask=ok, other=NEG_BIG, cache_modifier=".cg")
        l_s = tl.load(part_ml_ptr + row * 2 + 1, mask=ok, other=0.0, cache_modifier=".cg")
        acc_s = tl.load(
            part_acc_ptr + row[:, :, None] * HEAD_PAD + offs_d[None, None, :],
            mask=ok[:, :, None],
            other=0.0,
            cache_modifier=".cg",
        )
        m_new = tl.maximum(m, tl.max(m_s, 1))
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(m_s - m_new[:, None])
        # The products are rounded before the sum (the select keeps ptxas from fusing each into
        # the sum's first add): fused, a thread holding two partitions' sums computes
        # fma(l0, w0, l1 w1) and its replica fma(l1, w1, l0 w0), one bit apart, and both
        # write the row's normaliser to one shared address (racecheck WAW, 16-row combines).
        l_sum = l_sum * alpha + tl.sum(tl.where(ok, l_s * w, 0.0), 1)
        if PARTIALS_F16:
            acc_s = acc_s.to(tl.float32) * l_s[:, :, None]
        acc = acc * alpha[:, None] + tl.sum(acc_s * w[:, :, None], 1)
        m = m_new
    return m, l_sum, acc
