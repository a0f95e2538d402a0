"""The Volta CUDA platform class vLLM imports when :func:`volta_core.vllm.platform.detect` names it.

Only importable where vLLM's CUDA platform is (a CUDA build of vLLM); the behaviour lives in
:func:`volta_core.vllm.platform_class.make_platform_class`, which the tests apply to other bases.
"""

from __future__ import annotations

from volta_core.host.discovery import get_plugin_manager
from volta_core.vllm.platform_class import cuda_platform_base, make_platform_class

VoltaCudaPlatform = make_platform_class(cuda_platform_base(), get_plugin_manager)
