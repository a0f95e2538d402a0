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
    for key in ("VLLM_PLUGINS", "VLLM_VOLTA_PLUGINS", "VLLM_VOLTA_DEVICE", "VLLM_VOLTA_STRICT"):
        env.pop(key, None)
    env.update(extra)
    return env
