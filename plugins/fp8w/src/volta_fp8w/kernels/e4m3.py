"""e4m3fn codes to fp16 in integer arithmetic (SM70 has no FP8 conversion instruction).

e4m3fn (OCP FP8, "E4M3"): sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, and
``S.1111.111`` is NaN. fp16 has 5 exponent bits (bias 15) and 10 mantissa bits, so moving a
code's exponent and mantissa into an fp16's low bits (``(c & 0x7F) << 7``) and its sign to bit
15 gives an fp16 whose value is the code's times ``2**-8``:

* normal (``e > 0``): ``2**(e - 15) * (1 + m/8)`` = ``2**(e - 7) * (1 + m/8) * 2**-8``;
* subnormal (``e = 0``): the fp16 is subnormal too, ``m/8 * 2**-14`` = ``m * 2**-9 * 2**-8``.

Every e4m3 value times ``2**-8`` (from ``2**-17`` to ``448 * 2**-8``) is an fp16 value, so the
result is exact; :func:`e4m3_to_fp16` multiplies the ``2**8`` back (exact again, in fp32) and
returns NaN for the two NaN codes. The GEMV and GEMM kernels take :func:`e4m3_scaled_fp16` and
fold ``2**8`` into the block's scale, one multiply per block instead of one per weight; the load
checks refuse NaN codes (:func:`volta_fp8w.layout.as_codes`), so both agree on every weight a
layer holds.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: What :func:`e4m3_scaled_fp16`'s values are multiplied by to give the codes' values.
E4M3_FOLD = 256.0


@triton.jit
def e4m3_scaled_fp16(codes):
    """uint8 e4m3fn codes to fp16 values ``2**-8`` times theirs (NaN codes not handled)."""
    c = codes.to(tl.uint16)
    bits = ((c & 0x7F) << 7) | ((c & 0x80) << 8)
    return bits.to(tl.float16, bitcast=True)


@triton.jit
def e4m3_to_fp16(codes):
    """uint8 e4m3fn codes to their fp16 values, exactly, NaN codes included."""
    scaled = e4m3_scaled_fp16(codes).to(tl.float32) * 256.0
    nan = (codes.to(tl.uint16) & 0x7F) == 0x7F
    return tl.where(nan, float("nan"), scaled).to(tl.float16)
