"""Registration of plugins and the checked calls of their hooks, with each failure isolated.

Plugins are imported from their entry points (stevedore), checked (host API version, hook
names, every declaration's type and name, names unique across plugins) and registered into one
pluggy ``PluginManager``. Every hook is then called through the registry, which checks each
answer's type at the boundary (:mod:`volta_core.host.answers`).

Isolation, the one rule for every failure: whatever a plugin raises while loading, declaring
or answering, and every answer of the wrong type, is caught and recorded against that plugin
(name, distribution, version, hook, error) as a :class:`~volta_core.host.records.PluginFault`;
the plugin is disabled (unregistered, so it is asked nothing more) and shown as failed by
``vllm-volta plugins`` and the adapter's report; every other plugin keeps working.
``VLLM_VOLTA_STRICT=1`` makes each such failure a :class:`PluginError` naming the plugin and the
hook.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any

import pluggy

from volta_core.errors import DuplicateDeclarationError, IncompatiblePluginError, PluginError
from volta_core.host import hookspecs
from volta_core.host.answers import InvalidAnswer, check_answer
from volta_core.host.declarations import FAMILIES, NameRegistry, check_own
from volta_core.host.records import (
    ENTRY_POINT_GROUP,
    ENV_ONLY,
    HOST_API_ATTRIBUTE,
    HOST_API_VERSION,
    PluginFault,
    PluginRecord,
    PluginStatus,
    is_compatible,
)

log = logging.getLogger("volta_core")


def _describe(exc: BaseException) -> str:
    """An exception as one short line: its type and its first line of message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _without_label(exc: Exception, record: PluginRecord) -> str:
    """An error's message without the plugin's label in front (the record shows it already)."""
    return str(exc).removeprefix(record.label).removeprefix(":").strip()


class _HookFailed(Exception):
    """A plugin's hook raised or answered garbage (internal: carries the hook and the error)."""

    def __init__(self, hook: str, error: str) -> None:
        super().__init__(f"{hook}: {error}")
        self.hook, self.error = hook, error


