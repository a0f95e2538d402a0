"""Repository-wide pytest settings.

``scripts/dev.sh test`` runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``:
CI has two cores); ``volta_devkit.testing``, loaded by ``addopts``, keeps the tests that share a
module or session fixture on one worker.

The suite opts in to the test-only plugins (``tests/plugins``, entry-point group
``vllm_volta.test_plugins``) with ``VLLM_VOLTA_TEST_PLUGINS=1``, inherited by every process a test
starts; a user's environment never loads them.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("VLLM_VOLTA_TEST_PLUGINS", "1")
