"""Triton kernels for ``y = x @ dequant(W).T (+ bias)`` with compressed-tensors int4/int8 weights,
and the fused-MoE step's routing and activation (imported only when a layer runs).

Layout (made at load time by :func:`volta_ct_wna16.layout.prepare`): ``qweight`` int32
``[ceil(K / pack), N]``, the checkpoint's words transposed so that the output dimension is
contiguous: word ``kw`` of column ``n`` holds input elements ``pack*kw .. pack*kw + pack-1`` of
output ``n`` in bits ``bits*j``, offset by ``2**(bits-1)`` (compressed-tensors' ``pack-quantized``
packing). Every tile load is then a run of whole words along N (coalesced, vectorized), and the
``j``-th value of every word in a tile is one shift and mask away. Scales are ``[groups, N]``
fp16 and zero points (asymmetric only) fp16 ``[groups, N]`` holding the stored value, so
``dequant(W)[n, k] = (q - z) * s`` with ``z = 2**(bits-1)`` when symmetric.

One module per kernel family; which kernel and tile a call runs is
:mod:`volta_ct_wna16.dispatch`'s answer:

* :mod:`.splitk`: decode, one output tile over one split of the input, the splits summed in
  the same launch (:mod:`.epilogue`); the 1-token GEMV (:mod:`.gemv`), a multi-token FMA tile,
  or dot tiles (:mod:`.dots`);
* :mod:`.gemm`: a tiled GEMM, no split-K (SM70, 17-32 tokens);
* :mod:`.dequant`: the word-to-value conversions, and ``dequant(W).T`` written for cuBLAS
  (tensor cores on a V100, which Triton's ``tl.dot`` does not use there: triton-lang/triton#5066);
* :mod:`.moe`, :mod:`.routing`, :mod:`.activation`: the fused-MoE step over routed blocks;
  :mod:`.moe_decode`: the decode step (1-16 tokens) straight from the router's ids, and
  :func:`.routing.topk_softmax_kernel`, the router's top-k from its logits.

Importing this package keys every kernel in one order
(:func:`volta_core.kernel_api.settle_cache_keys`):
the decode kernels share helpers that read ``tl.constexpr`` globals (``GEMV_SUB``), so with
Triton 3.6 their cache keys would otherwise depend on which a process keyed first, and a
warmed cache would be partly missed.
"""

from volta_core.kernel_api import settle_cache_keys
from volta_ct_wna16.kernels.activation import silu_mul_kernel
from volta_ct_wna16.kernels.dequant import wna16_dequant_kernel
from volta_ct_wna16.kernels.gemm import wna16_gemm_kernel
from volta_ct_wna16.kernels.moe import wna16_moe_kernel
from volta_ct_wna16.kernels.moe_decode import (
    moe_decode_down_kernel,
    moe_decode_fused_kernel,
    moe_decode_gate_up_kernel,
)
from volta_ct_wna16.kernels.routing import moe_count_kernel, moe_place_kernel, topk_softmax_kernel
from volta_ct_wna16.kernels.splitk import wna16_splitk_kernel

settle_cache_keys(
    wna16_splitk_kernel,
    wna16_gemm_kernel,
    wna16_dequant_kernel,
    moe_decode_gate_up_kernel,
    moe_decode_down_kernel,
    moe_decode_fused_kernel,
    wna16_moe_kernel,
    moe_count_kernel,
    moe_place_kernel,
    topk_softmax_kernel,
    silu_mul_kernel,
)

__all__ = [
    "moe_count_kernel",
    "moe_decode_down_kernel",
    "moe_decode_fused_kernel",
    "moe_decode_gate_up_kernel",
    "moe_place_kernel",
    "silu_mul_kernel",
    "topk_softmax_kernel",
    "wna16_dequant_kernel",
    "wna16_gemm_kernel",
    "wna16_moe_kernel",
    "wna16_splitk_kernel",
]
