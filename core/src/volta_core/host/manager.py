"""The host's manager: the plugin registry (:mod:`volta_core.host.registry`) and the
resolutions asked of it, the one source of truth for the plan and the adapter.

Each resolution asks the plugins through the registry's checked calls, so a plugin that fails
while answering is disabled and the others still decide; the pure rules that combine their
answers are :mod:`volta_core.host.resolution`'s.
"""

from __future__ import annotations

import logging
from typing import Any

from volta_core.device import Device
from volta_core.errors import ReasoningTextLost
from volta_core.host import builtins
from volta_core.host.bench_case import BenchCase
from volta_core.host.declarations import FAMILIES
from volta_core.host.dispatch import StageCost, Workload
from volta_core.host.registry import PluginRegistry, _HookFailed
from volta_core.host.resolution import (
    check_no_text_lost,
    combine_verdicts,
    resolve_quant,
    select_backend,
)
from volta_core.host.types import (
    AttentionBackendSpec,
    AttentionChoice,
    AttentionLayer,
    CudaKernelConfig,
    KernelConfig,
    KernelPath,
    KVCacheOpsSpec,
    KVDecision,
    KVRequest,
    QuantClaim,
    QuantConfig,
    QuantDecline,
    QuantLayer,
    QuantMethodSpec,
    QuantResolution,
    ReasoningContext,
    ReasoningParserSpec,
    ReasoningSplit,
)

log = logging.getLogger("volta_core")


