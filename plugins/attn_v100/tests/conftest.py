"""Kernel tests run interpreted on CPU (CI) and compiled on CUDA (``-m gpu``).

The toolkit's pytest plugin (``volta_devkit.testing``) normally sets ``TRITON_INTERPRET``
and registers the ``gpu`` marker; this conftest does the same minimal things so the suite also
runs where that plugin is not loaded. It must run before any kernel module is imported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


def _has_gpu() -> bool:
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return False
    import torch

    return bool(torch.cuda.is_available())


# Shared test helpers (attn_v100_cases) live beside the tests; importlib mode does not add
# this directory to sys.path by itself.
sys.path.insert(0, str(Path(__file__).parent))

HAS_GPU = _has_gpu()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (select with -m gpu)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none here")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Qwen3 of the engine tests, saved once per session
    (:func:`attn_v100_cases.save_tiny_qwen3`)."""
    from attn_v100_cases import save_tiny_qwen3

    return save_tiny_qwen3(tmp_path_factory.mktemp("tiny_qwen3"))
