"""The ``compressed-tensors`` and ``fp8`` quantization-config subclasses registered over vLLM's.

They ask the host first and otherwise behave exactly as upstream: a linear or routed-experts
layer gets the plugin method that claims it (``volta_quant_method``), an attention layer the
KV-cache method the host's verdict implies (:func:`volta_core.vllm.kv_cache.attention_kv_method`),
installed past vLLM's KV-cache gate where the verdict keeps the checkpoint's scales. The
classes vLLM uses are the module attributes :data:`VoltaCompressedTensorsConfig` and
:data:`VoltaFp8Config`, built on first access so that pickle finds them by name in a spawned
process. vLLM is imported lazily, inside the functions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from volta_core.device import Device
from volta_core.errors import UsageError
from volta_core.host.discovery import get_plugin_manager
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import LayerKind, QuantConfig, QuantLayer
from volta_core.vllm import attention, devices, kv_cache, report
from volta_core.vllm.engine_config import explicit_backend, layer_kv_dtype
from volta_core.vllm.families import family
from volta_core.vllm.reasoning import load_object

#: Who runs a dense FP8 checkpoint's weights where the installed vLLM family has its own SM70 FP8
#: path (1Cat-vLLM): ``engine`` (the default there) or ``plugin``. Elsewhere plugins always serve
#: them, since upstream's ``Fp8Config`` refuses compute capability below 7.5.
ENV_FP8_WEIGHTS = "VLLM_VOLTA_FP8_WEIGHTS"
FP8_WEIGHT_RUNNERS = ("engine", "plugin")


def fp8_weights_to_plugins(own_fp8_path: bool) -> bool:
    """Whether the host is asked for an ``fp8`` checkpoint's layers: always on a family without
    its own SM70 FP8 path, on one with it only when ``VLLM_VOLTA_FP8_WEIGHTS=plugin``.

    :raises UsageError: ``VLLM_VOLTA_FP8_WEIGHTS`` is neither ``engine`` nor ``plugin``.
    """
    chosen = os.environ.get(ENV_FP8_WEIGHTS, "").strip().lower()
    if chosen and chosen not in FP8_WEIGHT_RUNNERS:
        raise UsageError(
            f"{ENV_FP8_WEIGHTS}={chosen!r} is not one of: {', '.join(FP8_WEIGHT_RUNNERS)}"
        )
    if not own_fp8_path:
        return True
    return chosen == "plugin"


def _asks_host(config: QuantConfig) -> bool:
    """Whether plugins are asked for this checkpoint's layers (:func:`fp8_weights_to_plugins`
    decides for ``fp8``; every other method always)."""
    return config.method != "fp8" or fp8_weights_to_plugins(family().fp8_weights_on_sm70)


def routed_experts_class() -> type:
    """vLLM's routed-experts layer class (:attr:`volta_core.vllm.families.Family.moe_layer`)."""
    from vllm.model_executor.layers import fused_moe

    return getattr(fused_moe, family().moe_layer)  # type: ignore[no-any-return]


def _layer_kind(layer: Any) -> LayerKind | None:
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.linear import LinearBase

    if isinstance(layer, LinearBase):
        return LayerKind.LINEAR
    if isinstance(layer, routed_experts_class()):
        return LayerKind.FUSED_MOE
    if isinstance(layer, Attention):
        return LayerKind.ATTENTION
    return None


def _quant_layer(kind: LayerKind, layer: Any, prefix: str) -> QuantLayer:
    return QuantLayer(
        kind,
        prefix,
        input_size=int(getattr(layer, "input_size", 0) or 0),
        output_size=int(getattr(layer, "output_size", 0) or 0),
    )


#: The module name :meth:`_HostQuant.serves_linear_layers` asks about: no checkpoint ignores it.
PROBE_PREFIX = "model.layers.0.mlp.volta_probe_proj"


