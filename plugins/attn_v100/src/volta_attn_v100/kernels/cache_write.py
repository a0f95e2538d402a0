"""Writing new tokens' K and V into the paged cache (fp16, or fp8 e5m2 / e4m3 with scales).

The fp8 codes are the fp8kv plugin's format, ``code = fp8(x * (1/scale))`` rounded once to
nearest even from float32 and saturated (57344 for e5m2, 448 for e4m3), produced by the host's
shared codec (:mod:`volta_core.kernel_api`) so this cache holds exactly what the fp8kv kernels
would write.
The reciprocal scales are formed by the caller in IEEE float32. No fp8 conversion instruction is
used: SM70 lacks one and the Triton interpreter gets them wrong (docs/kernels.md#sm70-facts).
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_core.kernel_api import quantize_tile


@triton.jit
def cache_write_kernel(
    key_ptr,
    value_ptr,
    kv_ptr,
    slot_ptr,
    k_inv_scale_ptr,
    v_inv_scale_ptr,
    scale_stride,
    page_size,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_blk,
    stride_kvh,
    stride_slot,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    KV_FORMAT: tl.constexpr,
):
    """Grid ``(num_tokens, num_kv_heads)``. A negative slot is a padding token: nothing is
    written for it. ``KV_FORMAT``: 0 copies fp16, else the codec's ``FMT`` (1 e5m2, 2 e4m3;
    :data:`volta_attn_v100.configs.KV_FORMAT_CODES`)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    offs = tl.arange(0, HEAD_PAD)
    mask = (offs < HEAD_SIZE) & (slot >= 0)
    k = tl.load(key_ptr + token * stride_kt + head * stride_kh + offs, mask=mask, other=0.0)
    v = tl.load(value_ptr + token * stride_vt + head * stride_vh + offs, mask=mask, other=0.0)
    block = tl.where(slot >= 0, slot, 0) // page_size
    dst = kv_ptr + block * stride_blk + head * stride_kvh + (slot % page_size) * stride_slot + offs
    if KV_FORMAT != 0:
        k_inv_scale = tl.load(k_inv_scale_ptr + head * scale_stride)
        v_inv_scale = tl.load(v_inv_scale_ptr + head * scale_stride)
        tl.store(dst, quantize_tile(k.to(tl.float32), k_inv_scale, KV_FORMAT), mask=mask)
        tl.store(
            dst + HEAD_SIZE, quantize_tile(v.to(tl.float32), v_inv_scale, KV_FORMAT), mask=mask
        )
    else:
        tl.store(dst, k.to(tl.float16), mask=mask)
        tl.store(dst + HEAD_SIZE, v.to(tl.float16), mask=mask)
