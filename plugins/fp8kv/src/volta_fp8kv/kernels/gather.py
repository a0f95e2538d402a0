"""Gather/dequantize: the paged cache of given sequences into contiguous fp16 K and V.

Used for long prefill on SM70 (decoding e5m2 into an fp16 workspace once is cheaper than
decoding per attention tile) and for verification. One program per (sequence, block of
``BLOCK_T`` positions, KV head); programs past a sequence's length return at once. Output rows
of sequence ``i`` start at ``cu_seqlens[i]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_core.kernel_api import dequantize_tile


# The cache's block count, the block table's row stride and the scales' stride (0 per tensor,
# 1 per KV head) only bound and index (block-table entries, one scale a program), and are 1, a
# multiple of 16 or neither by cache and batch: not specialized, so one build serves them all,
# as the gate and warmup declare it (at sm_70 each class holds the same registers).
@triton.jit(do_not_specialize=["num_blocks", "stride_table_s", "stride_scale"])
def gather_kernel(
    cache_ptr,
    key_out_ptr,
    value_out_ptr,
    block_table_ptr,
    seq_lens_ptr,
    cu_seqlens_ptr,
    k_scale_ptr,
    v_scale_ptr,
    num_blocks,
    block_size,
    head_size_k,
    head_size_v,
    stride_table_s,
    stride_cache_b,
    stride_cache_h,
    stride_cache_n,
    stride_key_out_t,
    stride_key_out_h,
    stride_value_out_t,
    stride_value_out_h,
    stride_scale,
    FMT: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    FULL: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    seq = tl.program_id(0)
    start = tl.program_id(1) * BLOCK_T
    head = tl.program_id(2).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    if start >= seq_len:
        return
    positions = start + tl.arange(0, BLOCK_T)
    in_seq = positions < seq_len
    blocks = tl.load(
        block_table_ptr + seq.to(tl.int64) * stride_table_s + positions // block_size,
        mask=in_seq,
        other=0,
    ).to(tl.int64)
    # Entries outside the cache were refused by the host check; the mask keeps memory safe if
    # that check was switched off.
    in_seq = in_seq & (blocks >= 0) & (blocks < num_blocks)
    src = (
        blocks * stride_cache_b + head * stride_cache_h + (positions % block_size) * stride_cache_n
    )
    rows = (tl.load(cu_seqlens_ptr + seq) + positions).to(tl.int64)
    dims = tl.arange(0, HEAD_PAD)
    if FULL:
        # Head sizes equal HEAD_PAD: no mask along the head dim, so loads and stores vectorize.
        k_mask = in_seq[:, None]
        v_mask = in_seq[:, None]
    else:
        k_mask = in_seq[:, None] & (dims < head_size_k)[None, :]
        v_mask = in_seq[:, None] & (dims < head_size_v)[None, :]
    k_raw = tl.load(cache_ptr + src[:, None] + dims[None, :], mask=k_mask, other=0)
    v_raw = tl.load(cache_ptr + src[:, None] + head_size_k + dims[None, :], mask=v_mask, other=0)
    k_dst = (
        key_out_ptr + (rows * stride_key_out_t + head * stride_key_out_h)[:, None] + dims[None, :]
    )
    v_dst = (
        value_out_ptr
        + (rows * stride_value_out_t + head * stride_value_out_h)[:, None]
        + dims[None, :]
    )
    if FMT == 0:
        k_val = k_raw
        v_val = v_raw
    else:
        k_val = dequantize_tile(k_raw, tl.load(k_scale_ptr + head * stride_scale), FMT)
        v_val = dequantize_tile(v_raw, tl.load(v_scale_ptr + head * stride_scale), FMT)
    tl.store(k_dst, k_val.to(key_out_ptr.dtype.element_ty), mask=k_mask)
    tl.store(v_dst, v_val.to(value_out_ptr.dtype.element_ty), mask=v_mask)
