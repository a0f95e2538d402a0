"""The fused-MoE expert kernel: routed rows of one expert times its packed weights."""

from __future__ import annotations

import triton
import triton.language as tl

from volta_ct_wna16.kernels.dots import dequant_dot, dot_per_slot


# Not specialized, so that one build serves every batch and model, as the gate and warmup
# declare it (Triton's JIT would otherwise build another kernel for each argument's value of 1
# and for multiples of 16, ``triton/runtime/jit.py``): the pair count only bounds the row masks
# and the expert count is compared with the block's expert, so their values change no code;
# ``ROW_DIV`` and ``OUT_DIV`` are 1 or the router's top-k (gate/up reads a token's row for each
# of its pairs, down adds each pair into its token's row), so every launch passes 1 for one or
# both, and as the constant 1 they would only spare one integer division of ``BLOCK_M`` row
# indices a program.
@triton.jit(do_not_specialize=["PAIRS", "EXPERTS", "ROW_DIV", "OUT_DIV"])
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
    SWAP: tl.constexpr,
):
    """``out[p // OUT_DIV, n] (+)= r[p] * sum_k x[p // ROW_DIV, k] * dequant(W_e)[n, k]`` for
    the ``BLOCK_M`` routed pairs ``p`` of one block, ``e`` their expert, and ``BLOCK_N``
    outputs ``n`` (``r[p]`` the router weight with ``MUL_ROUTER``, else 1).

    The kernel of vLLM's fused MoE (``fused_moe_kernel``,
    ``vllm/model_executor/layers/fused_moe/fused_moe.py``) with this plugin's packed weights:
    one program per block of pairs sorted by expert (vLLM's ``moe_align_block_size`` layout)
    and output tile. The routed (token, slot) pairs come sorted by expert in blocks of ``BLOCK_M``
    (:func:`volta_ct_wna16.routing.route`): ``pair_ptr`` holds each block's pair indices
    (``PAIRS`` where a block is padded) and ``expert_ptr`` each block's expert (``EXPERTS`` for
    blocks past the routed pairs, which return at once: the grid is sized for the most blocks
    any routing can need, so it needs no count from the device). Input row of pair ``p`` is
    ``p // ROW_DIV`` (the token for gate/up, the pair itself for down); output row is
    ``p // OUT_DIV`` (the pair for gate/up; for down, the token, whose pairs are added into
    it). ``MUL_ROUTER`` multiplies each row by its router weight (``rw_ptr``, fp32) before the
    store. The expert's weights are the stacked tensors at ``e * stride_we`` (words) and
    ``e * stride_se`` (scales and zero points), each in the layer layout of
    :mod:`volta_ct_wna16.kernels`.

    The grid's third axis splits the input (``K_PER_SPLIT`` each) when a decode step routes
    too few blocks to fill the GPU. ``ATOMIC`` (split, or a token's pairs summed into one
    row) adds fp32 tiles into the zeroed output. ``SLOT_DOTS``: one dot per word slot
    (:func:`dot_per_slot`), as the dense decode tile; otherwise each tile is dequantized into
    input order for one dot.

    ``SWAP`` computes the transposed tile, ``[BLOCK_N, BLOCK_M]``, with the dequantized
    weights as the dot's first operand (:func:`dequant_dot` with ``SWAP``; ``Launch.swap``). On SM90
    ``tl.dot`` becomes ``wgmma``, whose first operand may come from registers and whose second
    only from shared memory. Unswapped, every input step stores the dequantized weights to
    shared memory and waits for each ``wgmma`` before the next dequantization (Triton 3.6's
    sm_90 TTGIR of the 64x128x64 tile: a ``local_alloc`` of the weights and
    ``warp_group_dot_wait {pendings = 0}`` in the loop); swapped, the weights stay in
    registers, the activations copied ahead by the software pipeline are the shared operand,
    and the products overlap the next dequantization (no such store, ``pendings = 3``). This
    is how Hopper's mixed-input GEMMs feed dequantized weights when the activations' rows are
    few (CUTLASS example 55, ``55_hopper_mixed_dtype_gemm``, and vLLM's Machete kernels):
    the routed rows become ``wgmma``'s N. It shortened both MoE layers' prefill on the H100
    (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#moe_large_swap).
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
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        if SLOT_DOTS:
            acc = dot_per_slot(
                acc, x_ptr, src, m_ok, w_e, s_e, z_e, k0, k_end, rn, n_ok, N, KW, GROUP,
                stride_xm, BITS, HAS_ZP, BLOCK_K // PACK, GROUP_TILE,
            )  # fmt: skip
        else:
            acc = dequant_dot(
                acc, x_ptr, src, m_ok, w_e, s_e, z_e, k0, k_end, rn, n_ok, N, KW, GROUP,
                stride_xm, BITS, HAS_ZP, BLOCK_K, BLOCK_N, GROUP_TILE, SWAP,
            )  # fmt: skip
    out_rows = pairs // OUT_DIV
    if SWAP:  # outputs down the tile, pairs across
        if MUL_ROUTER:
            acc *= tl.load(rw_ptr + pairs, mask=m_ok, other=0.0)[None, :]
        o = out_ptr + out_rows[None, :] * stride_om + rn[:, None]
        tile_ok = n_ok[:, None] & m_ok[None, :]
    else:
        if MUL_ROUTER:
            acc *= tl.load(rw_ptr + pairs, mask=m_ok, other=0.0)[:, None]
        o = out_ptr + out_rows[:, None] * stride_om + rn[None, :]
        tile_ok = m_ok[:, None] & n_ok[None, :]
    if ATOMIC:
        tl.atomic_add(o, acc, mask=tile_ok, sem="relaxed")
    else:
        tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=tile_ok)