class VoltaPluginManager(PluginRegistry):
    """The host's manager: the registry of every discovered plugin, and what they declare and
    decide together (attention backends, quantization, the KV cache, reasoning, kernel paths,
    costs and bench cases).
    """

    def attention_backends(self) -> list[tuple[str, AttentionBackendSpec]]:
        """Every plugin-declared attention backend, with the declaring plugin's name."""
        return self._declarations("volta_attention_backends")

    def quant_methods(self) -> list[tuple[str, QuantMethodSpec]]:
        return self._declarations("volta_quant_methods")

    def reasoning_parsers(self) -> list[tuple[str, ReasoningParserSpec]]:
        return self._declarations("volta_reasoning_parsers")

    def replacements(self) -> list[tuple[str, str, str]]:
        """``(plugin, hook, name)`` for every declaration that replaces one of vLLM's own."""
        return [
            (plugin, family.hook, decl.name)
            for family in FAMILIES
            for plugin, decl in self._declarations(family.hook)
            if getattr(decl, "replaces_builtin", False)
        ]

    def kv_cache_formats(self) -> list[tuple[str, KVCacheOpsSpec]]:
        """Every declared KV-cache format (``layout.dtype``), with the plugin that writes it."""
        return self._declarations("volta_kv_cache_ops")

    def kv_cache_format(
        self, layout: str, kv_cache_dtype: str
    ) -> tuple[str, KVCacheOpsSpec] | None:
        """The plugin that writes ``kv_cache_dtype`` (canonical) in ``layout``, and its spec."""
        for plugin, spec in self.kv_cache_formats():
            if spec.layout == layout and spec.kv_cache_dtype == kv_cache_dtype:
                return plugin, spec
        return None

    def cache_writer(self, backend: AttentionBackendSpec, kv_cache_dtype: str) -> str:
        """Who writes a layer's KV cache under ``backend``: the plugin owning the format for a
        backend that declares a ``kv_cache_layout``, else vLLM (built-ins) or the backend's
        own plugin."""
        if backend.kv_cache_layout:
            owner = self.kv_cache_format(backend.kv_cache_layout, kv_cache_dtype)
            return f"plugin {owner[0]}" if owner else "none"
        plugin = None if backend.builtin else self.backend_plugin(backend)
        return f"plugin {plugin}" if plugin else "vLLM"

    def kernel_configs(self, device: Device) -> list[tuple[str, KernelConfig]]:
        return [
            (name, cfg)
            for name, cfgs in self._answers("volta_kernel_configs", device=device)
            for cfg in cfgs
        ]

    def cuda_kernel_configs(self, device: Device) -> list[tuple[str, CudaKernelConfig]]:
        """Every plugin's CUDA-source builds for ``device``, with the declaring plugin."""
        return [
            (name, cfg)
            for name, cfgs in self._answers("volta_cuda_kernel_configs", device=device)
            for cfg in cfgs
        ]

    def backend_plugin(self, backend: AttentionBackendSpec) -> str | None:
        """The plugin that declares ``backend``, or None for vLLM's own."""
        plugins = [p for p, spec in self.attention_backends() if spec == backend]
        return plugins[0] if plugins else None

    def kernel_paths(
        self,
        plugin: str,
        layer: AttentionLayer | QuantLayer,
        served_by: str,
        device: Device,
        quant: QuantConfig | None = None,
    ) -> tuple[KernelPath, ...]:
        """What ``plugin`` says runs ``layer`` on ``device`` (:func:`volta_kernel_paths`):
        empty when it does not say, or when it fails in the hook (it is then disabled)."""
        hook = "volta_kernel_paths"
        kwargs = {"layer": layer, "served_by": served_by, "device": device, "quant": quant}
        for impl in self._impls(hook):
            if impl.plugin_name == plugin:
                try:
                    return tuple(self._call_impl(impl, hook, kwargs))
                except _HookFailed as exc:
                    self._disable(plugin, exc.hook, exc.error)
        return ()

    def kernel_cost(
        self,
        plugin: str,
        layer: AttentionLayer | QuantLayer,
        served_by: str,
        device: Device,
        quant: QuantConfig | None,
        work: Workload,
    ) -> StageCost | None:
        """What ``plugin`` says ``work`` costs on ``layer`` (:func:`volta_kernel_cost`): None
        when it does not say, or when it fails in the hook (it is then disabled)."""
        kwargs = {"layer": layer, "served_by": served_by, "device": device, "quant": quant}
        answer: StageCost | None = self._ask_serving(plugin, "volta_kernel_cost", kwargs, work)
        return answer

    def bench_case(
        self,
        plugin: str,
        layer: AttentionLayer | QuantLayer,
        served_by: str,
        device: Device,
        quant: QuantConfig | None,
        work: Workload,
    ) -> BenchCase | None:
        """A runnable call of the kernel ``plugin`` runs for ``work`` on ``layer``
        (:func:`volta_bench_case`): None when it gives none, or when it fails in the hook (it
        is then disabled)."""
        kwargs = {"layer": layer, "served_by": served_by, "device": device, "quant": quant}
        answer: BenchCase | None = self._ask_serving(plugin, "volta_bench_case", kwargs, work)
        return answer

    def _ask_serving(self, plugin: str, hook: str, kwargs: dict[str, Any], work: Workload) -> Any:
        """``plugin``'s checked answer to ``hook`` about the work on a layer it serves, or None."""
        for impl in self._impls(hook):
            if impl.plugin_name == plugin:
                try:
                    return self._call_impl(impl, hook, {**kwargs, "work": work})
                except _HookFailed as exc:
                    self._disable(plugin, exc.hook, exc.error)
        return None

    # -- resolutions (the one source of truth for plan and adapter) -------------------

    def select_attention(
        self,
        layer: AttentionLayer,
        device: Device,
        forced: str | None = None,
        family: str | None = None,
    ) -> AttentionChoice:
        """Choose the backend for one layer among plugin backends and valid built-ins.

        A built-in a plugin replaces (``replaces_builtin``) is not also a fallback; a family's own
        backend (``family``: the vLLM family's name) is judged only when ``forced`` names it.
        """
        candidates = [spec for _, spec in self.attention_backends()]
        taken = {spec.name for spec in candidates}
        named = builtins.named_only_backends(family) if forced is not None else ()
        fallbacks = [b for b in (*builtins.BUILTIN_BACKENDS, *named) if b.name not in taken]
        formats = frozenset(spec.name for _, spec in self.kv_cache_formats())
        return select_backend(layer, device, [*candidates, *fallbacks], forced, formats)

    def backend_names(self) -> list[str]:
        """Every name ``--attention-backend`` accepts: plugin backends and the built-ins."""
        specs = [spec for _, spec in self.attention_backends()]
        specs += [*builtins.BUILTIN_BACKENDS, *builtins.NAMED_ONLY_BACKENDS]
        return sorted({n for spec in specs for n in (spec.name, spec.vllm_name) if n != "CUSTOM"})

    def resolve_quant(
        self, config: QuantConfig, layer: QuantLayer, device: Device
    ) -> QuantResolution:
        """Ask every plugin about one layer and resolve claims by priority.

        A claim or decline for a method the plugin does not declare is a wrong answer: the
        plugin is disabled like one that raised.
        """
        answers = self._answers("volta_quant_method", config=config, layer=layer, device=device)
        kept: list[tuple[str, QuantClaim | QuantDecline | None]] = []
        for plugin, answer in answers:
            own = {
                spec.name for spec in self._declared.get(plugin, {}).get("volta_quant_methods", ())
            }
            if answer is not None and answer.method not in own:
                self._disable(
                    plugin,
                    "volta_quant_method",
                    f"answered for quant method {answer.method!r}, which it does not declare in "
                    "volta_quant_methods",
                )
                continue
            kept.append((plugin, answer))
        return resolve_quant(layer, kept)

    def decide_kv_cache(self, request: KVRequest) -> KVDecision:
        """Combine every plugin's verdict on a KV-cache dtype request."""
        return combine_verdicts(request, self._answers("volta_kv_cache_verdict", request=request))

    def postprocess_reasoning(
        self, split: ReasoningSplit, context: ReasoningContext
    ) -> ReasoningSplit:
        """The first post-processor's split; the parser's own if it fails or drops text.

        ``firstresult`` as pluggy would run it, but each plugin isolated: one that raises or
        answers garbage is disabled and the next is asked; a split that loses generated text
        (of the whole output, or for a streaming delta of the parser's split of it) is refused
        (logged) and the parser's split kept, so no text is ever lost.
        """
        hook = "volta_reasoning_postprocess"
        for impl in self._impls(hook):
            try:
                result = self._call_impl(impl, hook, {"split": split, "context": context})
            except _HookFailed as exc:
                self._disable(impl.plugin_name, exc.hook, exc.error)
                continue
            if result is None:
                continue
            # A streaming delta's split holds text the stream held back before and leaves out
            # what it holds now, so it is checked against the parser's own split of it.
            text = _split_text(split) if context.streaming else context.text
            try:
                return check_no_text_lost(text, result)
            except ReasoningTextLost as exc:
                log.error(
                    "reasoning post-processing by plugin %r dropped text, keeping the parser's "
                    "split: %s",
                    impl.plugin_name,
                    exc,
                )
                return split
        return split


def _split_text(split: ReasoningSplit) -> str:
    return (split.reasoning or "") + (split.content or "")
