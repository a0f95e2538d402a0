"""The tiled GEMM for more tokens than the GEMV takes."""

from __future__ import annotations

import triton
import triton.language as tl

from volta_fp8w.kernels.dequant import FOLD, UNSPECIALIZED, tile_scales, weight_tile, x_tile
from volta_fp8w.kernels.splitk import store_out, word_tile


@triton.jit(do_not_specialize=UNSPECIALIZED)
def fp8w_gemm_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    out_ptr,
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WORDS: tl.constexpr,
):
    """``out[m, i] = sum_j x[m, j] * e4m3(w[i, j]) * scales[i // SCALE_N, j // SCALE_K]
    (+ b[i])`` for one ``[BLOCK_M, BLOCK_N]`` output tile over the whole input.

    Each ``BLOCK_K`` step decodes its ``[BLOCK_N, BLOCK_K]`` codes to fp16 ``e4m3 * 2**-8``,
    takes ``tl.dot`` of the activations with them (fp32 result) and multiplies that partial by
    the tile's scale per row, once per output (``BLOCK_K`` divides ``SCALE_K``,
    :func:`volta_fp8w.launch.fitted`); ``2**8`` is multiplied back at the end. ``WORDS``
    (codes, their row stride and the input count multiples of 4): the codes are read four to
    an int32 word and decoded in pairs (:func:`~volta_fp8w.kernels.splitk.word_tile`).
    Programs run ``GROUP_M`` row blocks of one output column block in turn, the grouped order
    of Triton's matrix-multiplication tutorial, so a weight tile's reads are shared in L2.
    """
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
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        if WORDS:
            w = word_tile(w_ptr, rn, n_ok, k0, K, stride_wn, BLOCK_K)
        else:
            w = weight_tile(w_ptr, rn, n_ok, kk, k_ok, stride_wn)
        s = tile_scales(s_ptr, rn, n_ok, k0, stride_sn, stride_sk, SCALE_N, SCALE_K)
        part = tl.dot(x_tile(x_ptr, rm, m_ok, kk, k_ok, stride_xm), tl.trans(w))
        acc += part * s[None, :]
    store_out(
        acc * FOLD, b_ptr, out_ptr, rm, rn, n_ok, m_ok[:, None] & n_ok[None, :], stride_om,
        HAS_BIAS,
    )  # fmt: skip
