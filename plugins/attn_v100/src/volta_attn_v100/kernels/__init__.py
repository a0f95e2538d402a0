"""Triton kernels of the Volta attention backend (imported only when attention runs).

Importing this package keys both kernels (``JITFunction.cache_key``), the shared FP8 decode
first, so that their Triton cache keys are the same in every process, whatever it launches or
keys first. Triton 3.6 hashes a function's source, each callee's ``cache_key`` and the
``tl.constexpr`` globals in its ``used_global_vals`` (``triton/runtime/jit.py``
``JITCallable.cache_key``, l.495-515), and ``DependenciesFinder._update_hash`` (l.99-115)
merges a callee's ``used_global_vals`` into its caller's *before* it asks the callee's
``cache_key``, which is what fills them: a caller keyed before its callees misses their globals
(``LOG2E``, ``ALL_MASKED``... in :mod:`~volta_attn_v100.kernels.common`), one keyed after them
has them. The kernels share most helpers, so the second kernel keyed found them keyed by the
first, and ``load_kv_tile`` also calls the host codec's ``dequantize_tile``, which fp8kv's
gather may have keyed already; the keys then depended on the process's history, and a cache
warmed by one process (``vllm-volta warmup``) was partly missed by another (``vllm serve``).
Keyed here, in one order, before anything can launch them, every process computes the same
keys. ``dequantize_tile``'s own key is the same whoever keys it: it reads one global and its
callees none. (Triton fixed the order upstream in triton-lang/triton#10494; the keys differ
between Triton versions anyway, which is in every key.)
"""

from triton.runtime.jit import JITFunction

from volta_attn_v100.kernels.decode import paged_decode_kernel
from volta_attn_v100.kernels.prefill import paged_prefill_kernel
from volta_core.kernel_api import dequantize_tile


def _key_in_order(*functions: object) -> None:
    """Compute each function's Triton cache key, in this order (the interpreter,
    ``TRITON_INTERPRET=1``, compiles nothing and has no keys)."""
    for function in functions:
        if isinstance(function, JITFunction):
            function.cache_key  # noqa: B018 (read for its effect: see the module docstring)


_key_in_order(dequantize_tile, paged_decode_kernel, paged_prefill_kernel)

__all__ = [
    "paged_decode_kernel",
    "paged_prefill_kernel",
]