class _HostQuant:
    """What the quantization-config subclasses ask the host, shared by both."""

    def __init__(
        self, manager: VoltaPluginManager, judge_device: Callable[[], Device | None]
    ) -> None:
        self.manager = manager
        self.judge_device = judge_device

    def claim(self, engine_config: Any, raw: dict[str, Any], layer: Any, prefix: str) -> Any:
        """The plugin method for a linear or MoE layer, or None to let upstream decide."""
        kind = _layer_kind(layer)
        device = self.judge_device()
        if kind not in (LayerKind.LINEAR, LayerKind.FUSED_MOE) or device is None:
            return None
        volta_config = QuantConfig(str(raw.get("quant_method", "")), raw)
        if not _asks_host(volta_config):
            return None
        quant_layer = _quant_layer(kind, layer, prefix)
        resolution = self.manager.resolve_quant(volta_config, quant_layer, device)
        if resolution.claim is None:
            return None
        factory = load_object(resolution.claim.impl)
        report.event("quant_claim", method=resolution.claim.method, plugin=resolution.source)
        return factory(volta_config=volta_config, layer=quant_layer, engine_config=engine_config)

    def serves_linear_layers(self, raw: dict[str, Any]) -> bool:
        """Whether a plugin claims this checkpoint's quantized linear layers on the device (a
        probe layer no ignore list names), so the config's capability gate is the plugin's."""
        device = self.judge_device()
        if device is None:
            return False
        config = QuantConfig(str(raw.get("quant_method", "")), raw)
        if not _asks_host(config):
            return False
        probe = QuantLayer(LayerKind.LINEAR, PROBE_PREFIX, input_size=4096, output_size=4096)
        return self.manager.resolve_quant(config, probe, device).claim is not None

    def kv_method(self, raw: dict[str, Any], layer: Any) -> kv_cache.KVMethod:
        """The KV-cache method of an attention layer, after the host's verdict."""
        config = QuantConfig(str(raw.get("quant_method", "")), raw)
        device = self.judge_device()
        decision = None
        if device is not None:
            kv_dtype, activation = layer_kv_dtype(layer)
            request = kv_cache.kv_request(kv_dtype, raw, device, activation)
            decision = kv_cache.decide(self.manager, request)
            report.event("kv_decision", line=kv_cache.describe(decision))
        method = kv_cache.attention_kv_method(config, decision)
        chosen = explicit_backend()
        if (
            method is kv_cache.KVMethod.CHECKPOINT_SCALES
            and chosen is not None
            and not attention.plugin_backend(self.manager, chosen)
        ):
            # vLLM's or the family's own backend (1Cat-vLLM's FLASH_ATTN_V100...) runs every
            # layer: the family's scale rule applies, not the scales the plugins' kernels read.
            method = kv_cache.KVMethod.ENGINE
        report.event("attention_kv_method", method=method.value, quant_method=config.method)
        return method


class _PluginMinCapability:
    """``get_min_capability`` of :data:`VoltaFp8Config`: upstream's classmethod on the class,
    the instance's :meth:`volta_min_capability` on an instance (a checkpoint a plugin serves)."""

    def __init__(self, upstream: Callable[[], int]) -> None:
        self.upstream = upstream

    def __get__(self, instance: Any, owner: type) -> Callable[[], int]:
        if instance is None:
            return self.upstream
        answer: Callable[[], int] = instance.volta_min_capability
        return answer


