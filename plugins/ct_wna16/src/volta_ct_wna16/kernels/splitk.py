"""Triton kernels for ``y = x @ dequant(W).T (+ bias)`` with compressed-tensors int4/int8 weights.

Layout (made at load time by :func:`volta_ct_wna16.layout.prepare`): ``qweight`` int32
``[ceil(K / pack), N]``, the checkpoint's words transposed so that the output dimension is
contiguous: word ``kw`` of column ``n`` holds input elements ``pack*kw .. pack*kw + pack-1`` of
output ``n`` in bits ``bits*j``, offset by ``2**(bits-1)`` (compressed-tensors' packing). Every
tile load is then a run of whole words along N (coalesced, vectorized), and the ``j``-th value of
every word in a tile is one shift and mask away. Scales are ``[groups, N]`` fp16 and zero points
(asymmetric only) fp16 ``[groups, N]`` holding the stored value, so ``w = (q - z) * s`` with
``z = 2**(bits-1)`` when symmetric.

Integers become floats without the int-to-float unit: ``q | 0x4B000000`` read as fp32 is
``2**23 + q`` exactly (``q | 0x6400`` as fp16 is ``1024 + q``), so subtracting ``2**23 + z``
(``1024 + z``) gives ``q - z`` exactly.

Kernels, chosen by :mod:`volta_ct_wna16.configs`:

* :func:`wna16_splitk_kernel`, decode (M up to 16 on SM70, 32 on SM90): each program covers
  ``BLOCK_N`` outputs over one split of the input. ``BLOCK_M == 1`` without ``USE_DOT``: a GEMV
  over 32-input sub-tiles (:func:`_gemv_sub`: one AND, one subtraction and one fp32 FMA per
  weight; zero point and scale once per word row) that reduces across the input only once at the
  end. ``BLOCK_M > 1`` without ``USE_DOT``: a shift-and-mask FMA loop with a token axis (SM70, 2
  to 4 tokens). ``USE_DOT``: dequantized fp16 tiles into ``tl.dot`` (FMA on SM70, tensor cores on
  SM80+); with 16 or more words per slot, one dot per word slot against the activations gathered
  in that slot's order, otherwise one dot of the slots interleaved back into input order. With
  split-K (``USE_WS``) the reduction is fused, so a decode call is one launch: each program writes
  its fp32 partial tile and counts itself in on arrival counters, and the last arrivals sum the
  partials in a two-level tree (:func:`_reduce_splits`), add the bias, cast, and set the counters
  back to zero.
* :func:`wna16_gemm_kernel`, larger M: each ``[BLOCK_K, BLOCK_N]`` weight tile is dequantized
  word slot by word slot and interleaved back into input order (``tl.join``) for one ``tl.dot``.
* :func:`wna16_moe_kernel`, fused MoE experts: one program per block of routed rows of one
  expert (:mod:`volta_ct_wna16.routing`) and output tile, the decode tile's slot dots
  (:func:`_slot_dots`, shared with :func:`wna16_splitk_kernel`), decode tiles split across the
  input with atomic fp32 partials.
* :func:`wna16_dequant_kernel` writes ``dequant(W).T`` (``[K, N]`` fp16), for the prefill path that
  hands the product to cuBLAS (tensor cores on a V100, which Triton's ``tl.dot`` no longer uses
  there: docs/kernels.md#sm70-facts).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.constexpr_function
def slot_shift(bits: int, j: int, in_place: bool) -> int:
    """How far :func:`_slot_q16` shifts a word right for value ``j`` of a ``bits``-bit word,
    before taking the 16-bit half the value is in: ``in_place``, by whole bytes only, so far
    that the value lies within bits 0..9 of its half (0 for values 0 and 1 of a 4-bit half,
    else 8); otherwise to bit 0 of its half."""
    i = j % (16 // bits)
    return bits * i // 8 * 8 if in_place else bits * i


@triton.constexpr_function
def in_place(has_zp: bool, group_tile: bool) -> bool:
    """Whether :func:`_slot_q16` leaves values in place: where the tile's zero point is one
    row (or the symmetric constant). With a zero point per word row, the two subtraction
    constants in-place values need per row (``1024 + z``, ``64 + z``) cost more packing on
    the sm_90 dot tile than the shifts they save (4-bit asymmetric: 1675 SASS against 1447)."""
    return group_tile or not has_zp


@triton.jit
def _slot_q16(
    t, z, j: tl.constexpr, BITS: tl.constexpr, IN_PLACE: tl.constexpr, TINY: tl.constexpr
):
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
    """``(q - z) * s`` in fp16 for value ``j`` of every word of ``t`` (:func:`_slot_q16`)."""
    return _slot_q16(t, z, j, BITS, IN_PLACE, False) * s16


@triton.jit
def _slot_f32(t, c32, j: tl.constexpr, BITS: tl.constexpr):
    """``q - z`` in fp32 (exact) for value ``j`` of every word of ``t``."""
    q = ((t >> (BITS * j)) & ((1 << BITS) - 1)) | 0x4B000000
    return q.to(tl.float32, bitcast=True) - c32


@triton.jit
def _load_words(
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
    tile lies inside the layer (:func:`volta_ct_wna16.configs.whole_tiles`), so no load is
    masked.
    """
    rkp = tl.arange(0, BKP)
    kp = k0 // PACK + rkp
    ok = (kp[:, None] < KW) & n_ok[None, :]
    # Unsigned, so shifts are logical and need no sign handling.
    t = _load_in_layer(w_ptr + kp[:, None] * N + rn[None, :], ok, WHOLE).to(tl.uint32, bitcast=True)
    if GROUP_TILE:
        g1 = k0 // GROUP
        s = _load_in_layer(s_ptr + g1 * N + rn, n_ok, WHOLE)[None, :]
        if HAS_ZP:
            z = _load_in_layer(z_ptr + g1 * N + rn, n_ok, WHOLE).to(tl.float32)[None, :]
        else:
            z = tl.full([1, 1], 1 << (BITS - 1), tl.float32)
    else:
        g = (k0 + rkp * PACK) // GROUP
        s = _load_in_layer(s_ptr + g[:, None] * N + rn[None, :], ok, WHOLE)
        if HAS_ZP:
            z = _load_in_layer(z_ptr + g[:, None] * N + rn[None, :], ok, WHOLE).to(tl.float32)
        else:
            z = tl.full([BKP, 1], 1 << (BITS - 1), tl.float32)
    return t, s, z


