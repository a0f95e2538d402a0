"""pytest plugin for ``scripts/check_vllm.sh``: vLLM's CPU platform where the build names none.

vLLM 0.19 and 1Cat-vLLM choose the CPU platform only for a build whose version says ``cpu``
(``vllm/platforms/__init__.py``); their CUDA builds installed beside CPU torch, as the check
environments have them, would get no platform at all and no engine configuration could be built.
``VLLM_TARGET_DEVICE=cpu`` alone does that in vLLM 0.33. Loaded with ``-p``; changes nothing
where vLLM already found a platform.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    import vllm.platforms as platforms

    if platforms.current_platform.device_type:
        return
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()
