"""The ``vllm.platform_plugins`` entry point: the Volta CUDA platform, on capability 7.x only.

vLLM calls :func:`detect` in every process while it picks its platform; one activated
out-of-tree platform wins over the built-in CUDA platform. It activates only when vLLM is a
supported CUDA build and every visible GPU is compute capability 7.x, and returns None
everywhere else, so it never takes over SM80+ GPUs, ROCm or CPU. (vLLM's CPU build does not
consult platform plugins at all.)
"""

from __future__ import annotations

import logging

from volta_core.device import Device
from volta_core.vllm import attention, devices, families, platform_class

log = logging.getLogger("volta_core.vllm")


def detect() -> str | None:
    """The Volta platform's class path when every visible GPU is 7.x, else None. Never raises."""
    try:
        if families.unsupported_reason() is not None or families.is_cpu_build():
            return None
        capabilities = devices.nvml_capabilities()
    except Exception as exc:
        log.debug("vllm-volta platform detection failed: %s", exc)
        return None
    if not capabilities or not all(attention.routes(Device(c)) for c in capabilities):
        return None
    return platform_class.PLATFORM_QUALNAME