@triton.jit
def _load_in_layer(ptrs, ok, WHOLE: tl.constexpr):
    """``ptrs`` loaded where ``ok`` (zero elsewhere), or all of them, unmasked, with ``WHOLE``:
    a masked load costs compares and selects per copy (the SM90 16-token dot tile compiles to
    1688 SASS instructions masked and 1496 unmasked), which a tile inside the layer does not
    need."""
    if WHOLE:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=ok, other=0)


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
def _x_tile(x_ptr, k0, k_end, PACK: tl.constexpr, SUBS: tl.constexpr, WHOLE: tl.constexpr):
    """The ``32 * SUBS`` activations from ``k0`` (zero from ``k_end`` on) as ``[rows, PACK, SUBS]``:
    element ``[r, j, s]`` is input ``k0 + 32 * s + PACK * r + j``, so that :func:`_sub_tile`
    takes the sub-tiles apart along the last axis. ``WHOLE``: all before ``k_end``, unmasked."""
    ROWS: tl.constexpr = GEMV_SUB // PACK
    kk = (
        k0
        + tl.arange(0, ROWS)[:, None, None] * PACK
        + tl.arange(0, PACK)[None, :, None]
        + tl.arange(0, SUBS)[None, None, :] * GEMV_SUB
    )
    return _load_in_layer(x_ptr + kk, kk < k_end, WHOLE)


