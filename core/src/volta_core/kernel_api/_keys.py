"""Triton cache keys that do not depend on a process's history.

Triton 3.6 keys a ``@triton.jit`` function by its source, each callee's key and the
``tl.constexpr`` globals in its ``used_global_vals`` (``triton/runtime/jit.py``,
``JITCallable.cache_key``), and ``DependenciesFinder._update_hash`` merges a callee's globals
into its caller's *before* it asks the callee's key, which is what fills them: a kernel keyed
before the helpers it calls misses their globals, one keyed after them has them. Kernels that
share helpers reading such globals then get keys that depend on which a process keyed first,
and a cache warmed by one process (``vllm-volta warmup``) is partly missed by another
(``vllm serve``). Keying a package's kernels in one fixed order when it is imported, before
anything can launch them, makes every process compute the same keys (Triton fixed the order
upstream in triton-lang/triton#10494; keys differ between Triton versions anyway, which is in
every key).
"""

from __future__ import annotations

from triton.runtime.jit import JITFunction


def settle_cache_keys(*functions: object) -> None:
    """Compute each Triton JIT function's cache key now, in this order (call it where a kernel
    package is imported, with the helpers that several kernels share first). Under the
    interpreter (``TRITON_INTERPRET=1``) the functions are not ``JITFunction``\\s and have no
    keys: nothing to do."""
    for function in functions:
        if isinstance(function, JITFunction):
            function.cache_key  # noqa: B018 (read for its effect: the key is computed and kept)
