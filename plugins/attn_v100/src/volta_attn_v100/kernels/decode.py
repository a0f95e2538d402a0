"""Split-KV paged decode: each sequence's context is partitioned across programs, then reduced.

Decode reads the whole KV context of every sequence for one or a few query tokens, so it is
bound by memory bandwidth. One KV head per program and all its query heads (GQA) as rows means
each KV tile is read once per head group. With few sequences the grid would leave most SMs idle,
so the context is split into ``num_splits`` partitions, each producing an unnormalised partial
result (``acc``, running max ``m``, sum ``l``); :func:`split_reduce_kernel` combines them (and
the attention sinks) into the output.

Rows of a program are ``query token x head``: ``row = t * heads_per_prog + g``. Up to
``BLOCK_M // heads_per_prog`` query tokens per sequence are handled, which covers speculative
verification (2..8 tokens per sequence, causal among themselves).
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_attn_v100.kernels.common import LOG2E, NEG_BIG, attend, first_tile


@triton.jit
def paged_decode_kernel(
    q_ptr,
    kv_ptr,
    bt_ptr,
    seq_lens_ptr,
    q_start_ptr,
    k_scale_ptr,
    v_scale_ptr,
    part_acc_ptr,
    part_ml_ptr,
    sm_scale,
    softcap,
    window,
    group,
    heads_per_prog,
    head_chunks,
    num_q_heads,
    page_size,
    num_splits,
    scale_stride,
    stride_qt,
    stride_qh,
    stride_blk,
    stride_kvh,
    stride_slot,
    stride_bt,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_FP8: tl.constexpr,
    NATIVE_FP8: tl.constexpr,
):
    """Grid ``(num_seqs, num_kv_heads * head_chunks, num_splits)``.

    Partial results go to ``part_acc[token, q_head, split, :HEAD_PAD]`` and
    ``part_ml[token, q_head, split, 0:2]`` (max in base-2 units, sum), both float32 and
    contiguous.
    """
    seq = tl.program_id(0)
    pid_h = tl.program_id(1)
    split = tl.program_id(2)
    kv_head = pid_h // head_chunks
    chunk = pid_h % head_chunks

    q_begin = tl.load(q_start_ptr + seq)
    q_len = tl.load(q_start_ptr + seq + 1) - q_begin
    seq_len = tl.load(seq_lens_ptr + seq)

    rows = tl.arange(0, BLOCK_M)
    t = rows // heads_per_prog
    head_in_group = chunk * heads_per_prog + rows % heads_per_prog
    row_valid = (t < q_len) & (head_in_group < group)
    q_head = kv_head * group + head_in_group
    token = q_begin + t
    q_abs = tl.where(row_valid, seq_len - q_len + t, -1)

    offs_d = tl.arange(0, HEAD_PAD)
    q_ptrs = q_ptr + token[:, None].to(tl.int64) * stride_qt + q_head[:, None] * stride_qh
    q = tl.load(q_ptrs + offs_d[None, :], mask=row_valid[:, None] & (offs_d[None, :] < HEAD_SIZE))

    if KV_FP8:
        k_scale = tl.load(k_scale_ptr + kv_head * scale_stride)
        v_scale = tl.load(v_scale_ptr + kv_head * scale_stride)
    else:
        k_scale = 1.0
        v_scale = 1.0

    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    lo = first_tile(seq_len - q_len, window, BLOCK_N)
    per_split = tl.cdiv(num_tiles - lo, num_splits)
    tile_lo = lo + split * per_split
    tile_hi = tl.minimum(tile_lo + per_split, num_tiles)

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
        kv_head * stride_kvh,
        stride_blk,
        stride_slot,
        page_size,
        q_abs,
        seq_len - q_len,
        seq_len,
        tile_lo,
        tile_hi,
        sm_scale * k_scale,
        v_scale,
        softcap,
        window,
        HEAD_SIZE,
        HEAD_PAD,
        BLOCK_N,
        KV_FP8,
        NATIVE_FP8,
    )

    part_row = (token.to(tl.int64) * num_q_heads + q_head) * num_splits + split
    tl.store(
        part_acc_ptr + part_row[:, None] * HEAD_PAD + offs_d[None, :],
        acc,
        mask=row_valid[:, None],
    )
    tl.store(part_ml_ptr + part_row * 2, m_i, mask=row_valid)
    tl.store(part_ml_ptr + part_row * 2 + 1, l_i, mask=row_valid)


@triton.jit
def split_reduce_kernel(
    part_acc_ptr,
    part_ml_ptr,
    sinks_ptr,
    out_ptr,
    q_start_ptr,
    num_seqs,
    num_q_heads,
    num_splits,
    has_sinks,
    stride_ot,
    stride_oh,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
):
    """Grid ``(num_tokens, num_q_heads)``: combine the partitions of one query row.

    Rows past the last sequence's tokens (``q_start[num_seqs]``: padding in CUDA-graph
    batches) have no partials and are left untouched.

    With sinks, the sink logit joins the softmax denominator (it attends to no value):
    ``out = sum_i acc_i e^(m_i - M) / (sum_i l_i e^(m_i - M) + e^(sink - M))``, computed in the
    partials' base-2 units (the sink is multiplied by ``LOG2E``). Without sinks the sink reads
    as ``NEG_BIG``, whose term is exactly zero.
    """
    token = tl.program_id(0)
    head = tl.program_id(1)
    token_valid = token < tl.load(q_start_ptr + num_seqs)
    splits = tl.arange(0, MAX_SPLITS)
    s_mask = (splits < num_splits) & token_valid
    base = (token.to(tl.int64) * num_q_heads + head) * num_splits
    m = tl.load(part_ml_ptr + (base + splits) * 2, mask=s_mask, other=NEG_BIG)
    l_part = tl.load(part_ml_ptr + (base + splits) * 2 + 1, mask=s_mask, other=0.0)
    sink = tl.load(sinks_ptr + head, mask=has_sinks > 0, other=NEG_BIG).to(tl.float32) * LOG2E
    m_max = tl.maximum(tl.max(m, 0), sink)
    w = tl.exp2(m - m_max)
    denom = tl.sum(l_part * w, 0) + tl.exp2(sink - m_max)
    offs_d = tl.arange(0, HEAD_PAD)
    acc = tl.load(
        part_acc_ptr + (base + splits)[:, None] * HEAD_PAD + offs_d[None, :],
        mask=s_mask[:, None],
        other=0.0,
    )
    out = tl.sum(acc * w[:, None], 0) / tl.where(denom > 0, denom, 1.0)
    o_ptrs = out_ptr + token.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    tl.store(o_ptrs, out.to(tl.float16), mask=(offs_d < HEAD_SIZE) & token_valid)
