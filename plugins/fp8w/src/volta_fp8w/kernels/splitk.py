"""The split-K GEMV for 1 to 8 tokens. Its output tiles' epilogues, the store (bias, cast) and
the splits' atomic sum in the launch that computed them (CUTLASS's serial split-K arrival), are
the host's :func:`volta_core.kernel_api.store_out` and
:func:`~volta_core.kernel_api.accumulate_splits`, shared with ct_wna16's split-K; the tiled GEMM
(:mod:`volta_fp8w.kernels.gemm`) takes the store from here."""

from __future__ import annotations

import triton
import triton.language as tl

from volta_core.kernel_api import accumulate_splits, store_out
from volta_fp8w.kernels.dequant import FOLD, tile_scales, weight_tile, x_tile
from volta_fp8w.kernels.e4m3 import e4m3_words_scaled_fp32

#: Inputs of one ``tl.dot`` of the multi-token tile: SM70's FMA dot holds each operand's inputs
#: for its outputs in registers, so a 128-input dot of 8 tokens by 32 rows spills at sm_70 and
#: a 32-input one does not; the tile's scale is still multiplied once per ``BLOCK_K`` inputs.
DOT_K = tl.constexpr(32)


@triton.jit
def fp8w_splitk_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_sk,
    stride_om,
    SCALE_N,
    SCALE_K,
    K_PER_SPLIT,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    WORDS: tl.constexpr,
):
    """``out[m, i] = sum_j x[m, j] * e4m3(w[i, j]) * scales[i // SCALE_N, j // SCALE_K]
    (+ b[i])`` for one ``[BLOCK_M, BLOCK_N]`` output tile, each program summing one split of
    ``K_PER_SPLIT`` inputs (a multiple of ``BLOCK_K``).

    Each ``BLOCK_K`` step loads ``[BLOCK_N, BLOCK_K]`` codes along the input, decodes them to
    fp16 ``e4m3 * 2**-8`` and sums the tile's products in fp32: one token, products and a sum
    over the input (FMA units); more, ``tl.dot`` of :data:`DOT_K` inputs at a time (tensor cores
    from SM80; the FMA units on SM70, triton-lang/triton#5066). Then the tile's scale is
    multiplied once per (token, row): ``BLOCK_K`` divides ``SCALE_K``
    (:func:`volta_fp8w.launch.fitted`) and splits start on tiles, so a tile has one scale per
    row. ``2**8`` is multiplied back once per output, at the end.

    ``WORDS`` (one token, weights 4-byte aligned, on CUDA): the codes are loaded four to an
    int32 word and decoded in pairs (:func:`~volta_fp8w.kernels.e4m3.e4m3_words_scaled_fp32`),
    each word's four products summed against four strided activation loads.

    The grid is ``(row blocks, output blocks, splits)``. With ``SPLIT`` the splits add their
    partials atomically and the last to arrive writes the output (:func:`accumulate_splits`);
    without, the one program stores it.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    k_begin = tl.program_id(2) * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        s = tile_scales(s_ptr, rn, n_ok, k0, stride_sn, stride_sk, SCALE_N, SCALE_K)
        if WORDS:
            part = _word_products(w_ptr, x_ptr + pid_m * stride_xm, rn, n_ok, k0, k_end,
                                  stride_wn, BLOCK_K)  # fmt: skip
            acc += (part * s)[None, :]
        elif BLOCK_M == 1:
            # The activations as one row, broadcast onto the codes' layout (a 2-D tile of them
            # would carry its own layout, into which the whole weight tile would be converted).
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < k_end
            w = weight_tile(w_ptr, rn, n_ok, kk, k_ok, stride_wn).to(tl.float32)
            xv = tl.load(x_ptr + pid_m * stride_xm + kk, mask=k_ok, other=0.0).to(tl.float32)
            part = tl.sum(w * xv[None, :], axis=1)
            acc += (part * s)[None, :]
        else:
            part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for sub in tl.static_range(0, BLOCK_K, DOT_K):
                kk = k0 + sub + tl.arange(0, DOT_K)
                k_ok = kk < k_end
                w = weight_tile(w_ptr, rn, n_ok, kk, k_ok, stride_wn)
                part += tl.dot(x_tile(x_ptr, rm, m_ok, kk, k_ok, stride_xm), tl.trans(w))
            acc += part * s[None, :]
    acc = acc * FOLD
    tile_ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT:
        accumulate_splits(
            acc, ws_ptr, cnt_ptr, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, N, stride_om, HAS_BIAS
        )
    else:
        store_out(acc, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, stride_om, HAS_BIAS)


@triton.jit
def _word_products(w_ptr, x_row, rn, n_ok, k0, k_end, stride_wn, BLOCK_K: tl.constexpr):
    """``sum_j x[j] * e4m3(w[rn, j]) * 2**-8`` over the tile's inputs ``k0 .. k0 + BLOCK_K``
    for one token, in fp32 ``[BLOCK_N]``: the codes read as int32 words (``stride_wn`` and the
    base 4-byte aligned, the input a multiple of 4), word ``j`` holding inputs ``4j .. 4j + 3``.
    """
    kw = k0 // 4 + tl.arange(0, BLOCK_K // 4)
    k_ok = kw * 4 < k_end
    words = tl.load(
        w_ptr.to(tl.pointer_type(tl.int32)) + rn[:, None] * (stride_wn // 4) + kw[None, :],
        mask=n_ok[:, None] & k_ok[None, :],
        other=0,
    )
    v0, v1, v2, v3 = e4m3_words_scaled_fp32(words)
    xs = x_row + kw * 4
    x0 = tl.load(xs, mask=k_ok, other=0.0).to(tl.float32)
    x1 = tl.load(xs + 1, mask=k_ok, other=0.0).to(tl.float32)
    x2 = tl.load(xs + 2, mask=k_ok, other=0.0).to(tl.float32)
    x3 = tl.load(xs + 3, mask=k_ok, other=0.0).to(tl.float32)
    products = v0 * x0[None, :] + v1 * x1[None, :] + v2 * x2[None, :] + v3 * x3[None, :]
    return tl.sum(products, axis=1)
