"""Shared pieces for the core's tests: small in-process plugins built from declarations.

Also opts in to the test-only plugins (``VLLM_VOLTA_TEST_PLUGINS=1``, as the repository's root
``conftest.py`` does): ``pytest core/tests`` takes ``core/pyproject.toml`` as its rootdir and
does not load the root conftest.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from importlib import metadata
from typing import Any

import pytest

from volta_core import hookimpl
from volta_core.host import hookspecs
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import HOST_API_VERSION
from volta_core.host.types import AttentionBackendSpec

#: The test-only plugins (``tests/plugins`` at the repository root, installed by pip).
TEST_PLUGINS = "vllm-volta-test-healthy"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("VLLM_VOLTA_TEST_PLUGINS", "1")
    config.addinivalue_line(
        "markers",
        "needs(*distributions): skip unless these distributions are installed (the core's own "
        "run, `pip install ./core[test]`, has neither the plugins nor the test-only plugins)",
    )


def _installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip a ``needs`` test, naming what to install, where a distribution is missing."""
    for item in items:
        for mark in item.iter_markers("needs"):
            missing = [d for d in mark.args if not _installed(d)]
            if missing:
                where = "./tests/plugins/*" if TEST_PLUGINS in missing else "the repository's"
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"needs {', '.join(missing)} installed (pip install {where} "
                        "distributions; scripts/dev.sh installs them all)"
                    )
                )


class FakePlugin:
    """An in-process plugin: each keyword becomes the answer of the hook of that name."""

    def __init__(self, api: str | None = HOST_API_VERSION, **answers: Any) -> None:
        if api is not None:
            self.VOLTA_HOST_API = api
        for hook, answer in answers.items():
            setattr(self, hook, _impl(hook, answer))


def _impl(hook: str, answer: Any) -> Any:
    """A hookimpl taking the hook's own arguments and returning (or computing) ``answer``.

    ``functools.wraps`` points ``__wrapped__`` at the hookspec, so pluggy reads the spec's
    argument names; pluggy passes them positionally, the manager by keyword.
    """
    spec = getattr(hookspecs, hook)
    argnames = list(inspect.signature(spec).parameters)

    @functools.wraps(spec, assigned=("__name__", "__qualname__", "__doc__"), updated=())
    def impl(*args: Any, **kwargs: Any) -> Any:
        kwargs.update(zip(argnames[: len(args)], args, strict=True))
        return answer(**kwargs) if callable(answer) else answer

    return hookimpl(impl)


@pytest.fixture
def manager() -> VoltaPluginManager:
    """An empty manager, not connected to installed entry points."""
    return VoltaPluginManager()


def _backend(name: str, priority: int = 10, **overrides: Any) -> AttentionBackendSpec:
    """A Volta backend declaration with sensible defaults for tests."""
    fields: dict[str, Any] = {
        "name": name,
        "impl": f"tests:{name}",
        "priority": priority,
        "min_capability": (7, 0),
        "max_capability": (7, 5),
        "dtypes": {"float16"},
        "kv_cache_dtypes": {"float16", "fp8_e5m2"},
        "head_sizes": {64, 128, 256},
    }
    fields.update(overrides)
    return AttentionBackendSpec(**fields)


@pytest.fixture
def fake_plugin() -> type[FakePlugin]:
    """The in-process plugin class (fixtures, because importlib mode cannot import conftest)."""
    return FakePlugin


@pytest.fixture
def backend() -> Callable[..., AttentionBackendSpec]:
    """A factory of Volta backend declarations with test defaults."""
    return _backend