class PluginRegistry:
    """One pluggy manager plus a record of every discovered plugin.

    Every hook is called through :meth:`_call_impl`, which attributes each answer to its plugin,
    checks its type and isolates the plugin's failures; resolutions
    (:class:`~volta_core.host.manager.VoltaPluginManager`) can therefore name the plugin behind
    every claim, verdict and refusal. Declarations (backends, quant methods, parsers) are asked
    once, when a plugin registers, checked, and kept: what ``plugins`` lists is what every
    resolution uses.
    """

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self.faults: list[PluginFault] = []
        self._fault_listeners: list[Callable[[PluginFault], None]] = []
        self._declared: dict[str, dict[str, tuple[Any, ...]]] = {}
        self._names = NameRegistry()

    def on_fault(self, listener: Callable[[PluginFault], None]) -> None:
        """Call ``listener`` with each later plugin fault (the adapter reports them: a plugin
        that fails while the engine serves is disabled long after the start-up report). A
        listener that raises is logged and kept out of the way."""
        self._fault_listeners.append(listener)

    # -- registration -----------------------------------------------------------------

    def register(
        self, plugin: object, name: str, *, distribution: str = "", version: str = ""
    ) -> PluginRecord:
        """Check and register one plugin object; raise :class:`PluginError` if it breaks a rule.

        On failure nothing of the plugin stays registered, and the error names the plugin (and
        the hook, for a declaration hook that raised or answered garbage). A name clash also
        disables the plugin already holding the name (:mod:`volta_core.host.declarations`).
        """
        host_api = getattr(plugin, HOST_API_ATTRIBUTE, None)
        record = PluginRecord(name, distribution, version, host_api=host_api)
        if host_api is None:
            raise PluginError(
                f"{record.label} does not state {HOST_API_ATTRIBUTE}; this host speaks API "
                f"{HOST_API_VERSION}"
            )
        if not is_compatible(str(host_api)):
            raise IncompatiblePluginError(
                f"{record.label} was written for host API {host_api}; this host speaks API "
                f"{HOST_API_VERSION}"
            )
        try:
            self.pm.register(plugin, name)
        except ValueError as exc:
            raise PluginError(f"{record.label} could not be registered: {exc}") from exc
        try:
            self.pm.check_pending()
            record.hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(plugin) or ()))
            declared = self._collect_declarations(record)
        except pluggy.PluginValidationError as exc:
            self.pm.unregister(name=name)
            raise PluginError(f"{record.label}: {exc}") from exc
        except PluginError:
            self.pm.unregister(name=name)
            raise
        self._declared[name] = declared
        self._names.hold(record.provides, name)
        self.records[name] = record
        return record

    def _collect_declarations(self, record: PluginRecord) -> dict[str, tuple[Any, ...]]:
        """Ask the new plugin's declaration hooks, check every answer and the names' rules."""
        declared: dict[str, tuple[Any, ...]] = {}
        for family in FAMILIES:
            try:
                answers = self._call_own(record.name, family.hook)
                names = check_own(family, answers)
            except _HookFailed as exc:
                message = f"{record.label} failed in {exc.hook}: {exc.error}"
                raise PluginError(message, hook=exc.hook) from exc
            except (InvalidAnswer, DuplicateDeclarationError) as exc:
                message = f"{record.label} failed in {family.hook}: {exc}"
                raise type(exc)(message, hook=family.hook) from exc
            declared[family.hook] = answers
            if names:
                record.provides[family.label] = names
        self._refuse_clashes(record)
        return declared

    def _refuse_clashes(self, record: PluginRecord) -> None:
        """Two plugins declaring one name: both are disabled, one error names both."""
        clashes = self._names.clashes(record.provides, record.name)
        if not clashes:
            return
        messages = []
        for label, name, others in clashes:
            holders = [
                self.records[o].label if o in self.records else f"plugin {o!r}" for o in others
            ]
            messages.append(
                f"{label} {name!r} is declared by both {' and '.join(holders)} and {record.label}; "
                "neither is used"
            )
            self._names.contest(label, name, [*others, record.name])
        message = "; ".join(messages)
        for other in {o for _, _, others in clashes for o in others}:
            if other in self.records and self.records[other].status is PluginStatus.LOADED:
                self._disable(other, "", message, raise_strict=False)
        raise DuplicateDeclarationError(message)

    def unregister(self, name: str) -> None:
        """Remove a registered plugin and its record (used by tests and tooling)."""
        if self.pm.get_plugin(name) is not None:
            self.pm.unregister(name=name)
        self._declared.pop(name, None)
        self._names.release(name)
        self.records.pop(name, None)

    # -- discovery --------------------------------------------------------------------

    def load_entrypoints(
        self,
        only: Sequence[str] | None = None,
        groups: Sequence[str] = (ENTRY_POINT_GROUP,),
    ) -> list[PluginRecord]:
        """Import and register every plugin of the entry-point groups (or only those named).

        Returns the records of this call. Failures are recorded and logged once (raised in
        strict mode); names in ``only`` that match no entry point are warned about (an error
        in strict mode). Plugins register in name order; the outcome does not depend on it.
        """
        from stevedore import ExtensionManager, NamedExtensionManager

        available = {ep.name: ep for group in groups for ep in metadata.entry_points(group=group)}
        loaded: list[PluginRecord] = []

        def dist_of(name: str) -> tuple[str, str]:
            # stevedore's cached entry points carry no distribution: ask importlib.metadata.
            dist = getattr(available.get(name), "dist", None)
            if dist is None:
                return "", ""
            return dist.metadata["Name"] or "", dist.version or ""

        def on_failure(
            _manager: object, entry_point: metadata.EntryPoint, exc: BaseException
        ) -> None:
            record = PluginRecord(entry_point.name, *dist_of(entry_point.name))
            loaded.append(
                self._fail(record, PluginStatus.FAILED, f"import failed: {_describe(exc)}")
            )

        missing = sorted(set(only or ()) - set(available))
        for name in missing:
            message = f"{ENV_ONLY} names {name!r}, which matches no installed plugin"
            if self.strict:
                raise PluginError(message)
            log.warning("%s", message)
        for name in sorted(set(available) - set(only if only is not None else available)):
            record = PluginRecord(name, *dist_of(name), PluginStatus.SKIPPED, f"not in {ENV_ONLY}")
            self.records[name] = record
            loaded.append(record)
        extensions = []
        for group in groups:
            manager: ExtensionManager[Any]
            if only is None:
                manager = ExtensionManager(group, on_load_failure_callback=on_failure)
            else:
                # Filters by name before importing, so an unwanted plugin's code never runs.
                manager = NamedExtensionManager(
                    group,
                    names=[n for n in only if n in available and available[n].group == group],
                    on_load_failure_callback=on_failure,
                    on_missing_entrypoints_callback=lambda _names: None,
                )
            extensions += manager.extensions
        for ext in sorted(extensions, key=lambda e: e.name):
            loaded.append(self._register_entry_point(ext.name, ext.plugin, *dist_of(ext.name)))
        return loaded

    def _register_entry_point(
        self, name: str, plugin: object, distribution: str, version: str
    ) -> PluginRecord:
        record = PluginRecord(name, distribution, version)
        try:
            return self.register(plugin, name, distribution=distribution, version=version)
        except IncompatiblePluginError as exc:
            record.host_api = getattr(plugin, HOST_API_ATTRIBUTE, None)
            return self._fail(record, PluginStatus.REFUSED, _without_label(exc, record))
        except PluginError as exc:
            record.hook = exc.hook
            return self._fail(record, PluginStatus.FAILED, _without_label(exc, record))
        except Exception as exc:  # a plugin's object misbehaving under pluggy's inspection
            error = f"could not be registered: {_describe(exc)}"
            return self._fail(record, PluginStatus.FAILED, error)

    def _fail(self, record: PluginRecord, status: PluginStatus, error: str) -> PluginRecord:
        record.status, record.error = status, error
        self.records[record.name] = record
        message = f"vllm-volta {record.label} {status.value}: {error}"
        if self.strict:
            raise PluginError(message)
        log.warning("%s", message)
        return record

    def _disable(self, name: str, hook: str, error: str, *, raise_strict: bool = True) -> None:
        """Record a loaded plugin's failure in ``hook`` and unregister it (raise if strict)."""
        record = self.records.setdefault(name, PluginRecord(name))
        if self.pm.get_plugin(name) is not None:
            self.pm.unregister(name=name)
        self._declared.pop(name, None)
        self._names.release(name)
        record.status, record.hook = PluginStatus.FAILED, hook
        record.error = f"failed in {hook}: {error}" if hook else error
        record.provides = {}
        if hook:
            fault = PluginFault(name, record.distribution, record.version, hook, error)
            self.faults.append(fault)
            message = str(fault)
            for listener in self._fault_listeners:
                try:
                    listener(fault)
                except Exception as exc:
                    log.error("vllm-volta: a fault listener failed: %s", exc)
        else:
            message = f"{record.label} was disabled: {error}"
        if self.strict and raise_strict:
            raise PluginError(message)
        log.log(logging.ERROR if hook else logging.WARNING, "vllm-volta %s", message)

    # -- attributed, checked hook calls -----------------------------------------------

    def _impls(self, hook: str) -> list[pluggy.HookImpl]:
        """The hook's answering implementations (wrappers left out) in pluggy's call order
        (last registered first)."""
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        return [i for i in reversed(impls) if not (i.wrapper or i.hookwrapper)]

    def _call_impl(self, impl: pluggy.HookImpl, hook: str, kwargs: Mapping[str, Any]) -> Any:
        """Call one plugin's implementation through pluggy and check its answer; raise
        :class:`_HookFailed`.

        The call goes through a pluggy hook caller holding that implementation and every hook
        wrapper, so wrappers and pluggy's tracing and call monitoring see it, and the answer
        stays the plugin's own. A wrapper cannot pass anything unchecked: the host checks what
        comes out. If the call fails but the implementation alone answers, the wrappers broke
        it: their plugins are disabled and the plain answer is kept.
        """
        caller = self._subset_caller(hook, impl.plugin_name)
        try:
            result = caller(**kwargs)
            # pluggy gives a list of the non-None answers, or the first one for firstresult.
            firstresult = caller.spec is not None and caller.spec.opts.get("firstresult")
            answer = result if firstresult else (result[0] if result else None)
        except Exception as exc:
            answer = self._without_wrappers(impl, hook, kwargs, exc)
        try:
            return check_answer(hook, answer)
        except InvalidAnswer as exc:
            raise _HookFailed(hook, str(exc)) from exc

    def _subset_caller(self, hook: str, name: str) -> Any:
        """``hook``'s caller with ``name``'s implementation and all wrappers, nothing else."""
        others = {
            impl.plugin
            for impl in getattr(self.pm.hook, hook).get_hookimpls()
            if impl.plugin_name != name and not (impl.wrapper or impl.hookwrapper)
        }
        return self.pm.subset_hook_caller(hook, remove_plugins=others)

    def _without_wrappers(
        self, impl: pluggy.HookImpl, hook: str, kwargs: Mapping[str, Any], error: Exception
    ) -> Any:
        """The implementation's answer called alone, after the wrapped call raised ``error``."""
        wrappers = [
            w.plugin_name
            for w in getattr(self.pm.hook, hook).get_hookimpls()
            if (w.wrapper or w.hookwrapper) and w.plugin_name != impl.plugin_name
        ]
        if not wrappers:
            raise _HookFailed(hook, f"raised {_describe(error)}") from error
        try:
            answer = impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
        except Exception as exc:
            raise _HookFailed(hook, f"raised {_describe(exc)}") from exc
        for name in wrappers:
            self._disable(name, hook, f"its hook wrapper broke the call: {_describe(error)}")
        return answer

    def _call_own(self, name: str, hook: str) -> tuple[Any, ...]:
        """One plugin's answer to a declaration hook (empty when it does not implement it)."""
        answers: tuple[Any, ...] = ()
        for impl in self._impls(hook):
            if impl.plugin_name == name:
                answers += self._call_impl(impl, hook, {})
        return answers

    def _answers(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Each plugin's checked answer to ``hook``; a plugin that fails in it is disabled."""
        answers = []
        for impl in self._impls(hook):
            try:
                answers.append((impl.plugin_name, self._call_impl(impl, hook, kwargs)))
            except _HookFailed as exc:
                self._disable(impl.plugin_name, exc.hook, exc.error)
        return answers

    def _declarations(self, hook: str) -> list[tuple[str, Any]]:
        return [
            (name, decl)
            for name in sorted(self._declared)
            for decl in self._declared[name].get(hook, ())
        ]
