"""Cache write: new K/V tokens into the paged cache, quantized to FP8 or stored as fp16.

One program per (block of ``BLOCK_T`` tokens, KV head): it loads the tokens' slots once and
their K and V rows, multiplies by the head's reciprocal scale, encodes with the host's shared
codec (:mod:`volta_core.kernel_api`) and stores into the packed
``[.., head_size_k + head_size_v]`` entries. A scalar scale is read through a stride of 0, so
per-tensor and per-head scales run the same code. The reciprocal is IEEE division, once per
program: the same float32 as ``torch.reciprocal``, without a tensor made for it at every call.
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_core.kernel_api import quantize_tile


@triton.jit
def cache_write_kernel(
    key_ptr,
    value_ptr,
    cache_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
    num_tokens,
    num_slots,
    block_size,
    head_size_k,
    head_size_v,
    stride_key_t,
    stride_key_h,
    stride_value_t,
    stride_value_h,
    stride_cache_b,
    stride_cache_h,
    stride_cache_n,
    stride_scale,
    FMT: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    FULL: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    pid_t = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    tokens = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    in_batch = tokens < num_tokens
    slots = tl.load(slot_ptr + tokens, mask=in_batch, other=-1).to(tl.int64)
    # Negative slots are padding. Slots past the cache were refused by the host check; the
    # mask keeps memory safe if that check was switched off.
    valid = in_batch & (slots >= 0) & (slots < num_slots)
    dst = (
        (slots // block_size) * stride_cache_b
        + head * stride_cache_h
        + (slots % block_size) * stride_cache_n
    )
    dims = tl.arange(0, HEAD_PAD)
    rows = tokens.to(tl.int64)
    if FULL:
        # Head sizes equal HEAD_PAD: no mask along the head dim, so loads and stores vectorize.
        k_mask = valid[:, None]
        v_mask = valid[:, None]
    else:
        k_mask = valid[:, None] & (dims < head_size_k)[None, :]
        v_mask = valid[:, None] & (dims < head_size_v)[None, :]
    k = tl.load(
        key_ptr + (rows * stride_key_t + head * stride_key_h)[:, None] + dims[None, :],
        mask=k_mask,
        other=0.0,
    )
    v = tl.load(
        value_ptr + (rows * stride_value_t + head * stride_value_h)[:, None] + dims[None, :],
        mask=v_mask,
        other=0.0,
    )
    k_dst = cache_ptr + dst[:, None] + dims[None, :]
    v_dst = k_dst + head_size_k
    if FMT == 0:
        tl.store(k_dst, k.to(cache_ptr.dtype.element_ty), mask=k_mask)
        tl.store(v_dst, v.to(cache_ptr.dtype.element_ty), mask=v_mask)
    else:
        k_inv_scale = tl.math.div_rn(1.0, tl.load(k_scale_ptr + head * stride_scale))
        v_inv_scale = tl.math.div_rn(1.0, tl.load(v_scale_ptr + head * stride_scale))
        tl.store(k_dst, quantize_tile(k.to(tl.float32), k_inv_scale, FMT), mask=k_mask)
        tl.store(v_dst, quantize_tile(v.to(tl.float32), v_inv_scale, FMT), mask=v_mask)
