"""The ``vllm.general_plugins`` entry point: apply the Volta plugins in every vLLM process.

vLLM calls :func:`register` in the API server, the engine core and each worker, possibly more
than once. It is idempotent, never breaks engine start (a failure is logged once and the
adapter steps aside, unless ``VLLM_VOLTA_STRICT=1``), and cheap when nothing applies: with no
declared parser nothing of vLLM's reasoning machinery is touched, with no quant or KV hook
vLLM's quantization configs are not imported, and nothing imports torch that vLLM has not
imported already.

What it applies, each step on its own so one failing does not take the others down:

1. reasoning parsers declared by plugins, registered with vLLM under their names (and any
   aliases from ``VLLM_VOLTA_REASONING_ALIASES``, e.g. ``qwen3=qwen3-volta``);
2. the ``compressed-tensors`` and ``fp8`` quantization configs, replaced by subclasses that
   ask the host first (plugin quant claims, the KV-cache verdict), when a loaded plugin
   implements either hook (otherwise vLLM's configs, and their import cost, stay untouched);
3. on CUDA compute capability 7.x, the plugin attention backend bound to
   ``AttentionBackendEnum.CUSTOM`` (routing itself is the Volta platform's,
   :mod:`volta_core.vllm.platform`);
4. when a plugin declares attention backends, vLLM's configuration hook for Gemma-4 text models
   wrapped so that, under a Volta platform only, the whole-model TRITON_ATTN it forces for
   mixed head sizes is taken back and layers are routed one by one
   (:func:`volta_core.vllm.model_config_hooks.make_model_config_overrides`).

``VLLM_VOLTA_DEVICE`` (``sm70``, ``7.0``...) names the device the host judges quant claims and
KV-cache dtypes for where vLLM reports no CUDA capability (the CPU build, for tests and dry
runs); attention is never routed on such a device. Any ``MAJOR.MINOR`` is accepted there, so
test plugins can judge for capabilities no real GPU has.

In a process where vLLM has not imported torch, only discovery runs: vLLM calls general
plugins after importing its configuration (which imports torch), so there is nothing of vLLM's
to apply yet, and the adapter must not be the one to import it.
"""

from __future__ import annotations

import logging
import os
import sys

from volta_core.host.discovery import get_plugin_manager
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import strict_mode
from volta_core.vllm import (
    attention,
    backend_binding,
    devices,
    families,
    model_config_hooks,
    quantization,
    reasoning_parser,
    report,
)
from volta_core.vllm.reasoning import ENV_ALIASES, aliases

log = logging.getLogger("volta_core.vllm")

_applied = False


def _register_parsers(manager: VoltaPluginManager) -> None:
    declared = manager.reasoning_parsers()
    if not declared:
        return
    extra = aliases(os.environ.get(ENV_ALIASES), [spec.name for _, spec in declared])
    for plugin, spec in declared:
        names = [spec.name] + [alias for alias, name in extra.items() if name == spec.name]
        reasoning_parser.register_reasoning_parser(
            names, reasoning_parser.make_reasoning_parser(spec, manager)
        )
        report.event("reasoning_parser", names=names, plugin=plugin)


#: Hooks whose implementations make the quantization-config overrides worth their import.
QUANT_HOOKS = ("volta_quant_method", "volta_kv_cache_verdict")


def _register_quantization(manager: VoltaPluginManager) -> None:
    hooks = [getattr(manager.pm.hook, name) for name in QUANT_HOOKS]
    if not any(hook.get_hookimpls() for hook in hooks):
        log.debug("vllm-volta: no plugin claims quant methods or judges KV dtypes here")
        return
    overrides = quantization.quantization_overrides()
    quantization.register_quantization_overrides(overrides)
    report.event("quantization_override", names=sorted(overrides))


def _bind_attention(manager: VoltaPluginManager) -> None:
    device = devices.current_cuda_device()
    if not attention.routes(device):
        return
    custom = [
        spec for _, spec in manager.attention_backends() if spec.vllm_name == backend_binding.CUSTOM
    ]
    if custom:
        backend_binding.bind_custom_backend(max(custom, key=lambda spec: spec.priority))


def _register_model_hooks(manager: VoltaPluginManager) -> None:
    if not manager.attention_backends():
        return
    model_config_hooks.register_model_config_overrides(
        model_config_hooks.make_model_config_overrides(model_config_hooks.routed_platform)
    )


def register() -> None:
    """Apply the Volta plugins to this vLLM process (once)."""
    global _applied
    if _applied:
        return
    _applied = True
    reason = families.unsupported_reason()
    installed = families.installed_vllm()
    if reason is not None:
        log.warning("%s", reason)
        report.set_fields(vllm=installed, supported=False)
        return
    try:
        manager = get_plugin_manager()
    except Exception as exc:
        if strict_mode():
            raise
        log.error("vllm-volta: plugin discovery failed; vLLM runs without Volta plugins: %s", exc)
        return
    report.set_fields(
        vllm=installed,
        supported=True,
        plugins={name: record.status.value for name, record in sorted(manager.records.items())},
    )
    manager.on_fault(
        lambda fault: report.event(
            "plugin_failed", plugin=fault.plugin, hook=fault.hook, error=fault.error
        )
    )
    if "torch" not in sys.modules:
        log.debug("vllm-volta: vLLM has not imported torch in this process; nothing to apply")
        return
    for step, apply in (
        ("reasoning parsers", _register_parsers),
        ("quantization", _register_quantization),
        ("attention backends", _bind_attention),
        ("model configuration hooks", _register_model_hooks),
    ):
        try:
            apply(manager)
        except Exception as exc:
            if strict_mode() or manager.strict:
                raise
            log.error(
                "vllm-volta: %s were not applied (%s: %s); vLLM's own behaviour stands",
                step,
                type(exc).__name__,
                exc,
            )
            # The report's field keeps its published name, "family" (the step that failed).
            report.event("failed", family=step, error=f"{type(exc).__name__}: {exc}")
