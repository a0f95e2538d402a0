"""Discovery: the installed plugins loaded into one manager, as the environment asks.

``VLLM_VOLTA_PLUGINS`` filters by name (before import), ``VLLM_VOLTA_STRICT`` makes failures
errors and ``VLLM_VOLTA_TEST_PLUGINS`` adds the test-only entry-point group;
:func:`get_plugin_manager` is the process-wide manager, discovered once.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping

from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import (
    ENTRY_POINT_GROUP,
    ENV_ONLY,
    ENV_TEST_PLUGINS,
    TEST_ENTRY_POINT_GROUP,
    _env_flag,
    _env_names,
    strict_mode,
)


def discover(
    environ: Mapping[str, str] | None = None,
    factory: Callable[..., VoltaPluginManager] = VoltaPluginManager,
) -> VoltaPluginManager:
    """Build a manager and load the installed plugins, honouring the environment switches.

    ``VLLM_VOLTA_PLUGINS`` filters by name, ``VLLM_VOLTA_STRICT`` makes failures errors, and
    ``VLLM_VOLTA_TEST_PLUGINS`` adds the test-only entry-point group.
    """
    env = os.environ if environ is None else environ
    manager = factory(strict=strict_mode(env))
    groups = [ENTRY_POINT_GROUP]
    if _env_flag(env.get(ENV_TEST_PLUGINS)):
        groups.append(TEST_ENTRY_POINT_GROUP)
    manager.load_entrypoints(_env_names(env.get(ENV_ONLY)), groups)
    return manager


@functools.cache
def get_plugin_manager() -> VoltaPluginManager:
    """The process-wide manager, discovered once (so each failure is logged once)."""
    return discover()