def make_checkpoint_scales_kv_method() -> type:
    """vLLM's compressed-tensors KV method, which loads the checkpoint's per-tensor or
    per-head K/V scales, under a name the report and the tests recognise."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsKVCacheMethod,
    )

    class VoltaCheckpointScalesKVMethod(CompressedTensorsKVCacheMethod):
        """Checkpoint K/V scales for a KV-cache dtype the host accepted (e5m2)."""

    return VoltaCheckpointScalesKVMethod


def install_kv_method(layer: Any, method: Any) -> None:
    """Give an attention layer its KV-cache method and the scale parameters it loads.

    Every family's ``_init_kv_cache_quant`` refuses some KV methods on an e5m2 cache (the "KV-cache
    quant gate" row of :mod:`volta_core.vllm.families`). The host has accepted the request, so the
    method is installed here, as that function would, and the gate is handed no method.
    Idempotent (vLLM may ask twice for one layer).
    """
    if type(getattr(layer, "quant_method", None)) is type(method):
        return
    layer.quant_method = method
    method.create_weights(layer)


def make_quantization_overrides(
    manager: VoltaPluginManager, judge_device: Callable[[], Device | None]
) -> dict[str, type]:
    """Subclasses of vLLM's ``compressed-tensors`` and ``fp8`` configs that ask the host first.

    Built per call (tests pass their own manager); the ones vLLM uses are the module
    attributes :data:`VoltaCompressedTensorsConfig` and :data:`VoltaFp8Config`.
    """
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    host = _HostQuant(manager, judge_device)
    checkpoint_scales_method = make_checkpoint_scales_kv_method()

    class VoltaCompressedTensorsConfig(CompressedTensorsConfig):
        """vLLM's compressed-tensors config, asking the host before its own lookup."""

        def get_quant_method(self, layer: Any, prefix: str) -> Any:
            raw = dict(self.config or {}, quant_method="compressed-tensors")
            if _layer_kind(layer) is LayerKind.ATTENTION:
                method = host.kv_method(raw, layer)
                if method is kv_cache.KVMethod.UNIT_SCALES:
                    return None
                if method is kv_cache.KVMethod.CHECKPOINT_SCALES:
                    install_kv_method(layer, checkpoint_scales_method(self))
                    return None
                return super().get_quant_method(layer, prefix)
            claimed = host.claim(self, raw, layer, prefix)
            if claimed is not None:
                return claimed
            return super().get_quant_method(layer, prefix)

    class VoltaFp8Config(Fp8Config):
        """vLLM's fp8 config; an e5m2 cache the host accepted gets unit scales (e5m2 needs no
        scales to hold fp16 values; 1CatAI/1Cat-vLLM#54 boots dense FP8 checkpoints so)."""

        volta_raw: dict[str, Any]

        @classmethod
        def from_config(cls, config: dict[str, Any]) -> Any:
            instance = super().from_config(config)
            instance.volta_raw = dict(config, quant_method="fp8")
            return instance

        get_min_capability = _PluginMinCapability(Fp8Config.get_min_capability)

        def volta_min_capability(self) -> int:
            """Upstream's minimum, or this GPU's capability where a plugin serves the
            checkpoint's layers (vLLM checks it once, on the instance, at start-up)."""
            upstream = int(Fp8Config.get_min_capability())
            raw = getattr(self, "volta_raw", None)
            device = host.judge_device()
            if raw is None or device is None or not host.serves_linear_layers(raw):
                return upstream
            return min(upstream, device.capability[0] * 10 + device.capability[1])

        def get_quant_method(self, layer: Any, prefix: str) -> Any:
            raw = getattr(self, "volta_raw", None)
            if _layer_kind(layer) is LayerKind.ATTENTION:
                kv = host.kv_method(raw or {"quant_method": "fp8"}, layer)
                if kv is not kv_cache.KVMethod.ENGINE:
                    return None
                return super().get_quant_method(layer, prefix)
            if raw is None:  # --quantization fp8 on an unquantized checkpoint: vLLM quantizes
                return super().get_quant_method(layer, prefix)
            claimed = host.claim(self, raw, layer, prefix)
            if claimed is not None:
                return claimed
            return super().get_quant_method(layer, prefix)

    return {"compressed-tensors": VoltaCompressedTensorsConfig, "fp8": VoltaFp8Config}


#: Module attributes built on first access, so pickle finds the classes by name in a spawned
#: process before the general plugin has run there (vLLM pickles its config, quant config
#: included, into the engine-core process).
_QUANT_CLASSES = {"VoltaCompressedTensorsConfig": "compressed-tensors", "VoltaFp8Config": "fp8"}
_quant_overrides: dict[str, type] | None = None


def quantization_overrides() -> dict[str, type]:
    """The process's override classes, bound to the process-wide plugin manager."""
    global _quant_overrides
    if _quant_overrides is None:
        built = make_quantization_overrides(get_plugin_manager(), devices.judge_device)
        for attribute, name in _QUANT_CLASSES.items():
            built[name].__module__ = __name__
            built[name].__qualname__ = built[name].__name__ = attribute
        _quant_overrides = built
    return _quant_overrides


def __getattr__(name: str) -> Any:
    if name in _QUANT_CLASSES:
        return quantization_overrides()[_QUANT_CLASSES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_quantization_overrides(overrides: dict[str, type]) -> None:
    """Register over the built-ins (vLLM's registry lets a registration replace a name)."""
    from vllm.model_executor.layers.quantization import register_quantization_config

    for name, config_cls in overrides.items():
        register_quantization_config(name)(config_cls)