@triton.jit
def _sub_tile(x, SUB: tl.constexpr, SUBS: tl.constexpr):
    """Sub-tile ``SUB`` (``[rows, pack]``) of an :func:`_x_tile` of ``SUBS`` sub-tiles: the
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
def _gemv_sub(
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
    t = _load_in_layer(
        w_ptr + kp[:, None] * N + rn[None, :], (kp[:, None] < KW) & n_ok[None, :], WHOLE
    )
    # Unsigned: the shift is logical, so the copy needs no mask beyond each field's.
    t = t.to(tl.uint32, bitcast=True)
    hi = t >> high_shift(BITS)
    live = (N >= 0).to(tl.uint32)
    in_split = kb < k_end
    g = kb // GROUP
    s = _load_in_layer(s_ptr + g * N + rn, n_ok & in_split, WHOLE).to(tl.float32)
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
        z = _zero_points(_load_in_layer(z_ptr + g * N + rn, n_ok & in_split, WHOLE))
        part -= xsum[:, None] * z[None, :]
    return part * s[None, :]


@triton.jit
def _slot_pair_x(x_ptr, rm, m_ok, kk, k_end, stride_xm, WHOLE: tl.constexpr):
    """The activations of two adjacent word slots, ``[rows, words]`` each: inputs ``kk`` and
    ``kk + 1`` (``kk`` even) of every word row, read as one 32-bit word each.

    Read one slot at a time, each activation is a 2-byte element 16 bytes from the next; a
    2-byte element cannot be copied asynchronously (``cp.async`` moves 4, 8 or 16 bytes), so
    Triton loaded each slot's tile into registers and stored it to shared memory behind a
    barrier, one L2 round trip per slot left exposed in every iteration. As 32-bit words the
    pair is copied asynchronously ahead of its iteration by the software pipeline, and the
    two halves are split by elementwise ops, which Triton applies after reading the words in
    the dot-operand layout. Needs ``stride_xm`` even and ``x_ptr`` 4-byte aligned (the
    launcher pads the activations otherwise); where the input length is odd, the last pair's
    second half is the launcher's zero padding.
    """
    x32 = x_ptr.to(tl.pointer_type(tl.uint32))
    ptrs = x32 + rm[:, None] * (stride_xm // 2) + kk[None, :] // 2
    if WHOLE:
        words = tl.load(ptrs, mask=m_ok[:, None], other=0)
    else:
        words = tl.load(ptrs, mask=m_ok[:, None] & (kk[None, :] < k_end), other=0)
    lo = (words & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
    hi = (words >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    return lo, hi


@triton.jit
def _slot_dots(
    acc,
    x_ptr,
    rows,
    m_ok,
    w_ptr,
    s_ptr,
    z_ptr,
    k0,
    k_end,
    rn,
    n_ok,
    N,
    KW,
    GROUP,
    stride_xm,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BKP: tl.constexpr,
    GROUP_TILE: tl.constexpr,
    WHOLE: tl.constexpr = False,
):
    """``acc`` plus one ``BKP``-word tile from input ``k0`` on, as one dot per word slot.

    The activations (input rows ``rows``) are gathered in each slot's order
    (:func:`_slot_pair_x`, two slots per 32-bit read), so the dequantized slots need no
    interleaving back into input order. With ``GROUP_TILE`` one scale per output covers the
    tile: the dots take the exact, subnormal ``(q - z) * 2**-24`` and the tile's sum is
    scaled once (by ``s * 2**24``), one FMA per output instead of a multiply per weight.
    """
    PACK: tl.constexpr = 32 // BITS
    rkp = tl.arange(0, BKP)
    t, s, z = _load_words(
        w_ptr, s_ptr, z_ptr, k0, rn, n_ok, N, KW, GROUP, BKP, PACK, HAS_ZP, BITS, GROUP_TILE,
        WHOLE,
    )  # fmt: skip
    IN_PLACE: tl.constexpr = in_place(HAS_ZP, GROUP_TILE)
    if GROUP_TILE:
        part = tl.zeros(acc.shape, dtype=tl.float32)
    for p in tl.static_range(PACK // 2):
        kk = k0 + rkp * PACK + 2 * p
        x_lo, x_hi = _slot_pair_x(x_ptr, rows, m_ok, kk, k_end, stride_xm, WHOLE)
        w_lo = _slot_q16(t, z, 2 * p, BITS, IN_PLACE, GROUP_TILE)
        w_hi = _slot_q16(t, z, 2 * p + 1, BITS, IN_PLACE, GROUP_TILE)
        if GROUP_TILE:
            part = tl.dot(x_hi, w_hi, tl.dot(x_lo, w_lo, part))
        else:
            acc = tl.dot(x_hi, w_hi * s, tl.dot(x_lo, w_lo * s, acc))
    if GROUP_TILE:
        acc += part * (s.to(tl.float32) * 16777216.0)
    return acc


@triton.jit
def _dequant_dot(
    acc,
    x_ptr,
    rows,
    m_ok,
    w_ptr,
    s_ptr,
    z_ptr,
    k0,
    k_end,
    rn,
    n_ok,
    N,
    KW,
    GROUP,
    stride_xm,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_TILE: tl.constexpr,
):
    """``acc`` plus one ``BLOCK_K``-input tile from ``k0`` on (inputs from ``k_end`` on count
    as zero), the weights dequantized into input order (:func:`_dequant_block`) for one dot."""
    kk = k0 + tl.arange(0, BLOCK_K)
    xk = tl.load(
        x_ptr + rows[:, None] * stride_xm + kk[None, :],
        mask=m_ok[:, None] & (kk[None, :] < k_end),
        other=0.0,
    )
    w = _dequant_block(
        w_ptr, s_ptr, z_ptr, k0, rn, n_ok, N, KW, GROUP, BITS, HAS_ZP, BLOCK_K, BLOCK_N, GROUP_TILE
    )
    return tl.dot(xk, w, acc)


@triton.jit
def wna16_splitk_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    b_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    KW,
    GROUP,
    stride_xm,
    stride_om,
    K_PER_SPLIT,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_WS: tl.constexpr,
    USE_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    REDUCE_UNROLL: tl.constexpr,
    GROUP_TILE: tl.constexpr,
    SLOT_DOTS: tl.constexpr,
    ATOMIC: tl.constexpr,
    WHOLE: tl.constexpr,
):
    """One ``[BLOCK_M, BLOCK_N]`` output tile over one split of the input dimension.

    The input loop is software-pipelined ``NUM_STAGES`` deep where Triton pipelines (SM80+;
    1 on SM70): Triton 3.6 pipelines a loop without ``tl.dot`` only when asked through
    ``tl.range``, and the 1-token GEMV is latency-bound without it (one small load per
    iteration, waited for). ``GROUP_TILE``: every tile lies inside one quantization group
    (:func:`_load_words`). ``REDUCE_UNROLL``: the fan-in of the fused reduction's tree, whose
    unrolled loads issue together, one L2 round trip per ``REDUCE_UNROLL`` partials (wide dot
    tiles need few, or they spill). ``SLOT_DOTS`` (with ``USE_DOT``): one dot per word slot,
    set by :func:`volta_ct_wna16.configs.slot_dots`, which the launcher also asks whether the
    activations need 4-byte aligned rows (:func:`_slot_pair_x`). ``WHOLE``: every tile lies
    inside the layer (:func:`volta_ct_wna16.configs.whole_tiles`), so the 1-token GEMV and the
    slot-dot tiles load weights, scales and activations without input or output masks.

    The grid is ``(row blocks, output blocks, splits)``, row blocks first, so the programs
    that read one weight tile for different rows run side by side and share its reads in L2.
    With ``USE_WS`` the grid's third axis is the split: every program stores its fp32 partial
    to ``ws_ptr[split]`` and the tile is reduced by :func:`_reduce_splits`, whose counters in
    ``cnt_ptr`` are zero before the launch and again after it, so the next launch on the
    stream (a CUDA graph replay included) needs no memset. With ``ATOMIC`` too, the splits
    add their partials into one fp32 tile instead (:func:`_accumulate_splits`).
    """
    PACK: tl.constexpr = 32 // BITS
    BKP: tl.constexpr = BLOCK_K // PACK
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rkp = tl.arange(0, BKP)
    m_ok = rm < M
    n_ok = rn < N
    k_begin = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    elif BLOCK_M == 1:
        acc2 = tl.zeros([GEMV_SUB // PACK, BLOCK_N], dtype=tl.float32)
    else:
        acc3 = tl.zeros([BLOCK_M, BKP, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(k_begin, k_end, BLOCK_K, num_stages=NUM_STAGES):
        if SLOT_DOTS:
            acc = _slot_dots(
                acc, x_ptr, rm, m_ok, w_ptr, s_ptr, z_ptr, k0, k_end, rn, n_ok, N, KW, GROUP,
                stride_xm, BITS, HAS_ZP, BKP, GROUP_TILE, WHOLE,
            )  # fmt: skip
        elif USE_DOT:
            acc = _dequant_dot(
                acc, x_ptr, rm, m_ok, w_ptr, s_ptr, z_ptr, k0, k_end, rn, n_ok, N, KW, GROUP,
                stride_xm, BITS, HAS_ZP, BLOCK_K, BLOCK_N, GROUP_TILE,
            )  # fmt: skip
        elif BLOCK_M == 1:
            xt = _x_tile(x_ptr, k0, k_end, PACK, BLOCK_K // GEMV_SUB, WHOLE)
            for sub in tl.static_range(BLOCK_K // GEMV_SUB):
                acc2 += _gemv_sub(
                    _sub_tile(xt, sub, BLOCK_K // GEMV_SUB),
                    w_ptr,
                    s_ptr,
                    z_ptr,
                    k0 + sub * GEMV_SUB,
                    k_end,
                    rn,
                    n_ok,
                    N,
                    KW,
                    GROUP,
                    BITS,
                    HAS_ZP,
                    WHOLE,
                )
        else:
            t, s, z = _load_words(
                w_ptr, s_ptr, z_ptr, k0, rn, n_ok, N, KW, GROUP, BKP, PACK, HAS_ZP, BITS, False,
                WHOLE,
            )  # fmt: skip
            c32 = z + 8388608.0
            part3 = tl.zeros([BLOCK_M, BKP, BLOCK_N], dtype=tl.float32)
            for j in tl.static_range(PACK):
                kk = k0 + rkp * PACK + j
                xj = tl.load(
                    x_ptr + rm[:, None] * stride_xm + kk[None, :],
                    mask=m_ok[:, None] & (kk[None, :] < k_end),
                    other=0.0,
                ).to(tl.float32)
                part3 += xj[:, :, None] * _slot_f32(t, c32, j, BITS)[None, :, :]
            acc3 += part3 * s.to(tl.float32)[None, :, :]
    if USE_DOT:
        res = acc
    elif BLOCK_M == 1:
        res = tl.sum(acc2, axis=0)[None, :]
    else:
        res = tl.sum(acc3, axis=1)
    tile_ok = m_ok[:, None] & n_ok[None, :]
    if USE_WS and ATOMIC:
        _accumulate_splits(
            res, ws_ptr, cnt_ptr, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, N, stride_om, HAS_BIAS
        )
    elif USE_WS:
        _reduce_splits(
            res, ws_ptr, cnt_ptr, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, M, N, stride_om,
            HAS_BIAS, REDUCE_UNROLL,
        )  # fmt: skip
    else:
        _store_out(res, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, stride_om, HAS_BIAS)


@triton.jit
def _reduce_splits(
    res,
    ws_ptr,
    cnt_ptr,
    b_ptr,
    out_ptr,
    rm,
    rn,
    n_ok,
    tile_ok,
    M,
    N,
    stride_om,
    HAS_BIAS: tl.constexpr,
    FAN_IN: tl.constexpr,
):
    """Store this split's partial tile and, if it completes the tile, write the output.

    A two-level tree, so the partials are summed by many programs at once rather than one:
    the splits form groups of ``FAN_IN``; the last of a group to arrive (on the group's
    counter) sums the group's partials in one L2 round trip (its loads issue together) and
    stores the sum in the group's first slot; the last group to arrive (on the tile's counter)
    sums the group sums (one round trip per ``FAN_IN`` groups) and writes the output. With
    one group the group's last program writes the output itself. Each arrival is the serial
    split-K pattern: the barrier puts every thread's stores before the one release-acquire
    increment (GPU scope), the last arriver reads past L1 (``.cg``, no stale line) and puts
    the counter back to zero. Sums run in split order within a group and in group order
    across them, so the result is deterministic.

    Counters: ``cnt_ptr[tile]`` per output tile, then ``cnt_ptr[tiles + tile * groups + g]``.
    """
    splits = tl.num_programs(2)
    split = tl.program_id(2)
    tiles = tl.num_programs(0) * tl.num_programs(1)
    tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    size = M * N
    offs = rm[:, None] * N + rn[None, :]
    tl.store(ws_ptr + split * size + offs, res, mask=tile_ok)
    tl.debug_barrier()
    groups = tl.cdiv(splits, FAN_IN)
    group = split // FAN_IN
    first = group * FAN_IN
    members = tl.minimum(splits - first, FAN_IN)
    group_counter = cnt_ptr + tiles + tile * groups + group
    if tl.atomic_add(group_counter, 1, sem="acq_rel", scope="gpu") == members - 1:
        total = tl.zeros(res.shape, dtype=tl.float32)
        for j in tl.static_range(FAN_IN):
            total += _partial(ws_ptr, first + j, first + members, size, offs, tile_ok)
        tl.store(group_counter, 0)
        done = groups == 1
        if not done:
            tl.store(ws_ptr + first * size + offs, total, mask=tile_ok)
            tl.debug_barrier()
            tile_counter = cnt_ptr + tile
            if tl.atomic_add(tile_counter, 1, sem="acq_rel", scope="gpu") == groups - 1:
                total = tl.zeros(res.shape, dtype=tl.float32)
                for g0 in range(0, groups, FAN_IN):
                    for j in tl.static_range(FAN_IN):
                        total += _partial(ws_ptr, (g0 + j) * FAN_IN, splits, size, offs, tile_ok)
                tl.store(tile_counter, 0)
                done = True
        if done:
            _store_out(total, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, stride_om, HAS_BIAS)


@triton.jit
def _accumulate_splits(
    res, ws_ptr, cnt_ptr, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, N, stride_om, HAS_BIAS
):
    """Add this split's partial into the tile's fp32 accumulators and, if it completes the
    tile, write the output.

    The adds are atomic (relaxed, their results unused), done by L2 while the other splits
    still run, so the tile's last arriver reads one sum in one round trip where the tree of
    :func:`_reduce_splits` reads several: that tail is most of a split that runs only a few
    input steps (a layer with few output tiles and a short input). The arrival is the serial
    split-K pattern of the tree (barrier, one release-acquire increment at GPU scope), but the
    last arriver reads the sums by atomically adding zero, not by loads: loads past L1
    (``.cg``, as the tree reads its partials) returned sums missing some splits' adds on the
    H100 (5120x5120 at 2 and 16 tokens: relative error 0.06-0.76; a release add by every
    thread before the barrier did not help and is not needed, since the barrier orders every
    thread's adds before the counting thread's release); read by atomics they were right on
    every tile tried (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run15).
    The last arriver writes zeros back to the accumulators and the counter, so the next
    launch finds them zero. The order of the adds is the order the splits reach L2, so the
    fp32 sum (and, rarely, the fp16 output's last bit) can differ between launches.
    ``ws_ptr`` is ``[M, N]`` fp32; ``cnt_ptr[tile]`` counts the tile's splits.
    """
    splits = tl.num_programs(2)
    tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    acc_ptrs = ws_ptr + rm[:, None] * N + rn[None, :]
    tl.atomic_add(acc_ptrs, res, mask=tile_ok, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    counter = cnt_ptr + tile
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == splits - 1:
        total = tl.atomic_add(acc_ptrs, tl.zeros_like(res), mask=tile_ok, sem="relaxed")
        tl.store(acc_ptrs, tl.zeros_like(total), mask=tile_ok)
        tl.store(counter, 0)
        _store_out(total, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, stride_om, HAS_BIAS)


@triton.jit
def _partial(ws_ptr, slot, limit, tile_size, offs, tile_ok):
    """The fp32 tile in workspace slot ``slot``, read past L1 (zeros from slot ``limit`` on)."""
    ok = tile_ok & (slot < limit)
    return tl.load(ws_ptr + slot * tile_size + offs, mask=ok, other=0.0, cache_modifier=".cg")


@triton.jit
def _store_out(acc, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, stride_om, HAS_BIAS: tl.constexpr):
    """Add the bias to an fp32 output tile, cast to the output dtype and store it."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    o = out_ptr + rm[:, None] * stride_om + rn[None, :]
    tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=tile_ok)


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
    ``((A, B), (C, D))``: the order :func:`_dequant_block` flattens back into input order."""
    return tl.join(
        tl.join(_slot_f16(t, z, s, A, BITS, IN_PLACE), _slot_f16(t, z, s, B, BITS, IN_PLACE)),
        tl.join(_slot_f16(t, z, s, C, BITS, IN_PLACE), _slot_f16(t, z, s, D, BITS, IN_PLACE)),
    )


@triton.jit
def _dequant_block(
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
    t, s, z = _load_words(
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
def wna16_gemm_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    KW,
    GROUP,
    stride_xm,
    stride_om,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """One ``[BLOCK_M, BLOCK_N]`` output tile over the whole input; weights dequantized per tile."""
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    rows = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        acc = _dequant_dot(
            acc, x_ptr, rm, m_ok, w_ptr, s_ptr, z_ptr, k0, K, rn, n_ok, N, KW, GROUP, stride_xm,
            BITS, HAS_ZP, BLOCK_K, BLOCK_N, False,
        )  # fmt: skip
    tile_ok = m_ok[:, None] & n_ok[None, :]
    _store_out(acc, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, stride_om, HAS_BIAS)


@triton.jit
def wna16_moe_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    rw_ptr,
    pair_ptr,
    expert_ptr,
    PAIRS,
    N,
    K,
    KW,
    GROUP,
    EXPERTS,
    ROW_DIV,
    OUT_DIV,
    stride_xm,
    stride_om,
    stride_we,
    stride_se,
    K_PER_SPLIT,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    MUL_ROUTER: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_TILE: tl.constexpr,
    SLOT_DOTS: tl.constexpr,
    ATOMIC: tl.constexpr,
):
    """One ``[BLOCK_M, BLOCK_N]`` tile of routed rows times one expert's weights (fused MoE).

    The routed (token, slot) pairs come sorted by expert in blocks of ``BLOCK_M``
    (:func:`volta_ct_wna16.routing.route`): ``pair_ptr`` holds each block's pair indices
    (``PAIRS`` where a block is padded) and ``expert_ptr`` each block's expert (``EXPERTS`` for
    blocks past the routed pairs, which return at once: the grid is sized for the most blocks
    any routing can need, so it needs no count from the device). Input row of pair ``p`` is
    ``p // ROW_DIV`` (the token for gate/up, the pair itself for down); output row is
    ``p // OUT_DIV`` (the pair for gate/up; for down, the token, whose pairs are added into
    it). ``MUL_ROUTER`` multiplies each row by its router weight (``rw_ptr``, fp32) before the
    store. The expert's weights are the stacked tensors at ``e * stride_we`` (words) and
    ``e * stride_se`` (scales and zero points): the layout of :func:`wna16_gemm_kernel`.

    The grid's third axis splits the input (``K_PER_SPLIT`` each) when a decode step routes
    too few blocks to fill the GPU. ``ATOMIC`` (split, or a token's pairs summed into one
    row) adds fp32 tiles into the zeroed output. ``SLOT_DOTS``: one dot per word slot
    (:func:`_slot_dots`), as the dense decode tile; otherwise each tile is dequantized into
    input order for one dot.
    """
    PACK: tl.constexpr = 32 // BITS
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    k_begin = tl.program_id(2) * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    e = tl.load(expert_ptr + pid_m)
    if e >= EXPERTS:
        return
    pairs = tl.load(pair_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    m_ok = pairs < PAIRS
    src = pairs // ROW_DIV
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    e64 = e.to(tl.int64)
    w_e = w_ptr + e64 * stride_we
    s_e = s_ptr + e64 * stride_se
    z_e = z_ptr + e64 * stride_se if HAS_ZP else z_ptr
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        if SLOT_DOTS:
            acc = _slot_dots(
                acc, x_ptr, src, m_ok, w_e, s_e, z_e, k0, k_end, rn, n_ok, N, KW, GROUP,
                stride_xm, BITS, HAS_ZP, BLOCK_K // PACK, GROUP_TILE,
            )  # fmt: skip
        else:
            acc = _dequant_dot(
                acc, x_ptr, src, m_ok, w_e, s_e, z_e, k0, k_end, rn, n_ok, N, KW, GROUP,
                stride_xm, BITS, HAS_ZP, BLOCK_K, BLOCK_N, GROUP_TILE,
            )  # fmt: skip
    if MUL_ROUTER:
        acc *= tl.load(rw_ptr + pairs, mask=m_ok, other=0.0)[:, None]
    o = out_ptr + (pairs // OUT_DIV)[:, None] * stride_om + rn[None, :]
    tile_ok = m_ok[:, None] & n_ok[None, :]
    if ATOMIC:
        tl.atomic_add(o, acc, mask=tile_ok, sem="relaxed")
    else:
        tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=tile_ok)


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
    """Write ``dequant(W).T`` as a dense ``[K, N]`` matrix in the output's dtype."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    kk = k0 + tl.arange(0, BLOCK_K)
    n_ok = rn < N
    w = _dequant_block(
        w_ptr, s_ptr, z_ptr, k0, rn, n_ok, N, KW, GROUP, BITS, HAS_ZP, BLOCK_K, BLOCK_N, False
    )
    tl.store(
        out_ptr + kk[:, None] * N + rn[None, :],
        w.to(out_ptr.dtype.element_ty),
        mask=(kk[:, None] < K) & n_ok[None, :],
    )


