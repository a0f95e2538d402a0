"""What the host records of each plugin, and the switches it reads from the environment.

A discovered plugin leaves a :class:`PluginRecord` (its status, and the error and hook of a
failure); a loaded plugin that fails while answering leaves a :class:`PluginFault`. Around them:
the entry-point groups plugins are published in, the host API version and the rule a plugin's
version must meet (:func:`is_compatible`), and the environment switches (``VLLM_VOLTA_PLUGINS``,
``VLLM_VOLTA_STRICT``, ``VLLM_VOLTA_TEST_PLUGINS``) as the host and every plugin read them.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from volta_core.errors import UsageError

#: Entry-point group plugins are published in.
ENTRY_POINT_GROUP = "vllm_volta.plugins"

#: Entry-point group of the plugins that exist only to test the host (tests/plugins): read
#: only when ``VLLM_VOLTA_TEST_PLUGINS=1`` (the test suite sets it), so a user's environment
#: never lists them, while the tests still load them through real installed entry points.
TEST_ENTRY_POINT_GROUP = "vllm_volta.test_plugins"

#: The hook API this host speaks, ``MAJOR.MINOR``. A plugin written for the same major and a
#: minor no newer than this one is compatible: minors only add optional hooks.
HOST_API_VERSION = "1.4"

#: The module attribute in which a plugin states the host API version it was written for.
HOST_API_ATTRIBUTE = "VOLTA_HOST_API"

ENV_ONLY = "VLLM_VOLTA_PLUGINS"
ENV_STRICT = "VLLM_VOLTA_STRICT"
ENV_TEST_PLUGINS = "VLLM_VOLTA_TEST_PLUGINS"


class PluginStatus(str, enum.Enum):
    """What became of a discovered plugin."""

    LOADED = "loaded"
    REFUSED = "refused"
    """Imported, but written for a host API version this host does not speak."""
    FAILED = "failed"
    """Failed to import, to register or in a hook; the error says why (and ``hook`` where)."""
    SKIPPED = "skipped"
    """Not named in ``VLLM_VOLTA_PLUGINS``; never imported."""


@dataclass
class PluginRecord:
    """One plugin as discovery saw it, kept even when it failed so listings can show it."""

    name: str
    distribution: str = ""
    version: str = ""
    status: PluginStatus = PluginStatus.LOADED
    error: str = ""
    host_api: str | None = None
    hooks: tuple[str, ...] = ()
    provides: dict[str, tuple[str, ...]] = field(default_factory=dict)
    hook: str = ""
    """The hook the plugin failed in ("" for a failure to import or register)."""

    @property
    def label(self) -> str:
        """``plugin 'name' (distribution version)``: how every message names a plugin."""
        dist = f"{self.distribution} {self.version}".strip() or "unknown distribution"
        return f"plugin {self.name!r} ({dist})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status.value,
            "error": self.error,
            "hook": self.hook,
            "host_api": self.host_api,
            "hooks": list(self.hooks),
            "provides": {k: list(v) for k, v in self.provides.items()},
        }


@dataclass(frozen=True)
class PluginFault:
    """One failure of a loaded plugin while it answered a hook; the plugin was disabled."""

    plugin: str
    distribution: str
    version: str
    hook: str
    error: str

    def __str__(self) -> str:
        dist = f"{self.distribution} {self.version}".strip() or "unknown distribution"
        return (
            f"plugin {self.plugin!r} ({dist}) failed in {self.hook} and was disabled: {self.error}"
        )


def is_compatible(plugin_api: str, host_api: str = HOST_API_VERSION) -> bool:
    """Same major version, and the plugin's minor no newer than the host's."""
    try:
        p_major, p_minor = (int(x) for x in plugin_api.split("."))
        h_major, h_minor = (int(x) for x in host_api.split("."))
    except ValueError:
        return False
    return p_major == h_major and p_minor <= h_minor


def _env_names(value: str | None) -> list[str] | None:
    """The names in ``VLLM_VOLTA_PLUGINS``; None when unset or blank (load every plugin).

    A value that is set but names nothing (``,``) is a usage error: it would silently load no
    plugin at all, which is never what was meant (to load none, leave ``volta`` out of vLLM's
    own ``VLLM_PLUGINS``).
    """
    if value is None or not value.strip():
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise UsageError(f"{ENV_ONLY}={value!r} names no plugin")
    return names


def _env_flag(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def strict_mode(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``VLLM_VOLTA_STRICT`` (1, true, yes or on) turns plugin failures and kernel
    fallbacks into errors; read the same way by the host and every plugin."""
    return _env_flag((os.environ if environ is None else environ).get(ENV_STRICT))
