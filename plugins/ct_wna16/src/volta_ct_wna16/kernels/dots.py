"""The dot tiles of the split-K, GEMM and MoE kernels: one ``BLOCK_K`` step added into ``acc``.

:func:`dot_per_slot` takes one ``tl.dot`` per word slot against the activations gathered in that
slot's order (16 or more words per slot); :func:`dequant_dot` dequantizes the tile back into
input order (:func:`~volta_ct_wna16.kernels.dequant.dequant_block`) for one ``tl.dot``. On SM70
``tl.dot`` runs on the FMA units (triton-lang/triton#5066), on SM80+ on tensor cores.
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_ct_wna16.kernels.dequant import dequant_block, in_place, load_words, slot_q16


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
def dot_per_slot(
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
    t, s, z = load_words(
        w_ptr, s_ptr, z_ptr, k0, rn, n_ok, N, KW, GROUP, BKP, PACK, HAS_ZP, BITS, GROUP_TILE,
        WHOLE,
    )  # fmt: skip
    IN_PLACE: tl.constexpr = in_place(HAS_ZP, GROUP_TILE)
    if GROUP_TILE:
        part = tl.zeros(acc.shape, dtype=tl.float32)
    for p in tl.static_range(PACK // 2):
        kk = k0 + rkp * PACK + 2 * p
        x_lo, x_hi = _slot_pair_x(x_ptr, rows, m_ok, kk, k_end, stride_xm, WHOLE)
        w_lo = slot_q16(t, z, 2 * p, BITS, IN_PLACE, GROUP_TILE)
        w_hi = slot_q16(t, z, 2 * p + 1, BITS, IN_PLACE, GROUP_TILE)
        if GROUP_TILE:
            part = tl.dot(x_hi, w_hi, tl.dot(x_lo, w_lo, part))
        else:
            acc = tl.dot(x_hi, w_hi * s, tl.dot(x_lo, w_lo * s, acc))
    if GROUP_TILE:
        acc += part * (s.to(tl.float32) * 16777216.0)
    return acc


@triton.jit
def dequant_dot(
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
    SWAP: tl.constexpr = False,
):
    """``acc`` plus one ``BLOCK_K``-input tile from ``k0`` on (inputs from ``k_end`` on count
    as zero), the weights dequantized into input order (:func:`dequant_block`) for one dot:
    ``x @ dequant(W).T`` into ``acc`` ``[rows, BLOCK_N]``, or with ``SWAP`` the transposed
    product ``dequant(W) @ x.T`` into ``acc`` ``[BLOCK_N, rows]``, the weights the dot's first
    operand (:func:`volta_ct_wna16.kernels.moe.wna16_moe_kernel` says why)."""
    kk = k0 + tl.arange(0, BLOCK_K)
    if SWAP:
        xk = tl.load(
            x_ptr + rows[None, :] * stride_xm + kk[:, None],
            mask=m_ok[None, :] & (kk[:, None] < k_end),
            other=0.0,
        )
    else:
        xk = tl.load(
            x_ptr + rows[:, None] * stride_xm + kk[None, :],
            mask=m_ok[:, None] & (kk[None, :] < k_end),
            other=0.0,
        )
    w = dequant_block(
        w_ptr, s_ptr, z_ptr, k0, rn, n_ok, N, KW, GROUP, BITS, HAS_ZP, BLOCK_K, BLOCK_N, GROUP_TILE
    )
    return tl.dot(tl.trans(w), xk, acc) if SWAP else tl.dot(xk, w, acc)
