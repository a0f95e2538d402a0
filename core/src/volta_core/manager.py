"""Discovery and registration of plugins, with each plugin's failure isolated.

Plugins are found through the ``vllm_volta.plugins`` entry-point group (stevedore), imported
(names filtered before import by ``VLLM_VOLTA_PLUGINS``), checked (host API version, hook names,
unique declaration names) and registered into one pluggy ``PluginManager``. A plugin that fails
any step is recorded with its distribution, version and error, logged once, and left out;
everything else keeps working. ``VLLM_VOLTA_STRICT=1`` makes such a failure an exception.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from volta_core import builtins, hookspecs
from volta_core.device import Device
from volta_core.errors import (
    DuplicateDeclarationError,
    IncompatiblePluginError,
    PluginError,
    ReasoningTextLost,
)
from volta_core.resolution import (
    check_no_text_lost,
    combine_verdicts,
    resolve_quant,
    select_backend,
)
from volta_core.types import (
    AttentionBackendSpec,
    AttentionChoice,
    AttentionLayer,
    KernelConfig,
    KVDecision,
    KVRequest,
    QuantConfig,
    QuantLayer,
    QuantMethodSpec,
    QuantResolution,
    ReasoningContext,
    ReasoningParserSpec,
    ReasoningSplit,
)

log = logging.getLogger("volta_core")

#: Entry-point group plugins are published in.
ENTRY_POINT_GROUP = "vllm_volta.plugins"

#: The hook API this host speaks, ``MAJOR.MINOR``. A plugin written for the same major and a
#: minor no newer than this one is compatible: minors only add optional hooks.
HOST_API_VERSION = "1.0"

#: The module attribute in which a plugin states the host API version it was written for.
HOST_API_ATTRIBUTE = "VOLTA_HOST_API"

ENV_ONLY = "VLLM_VOLTA_PLUGINS"
ENV_STRICT = "VLLM_VOLTA_STRICT"


class PluginStatus(str, enum.Enum):
    """What became of a discovered plugin."""

    LOADED = "loaded"
    REFUSED = "refused"
    """Imported, but written for a host API version this host does not speak."""
    FAILED = "failed"
    """Failed to import or to register; the error says why."""
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

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status.value,
            "error": self.error,
            "host_api": self.host_api,
            "hooks": list(self.hooks),
            "provides": {k: list(v) for k, v in self.provides.items()},
        }


def is_compatible(plugin_api: str, host_api: str = HOST_API_VERSION) -> bool:
    """Same major version, and the plugin's minor no newer than the host's."""
    try:
        p_major, p_minor = (int(x) for x in plugin_api.split("."))
        h_major, h_minor = (int(x) for x in host_api.split("."))
    except ValueError:
        return False
    return p_major == h_major and p_minor <= h_minor


def _env_names(value: str | None) -> list[str] | None:
    if value is None or not value.strip():
        return None
    return [n.strip() for n in value.split(",") if n.strip()]


def _env_flag(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_IMPL_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")

#: Declaration families whose names must be unique across plugins: (hook, label).
_DECLARATIONS: tuple[tuple[str, str], ...] = (
    ("volta_attention_backends", "attention backend"),
    ("volta_quant_methods", "quant method"),
    ("volta_reasoning_parsers", "reasoning parser"),
)


class VoltaPluginManager:
    """The host's registry: one pluggy manager plus a record of every discovered plugin.

    Hooks are called through :meth:`_answers`, which attributes each answer to its plugin, so
    resolutions can name the plugin behind every claim, verdict and refusal.
    """

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}

    # -- registration -----------------------------------------------------------------

    def register(
        self, plugin: object, name: str, *, distribution: str = "", version: str = ""
    ) -> PluginRecord:
        """Check and register one plugin object; raise :class:`PluginError` if it breaks a rule.

        On failure nothing of the plugin stays registered.
        """
        host_api = getattr(plugin, HOST_API_ATTRIBUTE, None)
        record = PluginRecord(name, distribution, version, host_api=host_api)
        if host_api is None:
            raise PluginError(
                f"plugin {name!r} ({distribution or 'unknown distribution'}) does not state "
                f"{HOST_API_ATTRIBUTE}; this host speaks API {HOST_API_VERSION}"
            )
        if not is_compatible(str(host_api)):
            raise IncompatiblePluginError(
                f"plugin {name!r} ({distribution} {version}) was written for host API "
                f"{host_api}; this host speaks API {HOST_API_VERSION}"
            )
        try:
            self.pm.register(plugin, name)
        except ValueError as exc:
            raise PluginError(f"plugin {name!r} could not be registered: {exc}") from exc
        try:
            self.pm.check_pending()
            record.provides = self._check_declarations(name, distribution)
        except (pluggy.PluginValidationError, PluginError) as exc:
            self.pm.unregister(name=name)
            if isinstance(exc, PluginError):
                raise
            raise PluginError(f"plugin {name!r} ({distribution}): {exc}") from exc
        record.hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(plugin) or ()))
        self.records[name] = record
        return record

    def unregister(self, name: str) -> None:
        """Remove a registered plugin and its record (used by tests and tooling)."""
        self.pm.unregister(name=name)
        self.records.pop(name, None)

    def _check_declarations(self, name: str, distribution: str) -> dict[str, tuple[str, ...]]:
        """Collect the new plugin's declared names and refuse any already declared elsewhere."""
        provides: dict[str, tuple[str, ...]] = {}
        for hook, label in _DECLARATIONS:
            own = [decl for plugin, decl in self._declarations(hook) if plugin == name]
            for decl in own:
                if not _NAME_RE.match(decl.name) or not _IMPL_RE.match(decl.impl):
                    raise PluginError(
                        f"plugin {name!r} ({distribution}) declares {label} {decl.name!r} with "
                        f"impl {decl.impl!r}: names are letters, digits, '.', '_' or '-', and "
                        "impl is 'package.module:Attribute'"
                    )
            mine = [decl.name for decl in own]
            for other, decl in self._declarations(hook):
                if other != name and decl.name in mine:
                    other_dist = self.records[other].distribution if other in self.records else ""
                    raise DuplicateDeclarationError(
                        f"{label} {decl.name!r} is declared by both {other_dist or other!s} "
                        f"(plugin {other!r}) and {distribution or name!s} (plugin {name!r})"
                    )
            if len(set(mine)) != len(mine):
                raise DuplicateDeclarationError(
                    f"plugin {name!r} ({distribution}) declares a {label} name twice: {mine}"
                )
            if mine:
                provides[label] = tuple(mine)
        return provides

    # -- discovery --------------------------------------------------------------------

    def load_entrypoints(self, only: Sequence[str] | None = None) -> list[PluginRecord]:
        """Import and register every plugin of the entry-point group (or only those named).

        Returns the records of this call. Failures are recorded and logged once (raised in
        strict mode); names in ``only`` that match no entry point are warned about.
        """
        from stevedore import ExtensionManager, NamedExtensionManager

        available = {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
        loaded: list[PluginRecord] = []

        def dist_of(name: str) -> tuple[str, str]:
            # stevedore's cached entry points carry no distribution: ask importlib.metadata.
            entry_point = available.get(name)
            dist = getattr(entry_point, "dist", None)
            if dist is None:
                return "", ""
            return dist.metadata["Name"] or "", dist.version or ""

        def on_failure(_manager: object, entry_point: metadata.EntryPoint, exc: Exception) -> None:
            dist, version = dist_of(entry_point.name)
            loaded.append(
                self._fail(
                    PluginRecord(entry_point.name, dist, version),
                    PluginStatus.FAILED,
                    f"import failed: {type(exc).__name__}: {exc}",
                )
            )

        def on_missing(names: Iterable[str]) -> None:
            for missing in sorted(names):
                log.warning("%s names %r, which matches no installed plugin", ENV_ONLY, missing)

        if only is None:
            manager = ExtensionManager(ENTRY_POINT_GROUP, on_load_failure_callback=on_failure)
        else:
            # Filters by name before importing, so an unwanted plugin's code never runs.
            manager = NamedExtensionManager(
                ENTRY_POINT_GROUP,
                names=list(only),
                on_load_failure_callback=on_failure,
                on_missing_entrypoints_callback=on_missing,
            )
        for name in sorted(set(available) - set(only if only is not None else available)):
            dist, version = dist_of(name)
            record = PluginRecord(name, dist, version, PluginStatus.SKIPPED, f"not in {ENV_ONLY}")
            self.records[name] = record
            loaded.append(record)
        for ext in sorted(manager.extensions, key=lambda e: e.name):
            dist, version = dist_of(ext.name)
            try:
                loaded.append(
                    self.register(ext.plugin, ext.name, distribution=dist, version=version)
                )
            except IncompatiblePluginError as exc:
                host_api = getattr(ext.plugin, HOST_API_ATTRIBUTE, None)
                record = PluginRecord(ext.name, dist, version, host_api=host_api)
                loaded.append(self._fail(record, PluginStatus.REFUSED, str(exc)))
            except PluginError as exc:
                record = PluginRecord(ext.name, dist, version)
                loaded.append(self._fail(record, PluginStatus.FAILED, str(exc)))
        return loaded

    def _fail(self, record: PluginRecord, status: PluginStatus, error: str) -> PluginRecord:
        record.status, record.error = status, error
        self.records[record.name] = record
        label = f"{record.distribution} {record.version}".strip() or "unknown distribution"
        message = f"vllm-volta plugin {record.name!r} ({label}) {status.value}: {error}"
        if self.strict:
            raise PluginError(message)
        log.warning("%s", message)
        return record

    # -- attributed hook calls --------------------------------------------------------

    def _answers(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call each implementation of ``hook`` and pair its answer with its plugin's name."""
        caller = getattr(self.pm.hook, hook)
        answers = []
        for impl in reversed(caller.get_hookimpls()):
            args = {arg: kwargs[arg] for arg in impl.argnames}
            try:
                answers.append((impl.plugin_name, impl.function(**args)))
            except Exception as exc:
                raise PluginError(f"plugin {impl.plugin_name!r} failed in {hook}: {exc}") from exc
        return answers

    def _declarations(self, hook: str) -> list[tuple[str, Any]]:
        return [(name, decl) for name, decls in self._answers(hook) for decl in decls or ()]

    def attention_backends(self) -> list[tuple[str, AttentionBackendSpec]]:
        """Every plugin-declared attention backend, with the declaring plugin's name."""
        return self._declarations("volta_attention_backends")

    def quant_methods(self) -> list[tuple[str, QuantMethodSpec]]:
        return self._declarations("volta_quant_methods")

    def reasoning_parsers(self) -> list[tuple[str, ReasoningParserSpec]]:
        return self._declarations("volta_reasoning_parsers")

    def kernel_configs(self, device: Device) -> list[tuple[str, KernelConfig]]:
        return [
            (name, cfg)
            for name, cfgs in self._answers("volta_kernel_configs", device=device)
            for cfg in cfgs or ()
        ]

    # -- resolutions (the one source of truth for plan and adapter) -------------------

    def select_attention(
        self, layer: AttentionLayer, device: Device, forced: str | None = None
    ) -> AttentionChoice:
        """Choose the backend for one layer among plugin backends and valid built-ins."""
        candidates = [spec for _, spec in self.attention_backends()]
        return select_backend(layer, device, [*candidates, *builtins.BUILTIN_BACKENDS], forced)

    def resolve_quant(
        self, config: QuantConfig, layer: QuantLayer, device: Device
    ) -> QuantResolution:
        """Ask every plugin about one layer and resolve claims by priority."""
        declared = {spec.name for _, spec in self.quant_methods()}
        answers = self._answers("volta_quant_method", config=config, layer=layer, device=device)
        for plugin, answer in answers:
            if answer is not None and answer.method not in declared:
                raise PluginError(
                    f"plugin {plugin!r} answered for quant method {answer.method!r}, "
                    "which no plugin declares in volta_quant_methods"
                )
        return resolve_quant(layer, answers)

    def decide_kv_cache(self, request: KVRequest) -> KVDecision:
        """Combine every plugin's verdict on a KV-cache dtype request."""
        return combine_verdicts(request, self._answers("volta_kv_cache_verdict", request=request))

    def postprocess_reasoning(
        self, split: ReasoningSplit, context: ReasoningContext
    ) -> ReasoningSplit:
        """Run the post-processing hook; a result that loses generated text is refused."""
        result = self.pm.hook.volta_reasoning_postprocess(split=split, context=context)
        if result is None:
            return split
        text = context.delta if context.streaming else context.text
        try:
            return check_no_text_lost(text, result)
        except ReasoningTextLost as exc:
            log.error("reasoning post-processing dropped text, keeping the parser's split: %s", exc)
            return split


def discover(
    environ: Mapping[str, str] | None = None,
    factory: Callable[..., VoltaPluginManager] = VoltaPluginManager,
) -> VoltaPluginManager:
    """Build a manager and load the installed plugins, honouring the two environment switches."""
    env = os.environ if environ is None else environ
    manager = factory(strict=_env_flag(env.get(ENV_STRICT)))
    manager.load_entrypoints(_env_names(env.get(ENV_ONLY)))
    return manager


@functools.cache
def get_plugin_manager() -> VoltaPluginManager:
    """The process-wide manager, discovered once (so each failure is logged once)."""
    return discover()
