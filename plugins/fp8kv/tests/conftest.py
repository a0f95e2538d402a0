"""Test set-up: the Triton interpreter on machines without CUDA, and the ``gpu`` marker.

The kernel toolkit's pytest plugin (``volta_core.kernels.testing``) does the same when it is
loaded; this keeps the plugin's suite self-sufficient (``pip install ./plugins/fp8kv`` with the
core alone). The interpreter must be chosen before any kernel module is imported.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    """Where the non-GPU tests run their kernels: the interpreter on CPU tensors."""
    return "cpu"
