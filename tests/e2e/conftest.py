"""Fixtures of the end-to-end tests: the scripted checkpoints; the ``e2e`` marker.

Every test here runs real vLLM (the CPU build in CI). They are marked ``e2e`` so they can be
selected (``pytest -m e2e``) or left out (``-m "not e2e"``); the default run includes them.
"""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The scripted checkpoints: W4A16 weight-only, and W4A16 with an fp8 KV scheme."""
    root = tmp_path_factory.mktemp("tiny-qwen3")
    return {
        "w4a16": tiny_model.write_w4a16(root / "w4a16"),
        "w4a16-kv": tiny_model.write_w4a16(root / "w4a16-kv", fp8_kv_scheme="tensor"),
    }
