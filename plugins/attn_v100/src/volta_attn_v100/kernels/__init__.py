"""Triton kernels of the Volta attention backend (imported only when attention runs)."""

from volta_attn_v100.kernels.decode import paged_decode_kernel
from volta_attn_v100.kernels.prefill import paged_prefill_kernel

__all__ = [
    "paged_decode_kernel",
    "paged_prefill_kernel",
]
