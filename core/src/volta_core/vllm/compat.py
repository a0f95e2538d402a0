"""The names code outside the adapter imported from ``volta_core.vllm.compat`` when it was one
module, kept working: each is defined in the feature module named below and only re-exported
here. New code imports from those modules.

- :mod:`volta_core.vllm.families`: the supported vLLM families and what differs between them
  (:data:`FAMILIES`, :class:`Family`, :func:`family`, :func:`unsupported_reason`...);
- :mod:`volta_core.vllm.devices`: the device the adapter judges for;
- :mod:`volta_core.vllm.reasoning_parser`: the vLLM reasoning-parser subclass;
- :mod:`volta_core.vllm.quantization`: the ``compressed-tensors``/``fp8`` config overrides
  (:data:`VoltaCompressedTensorsConfig` and :data:`VoltaFp8Config` are forwarded on access);
- :mod:`volta_core.vllm.backend_binding`: plugin backends bound to ``AttentionBackendEnum.CUSTOM``;
- :mod:`volta_core.vllm.platform_class`: the Volta CUDA platform class;
- :mod:`volta_core.vllm.model_config_hooks`: the Gemma-4 configuration hooks.
"""

from __future__ import annotations

from typing import Any

from volta_core.vllm import quantization
from volta_core.vllm.backend_binding import backend_class_path, bind_custom_backend
from volta_core.vllm.devices import (
    ENV_DEVICE,
    current_cuda_device,
    judge_device,
    nvml_capabilities,
)
from volta_core.vllm.families import (
    FAMILIES,
    SUPPORTED_LINE,
    VLLM_DISTRIBUTIONS,
    Family,
    Streaming,
    family,
    family_of,
    installed_vllm,
    is_cpu_build,
    unsupported_reason,
)
from volta_core.vllm.model_config_hooks import (
    PER_LAYER_HEAD_SIZE_ARCHS,
    make_model_config_overrides,
    register_model_config_overrides,
    routed_platform,
)
from volta_core.vllm.platform_class import (
    PLATFORM_QUALNAME,
    cuda_platform_base,
    make_platform_class,
    selector_layer,
)
from volta_core.vllm.quantization import (
    install_kv_method,
    make_quantization_overrides,
    quantization_overrides,
    register_quantization_overrides,
    routed_experts_class,
)
from volta_core.vllm.reasoning_parser import make_reasoning_parser, register_reasoning_parser

__all__ = [
    "ENV_DEVICE",
    "FAMILIES",
    "PER_LAYER_HEAD_SIZE_ARCHS",
    "PLATFORM_QUALNAME",
    "SUPPORTED_LINE",
    "VLLM_DISTRIBUTIONS",
    "Family",
    "Streaming",
    "backend_class_path",
    "bind_custom_backend",
    "cuda_platform_base",
    "current_cuda_device",
    "family",
    "family_of",
    "install_kv_method",
    "installed_vllm",
    "is_cpu_build",
    "judge_device",
    "make_model_config_overrides",
    "make_platform_class",
    "make_quantization_overrides",
    "make_reasoning_parser",
    "nvml_capabilities",
    "quantization_overrides",
    "register_model_config_overrides",
    "register_quantization_overrides",
    "register_reasoning_parser",
    "routed_experts_class",
    "routed_platform",
    "selector_layer",
    "unsupported_reason",
]


def __getattr__(name: str) -> Any:
    """``VoltaCompressedTensorsConfig`` and ``VoltaFp8Config``: the classes vLLM uses, built on
    first access in :mod:`volta_core.vllm.quantization`."""
    if name in ("VoltaCompressedTensorsConfig", "VoltaFp8Config"):
        return getattr(quantization, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
