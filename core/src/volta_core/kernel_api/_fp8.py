"""The FP8 KV-cache element codec, as Triton device functions: one implementation for every plugin.

The fp8kv plugin defines the cache format (``code = fp8(x * (1/scale))``; K scale applied after
Q·K, V scale on the probabilities) and the attention plugin writes that cache from inside vLLM's
backend; both encode and decode through these functions, so the codes a cache holds do not
depend on which plugin wrote them. Encoding and decoding are done in integer arithmetic on the
float32 bit pattern.

Why integers and not Triton's fp8 casts (docs/kernels.md#sm70-facts): ``fp8e4nv`` does not
compile below SM89,
Triton 3.9 breaks every cast to ``fp8e5`` on sm_70, Triton's own sm<80 e5m2 encoder rounds ties
away from zero, and the interpreter's fp8 conversions are wrong. Shifts, adds and compares
compile on every target and run the same in the interpreter, and the cache only ever holds
``uint8`` codes.

Encoding rounds to nearest, ties to even, exactly like ``torch`` converting float32 to
``float8_e5m2`` / ``float8_e4m3fn``, with one deliberate difference: it *saturates* (finite
values and infinities beyond the largest finite code become that code, as PTX ``satfinite``
does), where torch turns e5m2 overflow into infinity. NaN stays NaN (its sign survives in the
interpreter; GPUs canonicalise NaNs in float arithmetic, so there the sign is not kept).
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_core.kernel_api._fp8_codes import FP8_FORMAT_CODES

#: The e5m2 format's code (:data:`volta_core.kernel_api.FP8_FORMAT_CODES`); any other is e4m3.
E5M2: tl.constexpr = tl.constexpr(FP8_FORMAT_CODES["fp8_e5m2"])


@triton.jit
def encode_fp8(
    x,
    EXP_BIAS: tl.constexpr,
    MAN_BITS: tl.constexpr,
    MAX_CODE: tl.constexpr,
    SUBNORMAL_MAGIC: tl.constexpr,
):
    """float32 tensor -> uint8 FP8 codes (round to nearest even, saturating, NaN kept).

    ``SUBNORMAL_MAGIC`` is the power of two whose float32 ulp is the format's smallest
    subnormal (2**7 for e5m2, 2**14 for e4m3): adding it to a magnitude below the smallest
    normal rounds that magnitude to a whole number of subnormal steps, to nearest even, in
    one float addition, and the step count is the low bits of the sum.
    """
    bits = x.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    # Normal range: rebias the exponent and round the dropped mantissa bits to nearest even.
    drop: tl.constexpr = 23 - MAN_BITS
    rebased = mag - ((127 - EXP_BIAS) << 23)
    q_normal = (rebased + ((1 << (drop - 1)) - 1) + ((rebased >> drop) & 1)) >> drop
    # Subnormal range (and zero).
    magic_bits: tl.constexpr = (150 - EXP_BIAS + 1 - MAN_BITS) << 23
    q_sub = (mag.to(tl.float32, bitcast=True) + SUBNORMAL_MAGIC).to(tl.int32, bitcast=True)
    q_sub = q_sub - magic_bits
    is_normal = mag >= ((128 - EXP_BIAS) << 23)
    q = tl.minimum(tl.where(is_normal, q_normal, q_sub), MAX_CODE)
    q = tl.where(mag > 0x7F800000, 0x7F, q)
    return (q | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def decode_fp8(
    code,
    EXP_BIAS: tl.constexpr,
    MAN_BITS: tl.constexpr,
    E4M3FN: tl.constexpr,
    SUBNORMAL_UNIT: tl.constexpr,
):
    """uint8 FP8 codes -> float32 (exact: every FP8 value is a float32).

    ``SUBNORMAL_UNIT`` is the smallest subnormal, ``2**(1 - EXP_BIAS - MAN_BITS)``.
    """
    c = code.to(tl.int32)
    exp_mask: tl.constexpr = (1 << (7 - MAN_BITS)) - 1
    exponent = (c >> MAN_BITS) & exp_mask
    mantissa = c & ((1 << MAN_BITS) - 1)
    sign_bits = (c & 0x80) << 24
    normal_bits = ((exponent + (127 - EXP_BIAS)) << 23) | (mantissa << (23 - MAN_BITS))
    if E4M3FN:  # noqa: SIM108 (a constexpr branch, resolved at compile time)
        # e4m3fn has no infinities: only S.1111.111 is NaN.
        special = (c & 0x7F) == 0x7F
    else:
        special = exponent == exp_mask
    # Infinities keep a zero mantissa and NaNs a nonzero one.
    normal_bits = tl.where(special, 0x7F800000 | (mantissa << (23 - MAN_BITS)), normal_bits)
    subnormal_bits = (mantissa.to(tl.float32) * SUBNORMAL_UNIT).to(tl.int32, bitcast=True)
    # The sign goes in as a bit (negating would turn -0.0 into 0.0: Triton negates as 0 - x).
    bits = tl.where(exponent == 0, subnormal_bits, normal_bits) | sign_bits
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def quantize_tile(x, inv_scale, FMT: tl.constexpr):
    """Scale a float32 tile by the reciprocal scale (one rounding) and encode it to codes."""
    y = x * inv_scale
    if FMT == E5M2:
        return encode_fp8(y, 15, 2, 0x7B, 128.0)
    else:
        return encode_fp8(y, 7, 3, 0x7E, 16384.0)


@triton.jit
def dequantize_tile(code, scale, FMT: tl.constexpr):
    """Decode codes and multiply by the scale in float32 (one rounding, as in torch)."""
    if FMT == E5M2:
        # e5m2 is the high byte of an fp16: shift, reinterpret, widen (exact).
        as_fp16 = (code.to(tl.int32) << 8).to(tl.int16).to(tl.float16, bitcast=True)
        return as_fp16.to(tl.float32) * scale
    else:
        return decode_fp8(code, 7, 3, True, 0.001953125) * scale