@triton.jit
def moe_count_kernel(
    ids_ptr,
    map_ptr,
    count_ptr,
    rank_ptr,
    local_ptr,
    PAIRS,
    EXPERTS,
    HAS_MAP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """First of the two routing launches (:func:`volta_ct_wna16.routing.route`): each pair's
    local expert and its rank among that expert's pairs.

    ``ids_ptr`` holds each pair's expert (int32 or int64), mapped through ``map_ptr`` when
    ``HAS_MAP`` (expert parallelism: -1 for another rank's expert). The rank is the expert's
    count before the pair's atomic add on ``count_ptr`` (zeroed by the launcher): unique within
    the expert, in whatever order the adds land, which is all the second launch needs and
    costs no sort. ``local_ptr`` gets the expert, ``EXPERTS`` for a pair no local expert runs.
    """
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = p < PAIRS
    e = tl.load(ids_ptr + p, mask=ok, other=-1).to(tl.int32)
    if HAS_MAP:
        e = tl.load(map_ptr + e, mask=ok & (e >= 0), other=-1).to(tl.int32)
    local = ok & (e >= 0) & (e < EXPERTS)
    ones = tl.full([BLOCK], 1, tl.int32)
    rank = tl.atomic_add(count_ptr + e, ones, mask=local, sem="relaxed")
    tl.store(rank_ptr + p, rank, mask=local)
    tl.store(local_ptr + p, tl.where(local, e, EXPERTS), mask=ok)


@triton.jit
def moe_place_kernel(
    count_ptr,
    rank_ptr,
    local_ptr,
    pair_ptr,
    expert_ptr,
    PAIRS,
    EXPERTS,
    BLOCKS,
    BLOCK_M: tl.constexpr,
    E_POW2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Second routing launch: every pair into its expert's blocks, and the blocks' table.

    Every program reads all ``EXPERTS`` counts and takes each expert's first block from their
    running sum of whole blocks, so no launch in between adds them up. Program ``i`` covers
    ``BLOCK`` pairs and the same ``BLOCK`` slots of ``pair_ptr`` (``BLOCKS * BLOCK_M`` of them,
    never fewer than the pairs): it writes each of its pairs at ``first block * BLOCK_M +
    rank``, each of its slots that no rank reaches with ``PAIRS`` (the kernel's padding), and
    the expert of each block that starts in its slots (``EXPERTS`` past the routed ones). A slot
    is either a pair's or padding, never both, so the two kinds of store need no ordering.
    """
    ex = tl.arange(0, E_POW2)
    ex_ok = ex < EXPERTS
    counts = tl.load(count_ptr + ex, mask=ex_ok, other=0)
    per_expert = (counts + BLOCK_M - 1) // BLOCK_M
    end = tl.cumsum(per_expert, 0)
    start = end - per_expert
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e = tl.load(local_ptr + i, mask=i < PAIRS, other=EXPERTS)
    placed = e < EXPERTS
    rank = tl.load(rank_ptr + i, mask=placed, other=0)
    first = tl.sum(tl.where(e[:, None] == ex[None, :], start[None, :], 0), axis=1)
    tl.store(pair_ptr + first * BLOCK_M + rank, i, mask=placed)
    b = i // BLOCK_M
    r = i % BLOCK_M
    slot_ok = b < BLOCKS
    owner = tl.sum(((end[None, :] <= b[:, None]) & ex_ok[None, :]).to(tl.int32), axis=1)
    hit = owner[:, None] == ex[None, :]
    owner_start = tl.sum(tl.where(hit, start[None, :], 0), axis=1)
    owner_count = tl.sum(tl.where(hit, counts[None, :], 0), axis=1)
    padding = (b - owner_start) * BLOCK_M + r >= owner_count
    tl.store(pair_ptr + i, tl.full([BLOCK], 0, tl.int32) + PAIRS, mask=slot_ok & padding)
    tl.store(expert_ptr + b, owner, mask=slot_ok & (r == 0))


@triton.jit
def silu_mul_kernel(h_ptr, out_ptr, INTER, stride_h, stride_o, BLOCK: tl.constexpr):
    """``SiLU(gate) * up`` of one row of the gate/up output (``gate`` its first ``INTER``
    columns, ``up`` the next), in fp32, stored in the output's dtype: the down projection's
    input, in one launch where torch takes a slice conversion, a SiLU, a product and a cast."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < INTER
    g = tl.load(h_ptr + row * stride_h + c, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + row * stride_h + INTER + c, mask=ok, other=0.0).to(tl.float32)
    act = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_o + c, act.to(out_ptr.dtype.element_ty), mask=ok)
