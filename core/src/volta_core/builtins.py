"""vLLM's own attention backends, declared with the limits they really have on CUDA.

The host falls back to these only where they are valid for a layer. The declarations are read
from vLLM 0.32/0.33 (``vllm/v1/attention/backends/triton_attn.py``): TRITON_ATTN accepts any
head size of at least 32 and block sizes that are multiples of 16, but its impl raises for any
fp8 KV cache below SM89 and for a bf16 KV cache below SM80 (FACTS.md 3), which
``kv_dtype_min_capability`` records so a plan never picks it where it would fail.
"""

from __future__ import annotations

from volta_core.types import AttentionBackendSpec, AttentionFeature

TRITON_ATTN = AttentionBackendSpec(
    name="TRITON_ATTN",
    impl="vllm.v1.attention.backends.triton_attn:TritonAttentionBackend",
    priority=0,
    min_capability=(7, 0),
    max_capability=(12, 9),
    dtypes=frozenset({"float16", "bfloat16", "float32"}),
    kv_cache_dtypes=frozenset({"float16", "bfloat16", "float32", "fp8_e4m3", "fp8_e5m2"}),
    min_head_size=32,
    kv_dtype_min_capability={"fp8_e4m3": (8, 9), "fp8_e5m2": (8, 9), "bfloat16": (8, 0)},
    block_size_multiple=16,
    features=frozenset(AttentionFeature),
    vllm_name="TRITON_ATTN",
    builtin=True,
    notes="vLLM built-in; fallback only where valid",
)

#: Built-in backends in the order the host falls back to them.
BUILTIN_BACKENDS: tuple[AttentionBackendSpec, ...] = (TRITON_ATTN,)
