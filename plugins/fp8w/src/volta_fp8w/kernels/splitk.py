"""The split-K GEMV for 1 to 8 tokens. Its output tiles' epilogues, the store (bias, cast) and
the splits' atomic sum in the launch that computed them (CUTLASS's serial split-K arrival), are
the host's :func:`volta_core.kernel_api.store_out` and
:func:`~volta_core.kernel_api.accumulate_splits`, shared with ct_wna16's split-K; the tiled GEMM
(:mod:`volta_fp8w.kernels.gemm`) takes the store from here."""

from __future__ import annotations

import triton
import triton.language as tl

from volta_core.kernel_api import accumulate_splits, store_out
from volta_fp8w.kernels.dequant import FOLD, UNSPECIALIZED, tile_scales, weight_tile, x_tile
from volta_fp8w.kernels.e4m3 import e4m3_words_scaled_fp16, e4m3_words_scaled_fp32


@triton.jit(do_not_specialize=UNSPECIALIZED)
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
    DOT_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
):
    """``out[m, i] = sum_j x[m, j] * e4m3(w[i, j]) * scales[i // SCALE_N, j // SCALE_K]
    (+ b[i])`` for one ``[BLOCK_M, BLOCK_N]`` output tile, each program summing one split of
    ``K_PER_SPLIT`` inputs (a multiple of ``BLOCK_K``).

    Each ``BLOCK_K`` step loads ``[BLOCK_N, BLOCK_K]`` codes along the input, decodes them to
    fp16 ``e4m3 * 2**-8`` and sums the tile's products in fp32: one token, products and a sum
    over the input (FMA units); more, ``tl.dot`` of ``DOT_K`` inputs at a time (tensor cores
    from SM80; the FMA units on SM70, triton-lang/triton#5066). Then the tile's scale is
    multiplied once per (token, row): ``BLOCK_K`` divides ``SCALE_K``
    (:func:`volta_fp8w.launch.fitted`) and splits start on tiles, so a tile has one scale per
    row. ``2**8`` is multiplied back once per output, at the end.

    ``WORDS`` (codes, their row stride and the input count multiples of 4): the codes are
    loaded four to an int32 word and decoded in pairs (:mod:`volta_fp8w.kernels.e4m3`): one
    token, each word's four products summed against four strided activation loads
    (:func:`_word_products`); more, the dot's weight operand decoded from words
    (:func:`word_tile`). ``SWAP_AB`` (16 tokens a tile or more): the dot takes the weights as its
    first operand, ``W x^T`` (``[BLOCK_N, BLOCK_M]``, transposed once at the end), so the
    outputs fill the tensor cores' wide side and the tokens their narrow one (on SM90 a
    ``BLOCK_N``-row warpgroup MMA, which needs 64 rows, where ``x W^T`` has ``BLOCK_M``).

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
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        s = tile_scales(s_ptr, rn, n_ok, k0, stride_sn, stride_sk, SCALE_N, SCALE_K)
        if BLOCK_M == 1:
            if WORDS:
                part = _word_products(w_ptr, x_ptr + pid_m * stride_xm, rn, n_ok, k0, k_end,
                                      stride_wn, BLOCK_K)  # fmt: skip
            else:
                # The activations as one row, broadcast onto the codes' layout (a 2-D tile of
                # them would carry its own layout, into which the whole weight tile would be
                # converted).
                kk = k0 + tl.arange(0, BLOCK_K)
                k_ok = kk < k_end
                w = weight_tile(w_ptr, rn, n_ok, kk, k_ok, stride_wn).to(tl.float32)
                xv = tl.load(x_ptr + pid_m * stride_xm + kk, mask=k_ok, other=0.0).to(tl.float32)
                part = tl.sum(w * xv[None, :], axis=1)
            acc += (part * s)[None, :]
        else:
            part = tl.zeros(acc.shape, dtype=tl.float32)
            for sub in tl.static_range(0, BLOCK_K, DOT_K):
                kk = k0 + sub + tl.arange(0, DOT_K)
                k_ok = kk < k_end
                if WORDS:
                    w = word_tile(w_ptr, rn, n_ok, k0 + sub, k_end, stride_wn, DOT_K)
                else:
                    w = weight_tile(w_ptr, rn, n_ok, kk, k_ok, stride_wn)
                x = x_tile(x_ptr, rm, m_ok, kk, k_ok, stride_xm)
                if SWAP_AB:
                    part += tl.dot(w, tl.trans(x))
                else:
                    part += tl.dot(x, tl.trans(w))
            if SWAP_AB:
                acc += part * s[:, None]
            else:
                acc += part * s[None, :]
    if SWAP_AB:
        acc = tl.trans(acc)
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
    before ``k_end`` for one token, in fp32 ``[BLOCK_N]``: the codes read as int32 words
    (:func:`_word_ptrs`), each word's four products against four strided activation loads."""
    kw = k0 // 4 + tl.arange(0, BLOCK_K // 4)
    words = tl.load(
        _word_ptrs(w_ptr, rn, kw, stride_wn), mask=n_ok[:, None] & _words_in(kw, k_end), other=0
    )
    v0, v1, v2, v3 = e4m3_words_scaled_fp32(words)
    k_ok = kw < k_end // 4
    xs = x_row + kw * 4
    x0 = tl.load(xs, mask=k_ok, other=0.0).to(tl.float32)
    x1 = tl.load(xs + 1, mask=k_ok, other=0.0).to(tl.float32)
    x2 = tl.load(xs + 2, mask=k_ok, other=0.0).to(tl.float32)
    x3 = tl.load(xs + 3, mask=k_ok, other=0.0).to(tl.float32)
    products = v0 * x0[None, :] + v1 * x1[None, :] + v2 * x2[None, :] + v3 * x3[None, :]
    return tl.sum(products, axis=1)


