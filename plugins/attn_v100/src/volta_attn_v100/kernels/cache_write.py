"""Writing new tokens' K and V into the paged cache (fp16, or fp8 e5m2 with scales).

The fp8 encoding follows the format the fp8kv plugin documents: ``code = e5m2(x / scale)``,
rounded to nearest even and saturated to the largest finite code (57344); NaN stays NaN. The
rounding is done in integer arithmetic on the fp16 bit pattern (e5m2 is the high byte of an
fp16): no fp8 conversion instruction, which SM70 lacks and the Triton interpreter gets wrong
(FACTS.md 2). ``x / scale`` is formed in float32 and rounded to fp16 first; with unit scales
(the e5m2 default) ``x`` is the fp16 activation itself and the result is the exact RNE code.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fp16_to_e5m2_bits(x):
    """RNE-saturating fp16 -> e5m2 on bit patterns; returns the codes as int32 (0..255)."""
    h = x.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    sign = (h >> 8) & 0x80
    mag = h & 0x7FFF
    rounded = (mag + 0x7F + ((mag >> 8) & 1)) >> 8
    code = tl.minimum(rounded, 0x7B)
    code = tl.where(mag > 0x7C00, 0x7E, code)
    return sign | code


@triton.jit
def cache_write_kernel(
    key_ptr,
    value_ptr,
    kv_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
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
    KV_FP8: tl.constexpr,
):
    """Grid ``(num_tokens, num_kv_heads)``. A negative slot is a padding token: nothing is
    written for it."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    offs = tl.arange(0, HEAD_PAD)
    mask = (offs < HEAD_SIZE) & (slot >= 0)
    k = tl.load(key_ptr + token * stride_kt + head * stride_kh + offs, mask=mask, other=0.0)
    v = tl.load(value_ptr + token * stride_vt + head * stride_vh + offs, mask=mask, other=0.0)
    block = tl.where(slot >= 0, slot, 0) // page_size
    dst = kv_ptr + block * stride_blk + head * stride_kvh + (slot % page_size) * stride_slot + offs
    if KV_FP8:
        k_scale = tl.load(k_scale_ptr + head * scale_stride)
        v_scale = tl.load(v_scale_ptr + head * scale_stride)
        tl.store(dst, fp16_to_e5m2_bits(k.to(tl.float32) / k_scale).to(tl.uint8), mask=mask)
        tl.store(
            dst + HEAD_SIZE,
            fp16_to_e5m2_bits(v.to(tl.float32) / v_scale).to(tl.uint8),
            mask=mask,
        )
    else:
        tl.store(dst, k.to(tl.float16), mask=mask)
        tl.store(dst + HEAD_SIZE, v.to(tl.float16), mask=mask)
