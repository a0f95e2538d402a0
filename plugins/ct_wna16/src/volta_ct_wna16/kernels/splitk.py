"""The decode kernel: one output tile over one split of the input, the splits summed in the
same launch (:mod:`volta_ct_wna16.kernels.epilogue`)."""

from __future__ import annotations

import triton
import triton.language as tl

from volta_ct_wna16.kernels.dequant import load_words, slot_f32
from volta_ct_wna16.kernels.dots import dequant_dot, dot_per_slot
from volta_ct_wna16.kernels.epilogue import accumulate_splits, reduce_splits, store_out
from volta_ct_wna16.kernels.gemv import GEMV_SUB, gemv_sub, sub_tile, x_tile


# The token count only bounds the row masks and sizes the split partials, so it is not
# specialized: one build serves every count, as the gate and warmup declare it (the JIT would
# otherwise build another for 1 token and for multiples of 16, which at sm_70 hold the same
# registers).
@triton.jit(do_not_specialize=["M"])
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
    """``out[m, n] = sum_k x[m, k] * (q[k, n] - z[k // GROUP, n]) * s[k // GROUP, n] (+ b[n])``
    for one ``[BLOCK_M, BLOCK_N]`` output tile, each program summing one split of
    ``K_PER_SPLIT`` inputs; the splits are summed in the same launch.

    One of three inner steps: ``BLOCK_M == 1`` without ``USE_DOT``, the GEMV over 32-input
    sub-tiles (:func:`~volta_ct_wna16.kernels.gemv.gemv_sub`), reduced across the input once at
    the end; ``BLOCK_M > 1`` without ``USE_DOT``, a shift-and-mask FMA loop with a token axis
    (SM70, 2 to 4 tokens); ``USE_DOT``, dequantized fp16 tiles into ``tl.dot``
    (:mod:`volta_ct_wna16.kernels.dots`).

    The input loop is software-pipelined ``NUM_STAGES`` deep where Triton pipelines (SM80+;
    1 on SM70): Triton 3.6 pipelines a loop without ``tl.dot`` only when asked through
    ``tl.range``, and the 1-token GEMV is latency-bound without it (one small load per
    iteration, waited for). ``GROUP_TILE``: every tile lies inside one quantization group
    (:func:`load_words`). ``REDUCE_UNROLL``: the fan-in of the fused reduction's tree, whose
    unrolled loads issue together, one L2 round trip per ``REDUCE_UNROLL`` partials (wide dot
    tiles need few, or they spill). ``SLOT_DOTS`` (with ``USE_DOT``): one dot per word slot,
    set by :func:`volta_ct_wna16.launch.slot_dots`, which the launcher also asks whether the
    activations need 4-byte aligned rows. ``WHOLE``: every tile lies
    inside the layer (:func:`volta_ct_wna16.launch.whole_tiles`), so the 1-token GEMV and the
    slot-dot tiles load weights, scales and activations without input or output masks.

    The grid is ``(row blocks, output blocks, splits)``, row blocks first, so the programs
    that read one weight tile for different rows run side by side and share its reads in L2.
    With ``USE_WS`` the grid's third axis is the split: every program stores its fp32 partial
    to ``ws_ptr[split]`` and the tile is reduced by
    :func:`~volta_ct_wna16.kernels.epilogue.reduce_splits`, whose counters in ``cnt_ptr`` are
    zero before the launch and again after it, so the next launch on the stream (a CUDA graph
    replay included) needs no memset. With ``ATOMIC`` too, the splits add their partials into
    one fp32 tile instead (:func:`~volta_ct_wna16.kernels.epilogue.accumulate_splits`).

    References: split-K as in CUTLASS's serial split-K (``SplitKSerial``,
    ``cutlass/gemm/kernel/gemm.h``); the integer-to-float conversion of vLLM's Marlin
    (``csrc/quantization/marlin/dequant.h``); Triton's ``tl.dot`` on SM70 uses the FMA units
    (triton-lang/triton#5066).
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
            acc = dot_per_slot(
                acc, x_ptr, rm, m_ok, w_ptr, s_ptr, z_ptr, k0, k_end, rn, n_ok, N, KW, GROUP,
                stride_xm, BITS, HAS_ZP, BKP, GROUP_TILE, WHOLE,
            )  # fmt: skip
        elif USE_DOT:
            acc = dequant_dot(
                acc, x_ptr, rm, m_ok, w_ptr, s_ptr, z_ptr, k0, k_end, rn, n_ok, N, KW, GROUP,
                stride_xm, BITS, HAS_ZP, BLOCK_K, BLOCK_N, GROUP_TILE,
            )  # fmt: skip
        elif BLOCK_M == 1:
            xt = x_tile(x_ptr, k0, k_end, PACK, BLOCK_K // GEMV_SUB, WHOLE)
            for sub in tl.static_range(BLOCK_K // GEMV_SUB):
                acc2 += gemv_sub(
                    sub_tile(xt, sub, BLOCK_K // GEMV_SUB),
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
            t, s, z = load_words(
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
                part3 += xj[:, :, None] * slot_f32(t, c32, j, BITS)[None, :, :]
            acc3 += part3 * s.to(tl.float32)[None, :, :]
    if USE_DOT:
        res = acc
    elif BLOCK_M == 1:
        res = tl.sum(acc2, axis=0)[None, :]
    else:
        res = tl.sum(acc3, axis=1)
    tile_ok = m_ok[:, None] & n_ok[None, :]
    if USE_WS and ATOMIC:
        accumulate_splits(
            res, ws_ptr, cnt_ptr, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, N, stride_om, HAS_BIAS
        )
    elif USE_WS:
        reduce_splits(
            res, ws_ptr, cnt_ptr, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, M, N, stride_om,
            HAS_BIAS, REDUCE_UNROLL,
        )  # fmt: skip
    else:
        store_out(res, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, stride_om, HAS_BIAS)
