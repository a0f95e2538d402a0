"""vLLM's CPU platform, in every process, for a CUDA build of vLLM checked on a CPU-only machine.

vLLM 0.19 and 1Cat-vLLM choose their CPU platform only for a build whose version says ``cpu``
(``vllm/platforms/__init__.py``), so their CUDA builds, installed beside CPU torch by
``scripts/check_vllm.sh``, would get no platform and no engine configuration could be built
(``VLLM_TARGET_DEVICE=cpu`` alone does it in vLLM 0.33). With ``VOLTA_TEST_CPU_PLATFORM=1`` this
platform plugin names vLLM's own CPU platform (an out-of-tree platform wins over the built-ins);
unset, it names none and vLLM chooses as always.
"""

from __future__ import annotations

import os

ENV = "VOLTA_TEST_CPU_PLATFORM"


def detect() -> str | None:
    if os.environ.get(ENV) != "1":
        return None
    return "vllm.platforms.cpu.CpuPlatform"
