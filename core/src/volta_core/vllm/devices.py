"""The device the adapter judges for: named by ``VLLM_VOLTA_DEVICE``, vLLM's CUDA device, or the
compute capabilities NVML reports before CUDA is initialised (the platform plugin's check).

vLLM is imported lazily, inside the functions that read it.
"""

from __future__ import annotations

import os
import re
import sys

from volta_core.device import Device, parse_device
from volta_core.errors import UsageError

ENV_DEVICE = "VLLM_VOLTA_DEVICE"


def judge_device() -> Device | None:
    """The device quant claims and KV verdicts are judged for: the one ``VLLM_VOLTA_DEVICE``
    names, else vLLM's CUDA device once vLLM's platforms are imported, else None
    (:mod:`volta_core.vllm.plugin` says why)."""
    named = os.environ.get(ENV_DEVICE)
    if named:
        try:
            return parse_device(named)
        except UsageError:
            match = re.fullmatch(r"(\d+)\.(\d+)", named.strip())
            if match is None:
                raise
            return Device((int(match[1]), int(match[2])), ENV_DEVICE)
    if "vllm.platforms" not in sys.modules:
        return None
    return current_cuda_device()


def current_cuda_device() -> Device | None:
    """The CUDA device vLLM runs on (from vLLM's current platform), None on any other."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return None
    capability = current_platform.get_device_capability()
    if capability is None:
        return None
    return Device((capability.major, capability.minor), current_platform.device_name)


def nvml_capabilities() -> list[tuple[int, int]] | None:
    """Compute capabilities of every visible NVIDIA GPU, read through NVML (no CUDA init)."""
    from vllm.utils.import_utils import import_pynvml

    pynvml = import_pynvml()
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        return [tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h)) for h in handles]
    finally:
        pynvml.nvmlShutdown()
