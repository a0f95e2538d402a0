"""Triton kernels of the Volta attention backend (imported only when attention runs).

Importing this package keys both kernels, the host's shared FP8 decode first
(:func:`volta_core.kernel_api.settle_cache_keys`): they share helpers that read
``tl.constexpr`` globals, so with Triton 3.6 their cache keys would otherwise depend on which a
process keyed first, and a warmed cache would be partly missed.
"""

from volta_attn_v100.kernels.decode import paged_decode_kernel
from volta_attn_v100.kernels.prefill import paged_prefill_kernel
from volta_core.kernel_api import dequantize_tile, settle_cache_keys

settle_cache_keys(dequantize_tile, paged_decode_kernel, paged_prefill_kernel)

__all__ = [
    "paged_decode_kernel",
    "paged_prefill_kernel",
]
