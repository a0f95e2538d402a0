"""The tiled GEMM for more tokens than a decode tile takes (SM70: 17-32 tokens)."""

from __future__ import annotations

import triton
import triton.language as tl

from volta_ct_wna16.kernels.dots import dequant_dot
from volta_ct_wna16.kernels.epilogue import store_out


# The token count only bounds the row masks and orders the grid, so it is not specialized: one
# build serves every count, as the gate and warmup declare it (the JIT would otherwise build
# another for multiples of 16, which at sm_70 holds the same registers).
@triton.jit(do_not_specialize=["M"])
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
    """``out[m, n] = sum_k x[m, k] * (q[k, n] - z[k // GROUP, n]) * s[k // GROUP, n] (+ b[n])``
    for one ``[BLOCK_M, BLOCK_N]`` output tile over the whole input.

    Each ``BLOCK_K`` step dequantizes its weight tile word slot by word slot, interleaves it
    back into input order (``tl.join``) and takes one ``tl.dot``
    (:func:`~volta_ct_wna16.kernels.dots.dequant_dot`). Programs run ``GROUP_M`` row blocks of
    one output column block in turn, the grouped order of Triton's matrix-multiplication
    tutorial, so a weight tile's reads are shared in L2.
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
        acc = dequant_dot(
            acc, x_ptr, rm, m_ok, w_ptr, s_ptr, z_ptr, k0, K, rn, n_ok, N, KW, GROUP, stride_xm,
            BITS, HAS_ZP, BLOCK_K, BLOCK_N, False,
        )  # fmt: skip
    tile_ok = m_ok[:, None] & n_ok[None, :]
    store_out(acc, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, stride_om, HAS_BIAS)
