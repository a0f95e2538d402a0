"""Codes to values: the tile loads every kernel takes, and :func:`fp8w_dequant_kernel`, which
writes ``W`` in fp16 for cuBLAS.

A weight tile is ``[BLOCK_N, BLOCK_K]`` codes of ``BLOCK_N`` output rows, loaded along the
input (each row's codes contiguous, so the loads are coalesced and vectorized), decoded to fp16
values ``2**-8`` times the codes' (:func:`~volta_fp8w.kernels.e4m3.e4m3_scaled_fp16`). The
launcher fits ``BLOCK_K`` to the layer's scale blocks (:func:`volta_fp8w.launch.fitted`), so a
tile takes one scale per row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_fp8w.kernels.e4m3 import E4M3_FOLD, e4m3_scaled_fp16

#: :data:`~volta_fp8w.kernels.e4m3.E4M3_FOLD` as the kernels read it (a global a kernel reads
#: must be a ``tl.constexpr``).
FOLD = tl.constexpr(E4M3_FOLD)

#: Integer arguments of the layer kernels the JIT does not specialize, so that one build serves
#: every layer, as the gate and warmup declare it: a scale row's block and the scales' strides
#: only index one scale per row and tile, and are 1, multiples of 16 or neither by layer kind
#: and shape (rows of per-channel or per-tensor scales, blocks of 128, ``K / 128``). At sm_70
#: a block-scaled layer's builds hold the same registers either way; with per-row scales as
#: constants 7 of the 15 1-token GEMV builds would hold 7-8 fewer (one program an SM more; not
#: timed), not worth a second build of every layer kernel.
SCALE_ARGS = ("SCALE_N", "stride_sn", "stride_sk")

#: :data:`SCALE_ARGS` and the token count, which only bounds the row masks (the JIT would
#: otherwise build another kernel for 1 token and for multiples of 16, which at sm_70 hold the
#: same registers).
UNSPECIALIZED = ("M", *SCALE_ARGS)


@triton.jit
def weight_tile(w_ptr, rn, n_ok, kk, k_ok, stride_wn):
    """Rows ``rn`` and inputs ``kk`` of the weights as fp16 ``e4m3 * 2**-8``, 0 where masked."""
    codes = tl.load(
        w_ptr + rn[:, None] * stride_wn + kk[None, :],
        mask=n_ok[:, None] & k_ok[None, :],
        other=0,
    )
    return e4m3_scaled_fp16(codes)


@triton.jit
def tile_scales(s_ptr, rn, n_ok, k0, stride_sn, stride_sk, SCALE_N, SCALE_K):
    """The scale of each row ``rn`` for the tile from input ``k0`` on, fp32 ``[BLOCK_N]``:
    ``scales[rn // SCALE_N, k0 // SCALE_K]`` (0 where masked)."""
    s_row = s_ptr + (rn // SCALE_N) * stride_sn
    return tl.load(s_row + (k0 // SCALE_K) * stride_sk, mask=n_ok, other=0.0)


@triton.jit
def x_tile(x_ptr, rm, m_ok, kk, k_ok, stride_xm):
    """Activations of tokens ``rm`` and inputs ``kk``, fp16 ``[BLOCK_M, BLOCK_K]`` (0 masked)."""
    return tl.load(
        x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0
    )


@triton.jit(do_not_specialize=SCALE_ARGS)
def fp8w_dequant_kernel(
    w_ptr,
    s_ptr,
    out_ptr,
    N,
    K,
    stride_wn,
    stride_sn,
    stride_sk,
    stride_on,
    SCALE_N,
    SCALE_K,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``out[i, j] = e4m3(w[i, j]) * scales[i // SCALE_N, j // SCALE_K]`` in fp16, one
    ``[BLOCK_N, BLOCK_K]`` tile a program: ``W`` as ``nn.Linear`` holds it, ``[N, K]`` rows
    contiguous, for cuBLAS's ``x @ W.T`` (a transposed operand, no copy), which has the V100's
    tensor cores. The product is ``(e4m3 * 2**-8) * (scale * 2**8)`` in fp32: the powers of two
    cancel exactly, so it rounds as ``e4m3 * scale`` does in fp32 before the fp16 store."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    kk = k0 + tl.arange(0, BLOCK_K)
    n_ok = rn < N
    k_ok = kk < K
    w = weight_tile(w_ptr, rn, n_ok, kk, k_ok, stride_wn)
    s = tile_scales(s_ptr, rn, n_ok, k0, stride_sn, stride_sk, SCALE_N, SCALE_K)
    values = w.to(tl.float32) * (s * FOLD)[:, None]
    tl.store(
        out_ptr + rn[:, None] * stride_on + kk[None, :],
        values.to(tl.float16),
        mask=n_ok[:, None] & k_ok[None, :],
    )
