"""Packed words to values: the word-tile loads, the integer-to-float conversions every kernel
uses, and :func:`wna16_dequant_kernel`, which writes ``dequant(W).T`` for cuBLAS.

Integers become floats without the int-to-float unit: ``q | 0x4B000000`` read as fp32 is
``2**23 + q`` exactly (``q | 0x6400`` as fp16 is ``1024 + q``), so subtracting ``2**23 + z``
(``1024 + z``) gives ``q - z`` exactly; the bit trick of vLLM's Marlin dequantization
(``csrc/quantization/marlin/dequant.h``, after NVIDIA FasterTransformer's
``interleaved_numeric_conversion.h``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.constexpr_function
def slot_shift(bits: int, j: int, in_place: bool) -> int:
    """How far :func:`slot_q16` shifts a word right for value ``j`` of a ``bits``-bit word,
    before taking the 16-bit half the value is in: ``in_place``, by whole bytes only, so far
    that the value lies within bits 0..9 of its half (0 for values 0 and 1 of a 4-bit half,
    else 8); otherwise to bit 0 of its half."""
    i = j % (16 // bits)
    return bits * i // 8 * 8 if in_place else bits * i


@triton.constexpr_function
def in_place(has_zp: bool, group_tile: bool) -> bool:
    """Whether :func:`slot_q16` leaves values in place: where the tile's zero point is one
    row (or the symmetric constant). With a zero point per word row, the two subtraction
    constants in-place values need per row (``1024 + z``, ``64 + z``) cost more packing on
    the sm_90 dot tile than the shifts they save
    (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#in_place)."""
    return group_tile or not has_zp


@triton.jit
def slot_q16(t, z, j: tl.constexpr, BITS: tl.constexpr, IN_PLACE: tl.constexpr, TINY: tl.constexpr):
    """``q - z`` in fp16 (exact) for value ``j`` of every word of ``t`` (``z`` fp32); with
    ``TINY``, ``(q - z) * 2**-24`` (exact: an fp16 subnormal).

    After :func:`slot_shift` the value is the field at offset ``o`` of one of the word's
    16-bit halves. The compiler packs two values (two word rows, or the two halves of one
    word) into one register with one PRMT, which takes either half of a word for free, and
    then works on the pair at once; so in place, a 4-bit word needs one 8-bit shift for its
    eight values. ``IN_PLACE`` off (:func:`in_place`): every value is shifted to bit 0.

    Without ``TINY`` an AND with the field and an OR of the fp16 exponent of ``2**(10 - o)``
    make the half read as ``2**(10 - o) + q`` exactly (the field is the low end of the
    mantissa, bits ``o .. o + bits - 1 <= 9``), and one subtraction of ``2**(10 - o) + z``
    gives ``q - z``. With ``TINY`` the AND alone leaves the subnormal ``q * 2**(o - 24)``,
    and one fused multiply-add by ``2**-o`` and of ``-z * 2**-24`` gives ``(q - z) * 2**-24``:
    one instruction fewer per pair of values (the AND and the OR are two LOP3s: a LOP3 has
    room for one immediate). The caller multiplies by ``2**24`` after the dot, in fp32.
    """
    OFF: tl.constexpr = BITS * (j % (16 // BITS)) - slot_shift(BITS, j, IN_PLACE)
    HI: tl.constexpr = 16 * (j // (16 // BITS))
    w = t
    if slot_shift(BITS, j, IN_PLACE):
        w = t >> slot_shift(BITS, j, IN_PLACE)
    if TINY:
        f = w & (((1 << BITS) - 1) << (OFF + HI))
    else:
        f = (w & (((1 << BITS) - 1) << (OFF + HI))) | (((25 - OFF) << 10) << HI)
    if HI:
        f = f >> HI
    v = f.to(tl.uint16).to(tl.float16, bitcast=True)
    if TINY:
        return v * (1.0 / (1 << OFF)) - (z * (1.0 / (1 << 24))).to(tl.float16)
    return v - (z + (1 << (10 - OFF))).to(tl.float16)


@triton.jit
def _slot_f16(t, z, s16, j: tl.constexpr, BITS: tl.constexpr, IN_PLACE: tl.constexpr):
    """``(q - z) * s`` in fp16 for value ``j`` of every word of ``t`` (:func:`slot_q16`)."""
    return slot_q16(t, z, j, BITS, IN_PLACE, False) * s16


@triton.jit
def slot_f32(t, c32, j: tl.constexpr, BITS: tl.constexpr):
    """``q - z`` in fp32 (exact) for value ``j`` of every word of ``t``."""
    q = ((t >> (BITS * j)) & ((1 << BITS) - 1)) | 0x4B000000
    return q.to(tl.float32, bitcast=True) - c32


@triton.jit
def load_in_layer(ptrs, ok, WHOLE: tl.constexpr):
    """``ptrs`` loaded where ``ok`` (zero elsewhere), or all of them, unmasked, with ``WHOLE``:
    a masked load costs compares and selects per copy, which a tile inside the layer does not
    need (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run16)."""
    if WHOLE:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=ok, other=0)


@triton.jit
def load_words(
    w_ptr,
    s_ptr,
    z_ptr,
    k0,
    rn,
    n_ok,
    N,
    KW,
    GROUP,
    BKP: tl.constexpr,
    PACK: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BITS: tl.constexpr,
    GROUP_TILE: tl.constexpr,
    WHOLE: tl.constexpr = False,
):
    """Words ``[BKP, BLOCK_N]`` from input element ``k0`` on, with their scales and zero points.

    With ``GROUP_TILE`` (the tile lies inside one group) scales and zero points are one row
    ``[1, BLOCK_N]``, loaded and converted once, instead of one row per word row: fewer loads
    and registers, most for the asymmetric zero points. Their values on word rows past the
    input end do not matter: those words and activations are loaded as zero. ``WHOLE``: the
    tile lies inside the layer (:func:`volta_ct_wna16.launch.whole_tiles`), so no load is
    masked.
    """
    rkp = tl.arange(0, BKP)
    kp = k0 // PACK + rkp
    ok = (kp[:, None] < KW) & n_ok[None, :]
    # Unsigned, so shifts are logical and need no sign handling.
    t = load_in_layer(w_ptr + kp[:, None] * N + rn[None, :], ok, WHOLE).to(tl.uint32, bitcast=True)
    if GROUP_TILE:
        g1 = k0 // GROUP
        s = load_in_layer(s_ptr + g1 * N + rn, n_ok, WHOLE)[None, :]
        if HAS_ZP:
            z = load_in_layer(z_ptr + g1 * N + rn, n_ok, WHOLE).to(tl.float32)[None, :]
        else:
            z = tl.full([1, 1], 1 << (BITS - 1), tl.float32)
    else:
        g = (k0 + rkp * PACK) // GROUP
        s = load_in_layer(s_ptr + g[:, None] * N + rn[None, :], ok, WHOLE)
        if HAS_ZP:
            z = load_in_layer(z_ptr + g[:, None] * N + rn[None, :], ok, WHOLE).to(tl.float32)
        else:
            z = tl.full([BKP, 1], 1 << (BITS - 1), tl.float32)
    return t, s, z


@triton.jit
def _join4(
    t,
    z,
    s,
    A: tl.constexpr,
    B: tl.constexpr,
    C: tl.constexpr,
    D: tl.constexpr,
    BITS: tl.constexpr,
    IN_PLACE: tl.constexpr,
):
    """Slots ``A, B, C, D`` of every word, dequantized and joined on two new last axes as
    ``((A, B), (C, D))``: the order :func:`dequant_block` flattens back into input order."""
    return tl.join(
        tl.join(_slot_f16(t, z, s, A, BITS, IN_PLACE), _slot_f16(t, z, s, B, BITS, IN_PLACE)),
        tl.join(_slot_f16(t, z, s, C, BITS, IN_PLACE), _slot_f16(t, z, s, D, BITS, IN_PLACE)),
    )


@triton.jit
def dequant_block(
    w_ptr,
    s_ptr,
    z_ptr,
    k0,
    rn,
    n_ok,
    N,
    KW,
    GROUP,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_TILE: tl.constexpr,
):
    """``dequant(W).T[k0 : k0 + BLOCK_K, rn]`` as fp16, in input order."""
    PACK: tl.constexpr = 32 // BITS
    BKP: tl.constexpr = BLOCK_K // PACK
    t, s, z = load_words(
        w_ptr, s_ptr, z_ptr, k0, rn, n_ok, N, KW, GROUP, BKP, PACK, HAS_ZP, BITS, GROUP_TILE
    )
    # Slots j of each word, joined so that the last axis is j, then moved next to the word axis:
    # flattening (word, j) gives the input index pack * word + j.
    IN_PLACE: tl.constexpr = in_place(HAS_ZP, GROUP_TILE)
    if BITS == 4:
        w = tl.join(
            _join4(t, z, s, 0, 4, 2, 6, BITS, IN_PLACE), _join4(t, z, s, 1, 5, 3, 7, BITS, IN_PLACE)
        )
    else:
        w = _join4(t, z, s, 0, 2, 1, 3, BITS, IN_PLACE)
    w = tl.reshape(w, (BKP, BLOCK_N, PACK))
    return tl.reshape(tl.permute(w, (0, 2, 1)), (BLOCK_K, BLOCK_N))


@triton.jit
def wna16_dequant_kernel(
    w_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    N,
    K,
    KW,
    GROUP,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``out[k, n] = (q[k, n] - z[k // GROUP, n]) * s[k // GROUP, n]``: ``dequant(W).T`` as a
    dense ``[K, N]`` matrix in the output's dtype, one ``[BLOCK_K, BLOCK_N]`` tile a program.

    ``q`` is value ``k % pack`` of word ``[k // pack, n]`` (the layout of
    :mod:`volta_ct_wna16.kernels`), ``z`` the stored zero point or ``2**(BITS - 1)`` without
    ``HAS_ZP``: compressed-tensors' ``pack-quantized`` format as its
    ``PackedQuantizationCompressor`` decompresses it. The prefill path hands the matrix to
    cuBLAS (``torch.matmul``), which has the V100's tensor cores.
    """
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    kk = k0 + tl.arange(0, BLOCK_K)
    n_ok = rn < N
    w = dequant_block(
        w_ptr, s_ptr, z_ptr, k0, rn, n_ok, N, KW, GROUP, BITS, HAS_ZP, BLOCK_K, BLOCK_N, False
    )
    tl.store(
        out_ptr + kk[:, None] * N + rn[None, :],
        w.to(out_ptr.dtype.element_ty),
        mask=(kk[:, None] < K) & n_ok[None, :],
    )
