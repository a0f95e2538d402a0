"""Repository-wide pytest hook: how the suite spreads over pytest-xdist workers.

``scripts/dev.sh test`` runs the suite on two workers (``-n 2 --dist loadgroup``: CI has two
cores, and most of the suite, compile-gate and interpreter cases, is one core's work per test).
A test that uses a module- or session-scoped fixture joins its module's group, so what such a
fixture builds (an engine, a server, a checkpoint) is built once, on one worker; every other
test goes to whichever worker is free. Without xdist the marks do nothing.

The suite also opts in to the test-only plugins (``tests/plugins``, entry-point group
``vllm_volta.test_plugins``) with ``VLLM_VOLTA_TEST_PLUGINS=1``, inherited by every process a test
starts; a user's environment never loads them.
"""

from __future__ import annotations

import os

import pytest

SHARED_SCOPES = {"module", "package", "session"}


def _shares_a_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definition.scope in SHARED_SCOPES
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("VLLM_VOLTA_TEST_PLUGINS", "1")
    config.addinivalue_line("markers", "xdist_group(name): run on one pytest-xdist worker")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the marks into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
