"""Triton kernels for ``y = x @ dequant(W).T (+ bias)`` with compressed-tensors int4/int8 weights.

The weights stay in the checkpoint's packing: ``qweight`` int32 ``[N, ceil(K / pack)]`` with
input element ``k`` of row ``n`` in bits ``bits * (k % pack)`` of word ``k // pack``, stored with
the ``2**(bits-1)`` offset. Scales are ``[N, groups]`` in the activation dtype, zero points
(asymmetric only) unpacked to uint8 ``[N, groups]`` holding the stored (offset) value, so that
``w = (q - z) * s`` for both schemes, with ``z = 2**(bits-1)`` when symmetric.

Integers become floats without the slow int-to-float unit: ``q | 0x4B000000`` read as fp32 is
``2**23 + q`` exactly (``q | 0x6400`` as fp16 is ``1024 + q``), so one subtraction of
``2**23 + z`` (``1024 + z``) gives ``q - z`` exactly.

Three kernels, chosen by :mod:`volta_ct_wna16.configs`:

* :func:`wna16_splitk_kernel` for decode (M up to 16): each program reduces a ``BLOCK_K`` slice
  of the input for ``BLOCK_N`` rows. ``USE_DOT=False`` accumulates with FMAs in fp32 (the path
  for one to four tokens, where a padded ``tl.dot`` would waste the V100's FMA units);
  ``USE_DOT=True`` dequantizes to fp16 and uses ``tl.dot`` (FMA on SM70, tensor cores on SM80+).
  With split-K (``USE_WS``) programs write fp32 partial sums that :func:`wna16_reduce_kernel`
  adds up, adding the bias and casting.
* :func:`wna16_gemm_kernel`: tiled GEMM for larger M, dequantizing a ``[BLOCK_N, BLOCK_K]`` tile
  in registers before each ``tl.dot``.
* :func:`wna16_dequant_kernel`: writes the dequantized fp16 weight, for the prefill path that
  hands the product to cuBLAS (tensor cores on a V100, which Triton's ``tl.dot`` no longer uses
  there: FACTS.md 2).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: fp32 whose bit pattern is 0x4B000000: adding an integer below 2**23 to its bits adds it exactly.
MAGIC_F32 = 8388608.0
#: fp16 whose bit pattern is 0x6400 (1024.0), the same trick for integers below 1024.
MAGIC_F16 = 1024.0


@triton.jit
def wna16_splitk_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    b_ptr,
    out_ptr,
    ws_ptr,
    M,
    N,
    K,
    KW,
    NG,
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
):
    """One ``[BLOCK_M, BLOCK_N]`` output tile over one split of the input dimension."""
    PACK: tl.constexpr = 32 // BITS
    BKP: tl.constexpr = BLOCK_K // PACK
    MASK: tl.constexpr = (1 << BITS) - 1
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rkp = tl.arange(0, BKP)
    m_ok = rm < M
    n_ok = rn < N
    k_begin = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        kp = k0 // PACK + rkp
        t = tl.load(
            w_ptr + rn[:, None] * KW + kp[None, :],
            mask=n_ok[:, None] & (kp[None, :] < KW),
            other=0,
        )
        g = (k0 + rkp * PACK) // GROUP
        g_mask = n_ok[:, None] & (g[None, :] < NG)
        s = tl.load(s_ptr + rn[:, None] * NG + g[None, :], mask=g_mask, other=0.0)
        if HAS_ZP:
            z = tl.load(z_ptr + rn[:, None] * NG + g[None, :], mask=g_mask, other=0)
        else:
            z = tl.full([BLOCK_N, BKP], 1 << (BITS - 1), tl.int32)
        if USE_DOT:
            c16 = (z.to(tl.float32) + 1024.0).to(tl.float16)
            for j in tl.static_range(PACK):
                q = ((t >> (BITS * j)) & MASK) | 0x6400
                w = (q.to(tl.int16).to(tl.float16, bitcast=True) - c16) * s.to(tl.float16)
                kk = k0 + rkp * PACK + j
                xj = tl.load(
                    x_ptr + rm[:, None] * stride_xm + kk[None, :],
                    mask=m_ok[:, None] & (kk[None, :] < k_end),
                    other=0.0,
                )
                acc += tl.dot(xj, tl.trans(w))
        else:
            c32 = z.to(tl.float32) + 8388608.0
            part = tl.zeros([BLOCK_M, BLOCK_N, BKP], dtype=tl.float32)
            for j in tl.static_range(PACK):
                q = ((t >> (BITS * j)) & MASK) | 0x4B000000
                w = q.to(tl.float32, bitcast=True) - c32
                kk = k0 + rkp * PACK + j
                xj = tl.load(
                    x_ptr + rm[:, None] * stride_xm + kk[None, :],
                    mask=m_ok[:, None] & (kk[None, :] < k_end),
                    other=0.0,
                ).to(tl.float32)
                part += xj[:, None, :] * w[None, :, :]
            acc += tl.sum(part * s.to(tl.float32)[None, :, :], axis=2)
    if USE_WS:
        ws = ws_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :]
        tl.store(ws, acc, mask=m_ok[:, None] & n_ok[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        o = out_ptr + rm[:, None] * stride_om + rn[None, :]
        tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def wna16_reduce_kernel(
    ws_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    SPLITS,
    stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Sum the split-K partials of one block of outputs, add the bias, cast."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for split in range(SPLITS):
        acc += tl.load(ws_ptr + split * M * N + offs, mask=ok, other=0.0)
    n = offs % N
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=ok, other=0.0).to(tl.float32)
    m = offs // N
    tl.store(out_ptr + m * stride_om + n, acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _dequant_tile(
    w_ptr, s_ptr, z_ptr, rn, kk, n_ok, k_ok, KW, NG, GROUP, BITS: tl.constexpr, HAS_ZP: tl.constexpr
):
    """``[len(rn), len(kk)]`` fp16 weights ``(q - z) * s`` gathered from the packed layout."""
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    ok = n_ok[:, None] & k_ok[None, :]
    t = tl.load(w_ptr + rn[:, None] * KW + (kk // PACK)[None, :], mask=ok, other=0)
    q = ((t >> ((kk % PACK) * BITS)[None, :]) & MASK) | 0x6400
    g = kk // GROUP
    s = tl.load(s_ptr + rn[:, None] * NG + g[None, :], mask=ok, other=0.0)
    if HAS_ZP:
        z = tl.load(z_ptr + rn[:, None] * NG + g[None, :], mask=ok, other=0)
        c16 = (z.to(tl.float32) + 1024.0).to(tl.float16)
    else:
        c16 = tl.full([1, 1], 1024 + (1 << (BITS - 1)), tl.float16)
    return (q.to(tl.int16).to(tl.float16, bitcast=True) - c16) * s.to(tl.float16)


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
    NG,
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
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        a = tl.load(
            x_ptr + rm[:, None] * stride_xm + kk[None, :],
            mask=m_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        w = _dequant_tile(w_ptr, s_ptr, z_ptr, rn, kk, n_ok, k_ok, KW, NG, GROUP, BITS, HAS_ZP)
        acc += tl.dot(a, tl.trans(w))
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    o = out_ptr + rm[:, None] * stride_om + rn[None, :]
    tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def wna16_dequant_kernel(
    w_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    N,
    K,
    KW,
    NG,
    GROUP,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Write ``dequant(W)`` as a dense ``[N, K]`` matrix in the output's dtype."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    n_ok = rn < N
    k_ok = kk < K
    w = _dequant_tile(w_ptr, s_ptr, z_ptr, rn, kk, n_ok, k_ok, KW, NG, GROUP, BITS, HAS_ZP)
    tl.store(
        out_ptr + rn[:, None] * K + kk[None, :],
        w.to(out_ptr.dtype.element_ty),
        mask=n_ok[:, None] & k_ok[None, :],
    )
