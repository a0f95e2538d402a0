"""e4m3fn codes to fp16 in integer arithmetic (SM70 has no FP8 conversion instruction).

e4m3fn (OCP FP8, "E4M3"): sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, and
``S.1111.111`` is NaN. fp16 has 5 exponent bits (bias 15) and 10 mantissa bits, so moving a
code's exponent and mantissa into an fp16's low bits (``(c & 0x7F) << 7``) and its sign to bit
15 gives an fp16 whose value is the code's times ``2**-8``:

* normal (``e > 0``): ``2**(e - 15) * (1 + m/8)`` = ``2**(e - 7) * (1 + m/8) * 2**-8``;
* subnormal (``e = 0``): the fp16 is subnormal too, ``m/8 * 2**-14`` = ``m * 2**-9 * 2**-8``.

Every e4m3 value times ``2**-8`` (from ``2**-17`` to ``448 * 2**-8``) is an fp16 value, so the
result is exact; :func:`e4m3_to_fp16` multiplies the ``2**8`` back (exact again, in fp32) and
returns NaN for the two NaN codes. The GEMV and GEMM kernels take :func:`e4m3_scaled_fp16` (or,
on codes read four to an int32 word, :func:`e4m3_words_scaled_fp16` and
:func:`e4m3_words_scaled_fp32`: the same values) and fold ``2**8`` into the block's scale, one
multiply per block instead of one per weight; the load checks refuse NaN codes
(:func:`volta_fp8w.layout.as_codes`), so both agree on every weight a layer holds. The scaled
decode never gives an infinity or NaN (its fp16 exponent field is at most 15), so a code read
past a layer's last input, times a zero activation, adds zero.
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_core.kernel_api import interpreting

# Four codes of one little-endian word to two fp16 pairs ``2**-8`` times theirs, the conversion
# above done on pairs: ``prmt`` moves codes 0 and 1 (then 2 and 3) into the high bytes of an
# fp16 pair, one ``and``/``shr`` puts exponent and mantissa at bits 7-13 of each half and one
# ``and``/``or`` keeps the sign at bit 15: ten instructions for four weights, where a code
# taken alone needs its own extraction, masks, shifts and or (PTX ISA: ``prmt``). The word is
# operand ``$4`` (after four outputs); ``r0`` holds codes 0 (low half) and 1, ``r1`` 2 and 3:
# the pairs of neighbouring inputs a dot operand's registers hold, so none is repacked.
_WORD_TO_PAIRS = """
.reg .b32 z, t0, t1, m0, m1, g0, g1, r0, r1;
mov.b32 z, 0;
prmt.b32 t0, $4, z, 0x1404;
prmt.b32 t1, $4, z, 0x3424;
and.b32 m0, t0, 0x7F007F00;
and.b32 m1, t1, 0x7F007F00;
shr.u32 m0, m0, 1;
shr.u32 m1, m1, 1;
and.b32 g0, t0, 0x80008000;
and.b32 g1, t1, 0x80008000;
or.b32 r0, m0, g0;
or.b32 r1, m1, g1;
"""

# The pairs as four fp32 values, ``cvt.f32.f16`` widening each half (the GEMV's FMA sums):
# outputs ``$0..$3`` are the values of bytes 0..3.
_WORD_TO_FP32 = tl.constexpr(
    "{\n"
    + _WORD_TO_PAIRS
    + """.reg .b16 h0, h1, h2, h3;
mov.b32 {h0, h1}, r0;
mov.b32 {h2, h3}, r1;
cvt.f32.f16 $0, h0;
cvt.f32.f16 $1, h1;
cvt.f32.f16 $2, h2;
cvt.f32.f16 $3, h3;
}"""
)

# The pairs as four fp16 values (the dot tiles' operands): outputs ``$0..$3`` are the values of
# bytes 0..3, each half moved out of its pair.
_WORD_TO_FP16 = tl.constexpr(
    "{\n"
    + _WORD_TO_PAIRS
    + """mov.b32 {$0, $1}, r0;
mov.b32 {$2, $3}, r1;
}"""
)

#: Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` when this module is
#: imported, as when its ``@triton.jit`` functions are built): it has no inline PTX, so there
#: the word decoders take each byte out of the word and run :func:`e4m3_scaled_fp16` on it
#: (the same values, so the interpreter checks the word tiles' loads and order).
INTERPRETED = tl.constexpr(interpreting())

#: What :func:`e4m3_scaled_fp16`'s values are multiplied by to give the codes' values.
E4M3_FOLD = 256.0


@triton.jit
def e4m3_scaled_fp16(codes):
    """uint8 e4m3fn codes to fp16 values ``2**-8`` times theirs (NaN codes not handled)."""
    c = codes.to(tl.uint16)
    bits = ((c & 0x7F) << 7) | ((c & 0x80) << 8)
    return bits.to(tl.float16, bitcast=True)


@triton.jit
def e4m3_words_scaled_fp16(words):
    """int32 words of four e4m3fn codes each (byte ``i`` the input ``4 * j + i``) to four fp16
    tensors of values ``2**-8`` times theirs, one per byte, exactly (NaN codes not handled)."""
    if INTERPRETED:
        return (
            e4m3_scaled_fp16(words & 0xFF),
            e4m3_scaled_fp16((words >> 8) & 0xFF),
            e4m3_scaled_fp16((words >> 16) & 0xFF),
            e4m3_scaled_fp16((words >> 24) & 0xFF),
        )
    else:
        return tl.inline_asm_elementwise(
            _WORD_TO_FP16,
            "=h,=h,=h,=h,r",
            [words],
            dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
            is_pure=True,
            pack=1,
        )


@triton.jit
def e4m3_words_scaled_fp32(words):
    """:func:`e4m3_words_scaled_fp16`'s four tensors in fp32 (the widening in the same PTX)."""
    if INTERPRETED:
        v0, v1, v2, v3 = e4m3_words_scaled_fp16(words)
        return v0.to(tl.float32), v1.to(tl.float32), v2.to(tl.float32), v3.to(tl.float32)
    else:
        return tl.inline_asm_elementwise(
            _WORD_TO_FP32,
            "=f,=f,=f,=f,r",
            [words],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )


@triton.jit
def e4m3_to_fp16(codes):
    """uint8 e4m3fn codes to their fp16 values, exactly, NaN codes included."""
    scaled = e4m3_scaled_fp16(codes).to(tl.float32) * 256.0
    nan = (codes.to(tl.uint16) & 0x7F) == 0x7F
    return tl.where(nan, float("nan"), scaled).to(tl.float16)
