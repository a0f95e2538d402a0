"""The 1-token GEMV's sub-tile: 32 inputs of a ``BLOCK_N`` column strip, one fp32 FMA per weight.

Used by :func:`volta_ct_wna16.kernels.splitk.wna16_splitk_kernel` with ``BLOCK_M == 1`` and no
``USE_DOT``: the activations are loaded once per iteration as ``[rows, pack, subs]``
(:func:`x_tile`), taken apart per sub-tile (:func:`sub_tile`) and per word slot, and each weight
costs one AND-OR, one subtraction and one FMA (:func:`gemv_sub`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_ct_wna16.kernels.dequant import load_in_layer

#: Input elements per GEMV sub-tile: every group size (32, 64, 128, or the whole input) is a
#: multiple, so one scale (and zero point) row serves the whole sub-tile.
GEMV_SUB = tl.constexpr(32)


@triton.constexpr_function
def high_shift(bits: int) -> int:
    """How far the GEMV shifts the copy of each word that the fields reaching bit 23 (the fp32
    exponent) are taken from: half a field short of the first such field, so that none sits at
    bit 0 of the copy (a shift and mask to bit 0 compiles to a bit-field extract, which the OR
    of the exponent then no longer fuses with)."""
    return bits * (23 // bits) - bits // 2


@triton.constexpr_function
def field_shift(bits: int, j: int) -> int:
    """The shift of the word copy field ``j`` of a ``bits``-bit word is taken from by the GEMV:
    0 (the word itself) for fields that end below bit 23, else :func:`high_shift`."""
    return 0 if bits * (j + 1) <= 23 else high_shift(bits)


@triton.jit
def _slot_minus(w, live, OFF: tl.constexpr, MASK: tl.constexpr, ZC: tl.constexpr):
    """``q - ZC`` in fp32 for the field ``MASK << OFF`` (below bit 23) of every word of ``w``.

    The field with the fp32 exponent ``150 - OFF`` over it reads as ``2**(23 - OFF) + q``
    exactly (the field is the low end of the mantissa at that exponent), so one subtraction of
    the constant ``2**(23 - OFF) + ZC`` gives ``q - ZC`` exactly, for any slot, with no shift.
    ``live`` is 1, but not to the compiler: the exponent is ORed in from a register, so the AND
    and the OR are one three-input LOP3 (with two immediates they would be two).
    """
    f = ((w & (MASK << OFF)) | (live * ((150 - OFF) << 23))).to(tl.float32, bitcast=True)
    return f - ((1 << (23 - OFF)) + ZC)


@triton.jit
def x_tile(x_ptr, k0, k_end, PACK: tl.constexpr, SUBS: tl.constexpr, WHOLE: tl.constexpr):
    """The ``32 * SUBS`` activations from ``k0`` (zero from ``k_end`` on) as ``[rows, PACK, SUBS]``:
    element ``[r, j, s]`` is input ``k0 + 32 * s + PACK * r + j``, so that :func:`sub_tile`
    takes the sub-tiles apart along the last axis. ``WHOLE``: all before ``k_end``, unmasked."""
    ROWS: tl.constexpr = GEMV_SUB // PACK
    kk = (
        k0
        + tl.arange(0, ROWS)[:, None, None] * PACK
        + tl.arange(0, PACK)[None, :, None]
        + tl.arange(0, SUBS)[None, None, :] * GEMV_SUB
    )
    return load_in_layer(x_ptr + kk, kk < k_end, WHOLE)


@triton.jit
def sub_tile(x, SUB: tl.constexpr, SUBS: tl.constexpr):
    """Sub-tile ``SUB`` (``[rows, pack]``) of an :func:`x_tile` of ``SUBS`` sub-tiles: the
    last axis halved by ``tl.split`` once per bit of ``SUB`` (``SUBS`` a power of two)."""
    for level in tl.static_range(8):
        if (SUBS >> level) > 1:
            lo, hi = tl.split(tl.reshape(x, (x.shape[0], x.shape[1], SUBS >> (level + 1), 2)))
            x = hi if (SUB >> level) & 1 else lo
    return tl.reshape(x, (x.shape[0], x.shape[1]))


@triton.jit
def _columns(x, ROWS: tl.constexpr, PACK: tl.constexpr):
    """The ``[ROWS, PACK]`` activations of a sub-tile as fp32, one ``[ROWS]`` column per word
    slot: column ``j`` holds input ``PACK * r + j`` of word row ``r``."""
    x = x.to(tl.float32)
    if PACK == 8:
        a, b = tl.split(tl.reshape(x, (ROWS, 4, 2)))
        a0, a1 = tl.split(tl.reshape(a, (ROWS, 2, 2)))
        b0, b1 = tl.split(tl.reshape(b, (ROWS, 2, 2)))
        c0, c4 = tl.split(a0)
        c2, c6 = tl.split(a1)
        c1, c5 = tl.split(b0)
        c3, c7 = tl.split(b1)
        return (c0, c1, c2, c3, c4, c5, c6, c7)
    else:
        a, b = tl.split(tl.reshape(x, (ROWS, 2, 2)))
        c0, c2 = tl.split(a)
        c1, c3 = tl.split(b)
        return (c0, c1, c2, c3)


@triton.jit
def _zero_points(z):
    """Loaded zero points as fp32: fp16 rows converted, uint8 ones (``PackedWeights.zeros8``)
    by ORing the fp32 exponent of ``2^23`` in and subtracting it, one logical op and one
    add instead of an int-to-float conversion (a quarter-rate instruction)."""
    if z.dtype == tl.uint8:
        return (z.to(tl.uint32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return z.to(tl.float32)


@triton.jit
def gemv_sub(
    x,
    w_ptr,
    s_ptr,
    z_ptr,
    kb,
    k_end,
    rn,
    n_ok,
    N,
    KW,
    GROUP,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    WHOLE: tl.constexpr,
):
    """``s * sum_j x_j * (q_j - z)`` per word row of the 32 inputs from ``kb``: ``[rows, BLOCK_N]``.

    Per weight one AND-OR, one subtraction and one fp32 FMA (:func:`_slot_minus`), and per
    word one shift (:func:`field_shift`). Symmetric weights subtract the zero point in the
    subtraction's constant; asymmetric ones once per word row as ``z * sum_j x_j``. The scale
    is applied once per word row.
    """
    PACK: tl.constexpr = 32 // BITS
    ROWS: tl.constexpr = GEMV_SUB // PACK
    MASK: tl.constexpr = (1 << BITS) - 1
    rkp = tl.arange(0, ROWS)
    kp = kb // PACK + rkp
    t = load_in_layer(
        w_ptr + kp[:, None] * N + rn[None, :], (kp[:, None] < KW) & n_ok[None, :], WHOLE
    )
    # Unsigned: the shift is logical, so the copy needs no mask beyond each field's.
    t = t.to(tl.uint32, bitcast=True)
    hi = t >> high_shift(BITS)
    # From the word count, which no caller's loop runs to: a loop to N lets the compiler prove
    # N >= 0 and fold ``live`` (then the AND and the OR take two LOP3s).
    live = (KW >= 0).to(tl.uint32)
    in_split = kb < k_end
    g = kb // GROUP
    s = load_in_layer(s_ptr + g * N + rn, n_ok & in_split, WHOLE).to(tl.float32)
    if HAS_ZP:
        ZC: tl.constexpr = 0
    else:
        ZC: tl.constexpr = 1 << (BITS - 1)
    xc = _columns(x, ROWS, PACK)
    part = tl.zeros([ROWS, t.shape[1]], dtype=tl.float32)
    xsum = tl.zeros([ROWS], dtype=tl.float32)
    for j in tl.static_range(PACK):
        xj = xc[j]
        if HAS_ZP:
            xsum += xj
        if field_shift(BITS, j) == 0:
            part += xj[:, None] * _slot_minus(t, live, BITS * j, MASK, ZC)
        else:
            part += xj[:, None] * _slot_minus(hi, live, BITS * j - field_shift(BITS, j), MASK, ZC)
    if HAS_ZP:
        # Loaded where it is used: held across the FMAs, the zero points made the 8-bit tile
        # spill at sm_70 (unspecialized sizes, with bias).
        z = _zero_points(load_in_layer(z_ptr + g * N + rn, n_ok & in_split, WHOLE))
        part -= xsum[:, None] * z[None, :]
    return part * s[None, :]
