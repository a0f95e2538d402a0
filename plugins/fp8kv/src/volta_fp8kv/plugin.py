"""The vllm-volta plugin entry point (``fp8kv = "volta_fp8kv.plugin"``).

Answers two host hooks: the KV-cache dtype verdict (rules in :mod:`volta_fp8kv.policy`) and the
kernel launch configurations for the SM70 compile gate (:mod:`volta_fp8kv.configs`). Both are
pure Python: loading this module imports no torch, triton or vLLM and compiles nothing.
"""

from __future__ import annotations

from volta_core import Device, KernelConfig, KVRequest, KVVerdict, hookimpl
from volta_fp8kv import configs, policy

VOLTA_HOST_API = "1.0"


@hookimpl
def volta_kv_cache_verdict(request: KVRequest) -> KVVerdict | None:
    """fp8_e5m2 everywhere, e4m3 from SM89, checkpoint scales honoured (see policy)."""
    return policy.kv_cache_verdict(request)


@hookimpl
def volta_kernel_configs(device: Device) -> list[KernelConfig]:
    """Every cache-write and gather configuration the wrappers launch on ``device``."""
    return configs.kernel_configs(device)