@triton.jit
def word_tile(w_ptr, rn, n_ok, k0, k_end, stride_wn, BLOCK_K: tl.constexpr):
    """Rows ``rn`` and inputs ``k0 .. k0 + BLOCK_K`` of the weights as fp16 ``e4m3 * 2**-8``
    ``[BLOCK_N, BLOCK_K]`` in input order, read as int32 words (:func:`_word_ptrs`) and decoded
    in pairs; 0 for masked rows and inputs from ``k_end`` on."""
    kw = k0 // 4 + tl.arange(0, BLOCK_K // 4)
    words = tl.load(
        _word_ptrs(w_ptr, rn, kw, stride_wn), mask=n_ok[:, None] & _words_in(kw, k_end), other=0
    )
    v0, v1, v2, v3 = e4m3_words_scaled_fp16(words)
    # tl.join stacks along a new last axis: [row, j, p, q] is input 4j + 2p + q.
    quads = tl.join(tl.join(v0, v2), tl.join(v1, v3))
    return tl.reshape(quads, (quads.shape[0], BLOCK_K))


@triton.jit
def _word_ptrs(w_ptr, rn, kw, stride_wn):
    """Word ``kw`` (inputs ``4 kw .. 4 kw + 3``) of rows ``rn``: the codes' base, ``stride_wn``
    and the layer's input count are multiples of 4 (the launcher's ``words`` rule), and so are
    the tiles' and splits' first inputs."""
    return w_ptr.to(tl.pointer_type(tl.int32)) + rn[:, None] * (stride_wn // 4) + kw[None, :]


@triton.jit
def _words_in(kw, k_end):
    """The words before input ``k_end`` (a multiple of 4), ``[1, words]``. Compared as words,
    not as inputs (``4 kw < k_end``), so Triton's alignment analysis sees a mask constant over
    runs of 4 words and loads 16 bytes at a time (the inputs' form loads one word each)."""
    return (kw < k_end // 4)[None, :]
