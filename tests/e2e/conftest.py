"""Shared fixtures of the end-to-end tests: the scripted checkpoints and vLLM's environment.

Every test here runs real vLLM (the CPU build in CI). They are marked ``e2e`` so they can be
selected (``pytest -m e2e``) or left out (``-m "not e2e"``); the default run includes them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import tiny_model  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end-to-end test on a real vLLM engine or vLLM objects")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == HERE:
            item.add_marker(pytest.mark.e2e)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


requires_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The scripted checkpoints: dense bf16, W4A16 weight-only, W4A16 with an fp8 KV scheme."""
    root = tmp_path_factory.mktemp("tiny-qwen3")
    return {
        "dense": tiny_model.write_dense(root / "dense"),
        "w4a16": tiny_model.write_w4a16(root / "w4a16"),
        "w4a16-kv": tiny_model.write_w4a16(root / "w4a16-kv", fp8_kv_scheme="tensor"),
    }


def engine_env(**extra: str) -> dict[str, str]:
    """The environment a spawned vLLM runs in: CPU-friendly, quiet, deterministic."""
    env = dict(os.environ)
    env.update(
        {
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "VLLM_LOGGING_LEVEL": "INFO",
        }
    )
    for key in ("VLLM_PLUGINS", "VLLM_VOLTA_PLUGINS", "VLLM_VOLTA_DEVICE", "VLLM_VOLTA_STRICT"):
        env.pop(key, None)
    env.update(extra)
    return env
