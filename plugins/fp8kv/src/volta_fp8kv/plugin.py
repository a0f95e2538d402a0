"""The vllm-volta plugin entry point (``fp8kv = "volta_fp8kv.plugin"``).

Answers three host hooks: the KV-cache dtype verdict (rules in :mod:`volta_fp8kv.policy`), the
KV-cache formats this plugin owns and writes (:mod:`volta_fp8kv.cache_ops`), and the kernel
launch configurations for the SM70 compile gate (:mod:`volta_fp8kv.configs`). All are pure
Python: loading this module imports no torch, triton or vLLM and compiles nothing.
"""

from __future__ import annotations

from volta_core import (
    PACKED_KV_LAYOUT,
    Device,
    KernelConfig,
    KVCacheOpsSpec,
    KVRequest,
    KVVerdict,
    hookimpl,
)
from volta_fp8kv import configs, policy

VOLTA_HOST_API = "1.0"

#: The writer of every format below, imported only when a layer's backend asks the host for it.
WRITER = "volta_fp8kv.cache_ops:write"


@hookimpl
def volta_kv_cache_verdict(request: KVRequest) -> KVVerdict | None:
    """fp8_e5m2 everywhere, e4m3 from SM89, checkpoint scales honoured (see policy)."""
    return policy.kv_cache_verdict(request)


@hookimpl
def volta_kv_cache_ops() -> list[KVCacheOpsSpec]:
    """The packed layout in float16, fp8_e5m2 and fp8_e4m3: this plugin defines the FP8 codes
    and scale semantics (:mod:`volta_fp8kv.format`), so every backend's cache holds its codes.
    e4m3 is declared too; it needs SM89, which the backends' KV-dtype rules and the writer
    enforce."""
    return [
        KVCacheOpsSpec(
            kv_cache_dtype=dtype,
            impl=WRITER,
            layout=PACKED_KV_LAYOUT,
            description=f"{dtype} in [blocks, kv_heads, block_size, K|V], written by fp8kv",
        )
        for dtype in configs.FORMAT_CODES
    ]


@hookimpl
def volta_kernel_configs(device: Device) -> list[KernelConfig]:
    """Every cache-write and gather configuration the wrappers launch on ``device``."""
    return configs.kernel_configs(device)
