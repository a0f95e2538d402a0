"""Variable-length causal prefill over the paged cache (chunked prefill, prefix caching).

vLLM writes the new tokens' K and V into the paged cache before attention runs, so a prefill
chunk attends to ``seq_len`` cached keys: the cached prefix plus the chunk itself, causally. The
kernel therefore reads every key from the paged cache, which makes chunked prefill, prefix
caching and mixed prefill/decode batches one code path.

Rows of a program are ``query token x head`` as in decode (``row = t * heads_per_prog + g``),
``BLOCK_M // heads_per_prog`` query tokens of one sequence. Programs are numbered over all
sequences' query blocks without a host-side table: sequence ``b`` starts at program
``q_start[b] // block_q + b`` (an upper bound on the blocks before it), found by
:func:`sequence_of`; programs past a sequence's last block run no tile and store nothing.
Program ids are taken in reverse, so the last query blocks (the most keys, causally) start
first and the short ones fill in at the end of the grid instead of leaving a long tail.
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

#: Sequence starts :func:`sequence_of` loads at once (vLLM's default batch holds 256
#: sequences at most, so one load serves a whole batch).
SEQ_CHUNK = tl.constexpr(256)


@triton.jit
def sequence_of(pid, q_start_ptr, num_seqs, block_q):
    """The sequence program ``pid`` belongs to: the number of sequences ``b`` whose first
    program ``q_start[b] // block_q + b`` is at or before ``pid``, less one.

    The starts increase with ``b``, so this count is what a binary search would find; but a
    binary search makes ``log2(num_seqs)`` dependent loads, each an L2 round trip before the
    program can load its queries, while here the starts of up to :data:`SEQ_CHUNK` sequences
    come in one load. That matters because a 128-row prefill program holds a whole SM (206
    registers a thread at sm_90), so nothing hides its start: with 32 sequences of 512 tokens
    each program runs only a few key tiles after it.
    """
    count = 0
    for first in range(0, num_seqs, SEQ_CHUNK):
        b = first + tl.arange(0, SEQ_CHUNK)
        ok = b < num_seqs
        starts = tl.load(q_start_ptr + b, mask=ok, other=0) // block_q + b
        count += tl.sum((ok & (starts <= pid)).to(tl.int32), axis=0)
    return count - 1


@triton.jit(do_not_specialize=(*UNSPECIALIZED, "num_seqs"))
def paged_prefill_kernel(
    q_ptr,
    kv_ptr,
    bt_ptr,
    seq_lens_ptr,
    q_start_ptr,
    k_scale_ptr,
    v_scale_ptr,
    sinks_ptr,
    out_ptr,
    sm_scale,
    softcap,
    window,
    has_sinks,
    group,
    heads_per_prog,
    head_chunks,
    num_seqs,
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
    PAGE_SIZE: tl.constexpr,
    CACHE_OFFSETS_32: tl.constexpr,
):
    """Grid ``(num_tokens // block_q + num_seqs, num_kv_heads * head_chunks)``; ``PAGE_SIZE``
    and ``CACHE_OFFSETS_32`` as in :func:`volta_attn_v100.kernels.decode.paged_decode_kernel`."""
    if not CACHE_OFFSETS_32:
        stride_blk = stride_blk.to(tl.int64)
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_h = tl.program_id(1)
    kv_head = pid_h // head_chunks
    chunk = pid_h % head_chunks
    block_q = BLOCK_M // heads_per_prog

    seq = sequence_of(pid, q_start_ptr, num_seqs, block_q)
    q_begin = tl.load(q_start_ptr + seq)
    q_len = tl.load(q_start_ptr + seq + 1) - q_begin
    q_block = pid - (q_begin // block_q + seq)
    block_valid = q_block * block_q < q_len
    seq_len = tl.load(seq_lens_ptr + seq)
    rows = tl.arange(0, BLOCK_M)
    t = q_block * block_q + rows // heads_per_prog
    head_in_group = chunk * heads_per_prog + rows % heads_per_prog
    row_valid = block_valid & (t < q_len) & (head_in_group < group)
    q_head = kv_head * group + head_in_group
    token = q_begin + t
    context = seq_len - q_len
    q_abs = tl.where(row_valid, context + t, -1)

    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d[None, :] < HEAD_SIZE
    q_ptrs = q_ptr + token[:, None].to(tl.int64) * stride_qt + q_head[:, None] * stride_qh
    q = tl.load(q_ptrs + offs_d[None, :], mask=row_valid[:, None] & d_mask)

    if KV_FP8:
        k_scale = tl.load(k_scale_ptr + kv_head * scale_stride)
        v_scale = tl.load(v_scale_ptr + kv_head * scale_stride)
    else:
        k_scale = 1.0
        v_scale = 1.0

    last_key = tl.minimum(context + (q_block + 1) * block_q, seq_len)
    tile_lo = first_tile(context + q_block * block_q, window, BLOCK_N)
    tile_hi = tl.where(block_valid, tl.cdiv(last_key, BLOCK_N), tile_lo)

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
        kv_head * stride_kvh,
        stride_blk,
        stride_slot,
        PAGE_SIZE,
        q_abs,
        context + q_block * block_q,
        seq_len,
        tile_lo,
        tile_hi,
        sm_scale * k_scale,
        v_scale,
        softcap,
        window,
        0,
        stride_kvh,
        HEAD_SIZE,
        HEAD_PAD,
        BLOCK_N,
        KV_FP8,
        FP8_DECODE,
        HALVES,
        True,
    )

    out = finish_rows(m_i, l_i, acc, sink)
    o_ptrs = out_ptr + token[:, None].to(tl.int64) * stride_ot + q_head[:, None] * stride_oh
    tl.store(o_ptrs + offs_d[None, :], out.to(tl.float16), mask=row_valid[:, None] & d_mask)
