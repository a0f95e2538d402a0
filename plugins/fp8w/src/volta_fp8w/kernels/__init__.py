"""Triton kernels for ``y = x @ W.T (+ bias)`` with e4m3fn weights and fp16 activations (W8A16),
imported only when a layer runs.

Layout (made at load time by :mod:`volta_fp8w.layout`): ``weight`` uint8 ``[N, K]``, the e4m3fn
codes as the checkpoint stores them (each output row's inputs contiguous), and ``scales``
float32 ``[ceil(N / block_n), ceil(K / block_k)]``, so that

    W[i, j] = e4m3(weight[i, j]) * scales[i // block_n, j // block_k].

The kernels decode codes in registers to fp16 values ``2**-8`` times theirs
(:func:`~volta_fp8w.kernels.e4m3.e4m3_scaled_fp16`, exact; SM70 has no FP8 conversion), sum a
tile's products in fp32, and multiply the tile's scale once per (token, row): the input tile is
fitted inside one scale block (:func:`volta_fp8w.launch.fitted`), and ``2**8`` is multiplied
back once per output. Which kernel and tile a call runs is :mod:`volta_fp8w.dispatch`'s answer:

* :mod:`.splitk`: the GEMV for 1 to 8 tokens, one output tile over one split of the input,
  the splits summed atomically in the same launch;
* :mod:`.gemm`: a tiled GEMM (``tl.dot`` on decoded fp16 tiles) for more tokens;
* :mod:`.dequant`: the tile loads the others share, and ``W`` in fp16 for cuBLAS (tensor
  cores on a V100, which Triton's ``tl.dot`` does not use there: triton-lang/triton#5066);
* :mod:`.e4m3`: the code-to-fp16 conversions;
* :mod:`.moe`: the fused-MoE kernels on every local expert's stacked weights.

Importing this package keys every kernel in one order
(:func:`volta_core.kernel_api.settle_cache_keys`):
the kernels share the word decoders, which read ``tl.constexpr`` globals, so with Triton 3.6
their cache keys would otherwise depend on which a process keyed first, and a warmed cache
would be partly missed.
"""

from volta_core.kernel_api import settle_cache_keys
from volta_fp8w.kernels import moe
from volta_fp8w.kernels.dequant import fp8w_dequant_kernel
from volta_fp8w.kernels.gemm import fp8w_gemm_kernel
from volta_fp8w.kernels.splitk import fp8w_splitk_kernel

settle_cache_keys(
    fp8w_splitk_kernel,
    fp8w_gemm_kernel,
    fp8w_dequant_kernel,
    moe.moe_gemv_gate_up_kernel,
    moe.moe_gemv_down_kernel,
    moe.moe_sum_kernel,
    moe.moe_count_kernel,
    moe.moe_place_kernel,
    moe.moe_gate_up_kernel,
    moe.moe_down_kernel,
)

__all__ = ["fp8w_dequant_kernel", "fp8w_gemm_kernel", "fp8w_splitk_kernel"]
