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
from volta_core.host.types import LayerKind, QuantConfig, QuantLayer, TensorSplit
from volta_core.vllm import attention, devices, kv_cache, report
from volta_core.vllm.engine_config import explicit_backend, layer_kv_dtype
from volta_core.vllm.families import family
from volta_core.vllm.reasoning import load_object

#: Who runs a dense FP8 checkpoint's weights where the installed vLLM family has its own SM70 FP8
#: path (1Cat-vLLM): ``engine`` (the default there) or ``plugin``. Elsewhere plugins always serve
#: them, since upstream's ``Fp8Config`` refuses compute capability below 7.5.
ENV_FP8_WEIGHTS = "VLLM_VOLTA_FP8_WEIGHTS"
#: The same choice for AWQ and GPTQ checkpoints (1Cat-vLLM runs them with its own SM70 kernels).
ENV_AWQ_GPTQ_WEIGHTS = "VLLM_VOLTA_AWQ_GPTQ_WEIGHTS"
WEIGHT_RUNNERS = ("engine", "plugin")

#: The ``quant_method`` names of AWQ and GPTQ checkpoints (and vLLM's variants of them).
AWQ_GPTQ_METHODS = frozenset({"awq", "awq_marlin", "auto_awq", "gptq", "gptq_marlin", "auto_gptq"})


def weights_to_plugins(env: str, own_sm70_path: bool) -> bool:
    """Whether the host is asked for a checkpoint's layers: always on a family without its own
    SM70 path for the format, on one with it only when the environment variable ``env`` is
    ``plugin``.

    :raises UsageError: ``env`` is set to neither ``engine`` nor ``plugin``.
    """
    chosen = os.environ.get(env, "").strip().lower()
    if chosen and chosen not in WEIGHT_RUNNERS:
        raise UsageError(f"{env}={chosen!r} is not one of: {', '.join(WEIGHT_RUNNERS)}")
    if not own_sm70_path:
        return True
    return chosen == "plugin"


def _asks_host(config: QuantConfig) -> bool:
    """Whether plugins are asked for this checkpoint's layers (:func:`weights_to_plugins`
    decides for ``fp8``, AWQ and GPTQ; every other method always)."""
    if config.method == "fp8":
        return weights_to_plugins(ENV_FP8_WEIGHTS, family().fp8_weights_on_sm70)
    if config.method in AWQ_GPTQ_METHODS:
        return weights_to_plugins(ENV_AWQ_GPTQ_WEIGHTS, family().awq_gptq_on_sm70)
    return True


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


def _tensor_parallel_size(layer: Any) -> int:
    """The ranks ``layer`` is divided over: its own ``tp_size`` where vLLM has set it (a layer
    built with ``disable_tp`` has 1), else vLLM's tensor-parallel world size (vLLM 0.32 sets
    ``LinearBase.tp_size`` only after it asks for the quant method), 1 outside a distributed
    run (``vllm/distributed/parallel_state.py``)."""
    own = getattr(layer, "tp_size", None)
    if isinstance(own, int) and own > 0:
        return own
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1
    return int(parallel_state.get_tensor_model_parallel_world_size())


def _linear_split(layer: Any) -> TensorSplit:
    """How vLLM's parallel linear class of ``layer`` divides it (``layers/linear.py``)."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear

    if isinstance(layer, RowParallelLinear):
        return TensorSplit.INPUT
    if isinstance(layer, ColumnParallelLinear):
        return TensorSplit.OUTPUT
    return TensorSplit.NONE


def _quant_layer(kind: LayerKind, layer: Any, prefix: str) -> QuantLayer:
    """The layer as the host's claims see it: full shape and tensor-parallel split. Routed
    experts are read from their ``moe_config`` (``FusedMoEConfig``, set before the quant method
    is asked): hidden size, the intermediate size per rank times the ranks, the experts and
    ``top_k``; the ranks are the experts' own (1 under expert parallelism)."""
    if kind is LayerKind.FUSED_MOE:
        moe = getattr(layer, "moe_config", None)
        ranks = int(getattr(moe, "tp_size", 1) or 1)
        per_rank = int(getattr(moe, "intermediate_size_per_partition", 0) or 0)
        return QuantLayer(
            kind,
            prefix,
            input_size=int(getattr(moe, "hidden_dim", 0) or 0),
            output_size=max(per_rank, 0) * ranks,
            experts=int(getattr(moe, "num_experts", 0) or 0),
            top_k=int(getattr(moe, "experts_per_token", 0) or 0),
            tensor_parallel_size=ranks,
            split=TensorSplit.OUTPUT,
        )
    return QuantLayer(
        kind,
        prefix,
        input_size=int(getattr(layer, "input_size", 0) or 0),
        output_size=int(getattr(layer, "output_size", 0) or 0),
        tensor_parallel_size=_tensor_parallel_size(layer),
        split=_linear_split(layer),
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


def _volta_min_capability(host: _HostQuant, upstream: int, raw: dict[str, Any] | None) -> int:
    """Upstream's minimum, or this GPU's capability where a plugin serves the checkpoint's
    layers (vLLM checks it once, on the instance, at start-up)."""
    device = host.judge_device()
    if raw is None or device is None or not host.serves_linear_layers(raw):
        return upstream
    return min(upstream, device.capability[0] * 10 + device.capability[1])


def _asymmetric_type_map(base: type) -> dict[Any, Any] | None:
    """``base.TYPE_MAP`` keyed by ``(bits, symmetric)`` with the asymmetric 4- and 8-bit types
    added, or None when the class keys it otherwise."""
    from vllm.scalar_type import scalar_types

    known = getattr(base, "TYPE_MAP", None)
    if not isinstance(known, dict) or not all(isinstance(key, tuple) for key in known):
        return None
    return {**known, (4, False): scalar_types.uint4, (8, False): scalar_types.uint8}


def _awq_gptq_override(host: _HostQuant, base: Any, method: str) -> type:
    """A subclass of one of vLLM's AWQ or GPTQ configs that asks the host first for every
    linear and routed-experts layer, and lets a checkpoint a plugin serves pass the capability
    gate; anything no plugin claims keeps the class's own behaviour."""

    class VoltaAwqGptqConfig(base):
        volta_raw: dict[str, Any]

        volta_refusal: str | None = None
        """What vLLM's own config refused of a checkpoint a plugin serves; a quantized layer
        no plugin claims then fails with it (vLLM's methods were not built for it)."""

        @classmethod
        def from_config(cls, config: dict[str, Any]) -> Any:
            raw = dict(config, quant_method=method)
            try:
                instance = super().from_config(config)
            except ValueError as exc:
                if not host.serves_linear_layers(raw):
                    raise
                instance = cls._past_engine_refusal(config)
                instance.volta_refusal = str(exc)
            instance.volta_raw = raw
            return instance

        @classmethod
        def _past_engine_refusal(cls, config: dict[str, Any]) -> Any:
            """The config as vLLM 0.32+ builds it for a checkpoint it refuses and a plugin
            serves: asymmetric types its GPTQ Marlin kernels lack, act-order (``desc_act``) it
            dropped; the plugin reads both from ``volta_raw``."""
            widened = _asymmetric_type_map(base)
            if widened is not None:
                cls.TYPE_MAP = widened
            try:
                return super().from_config(dict(config, desc_act=False))
            finally:
                if widened is not None:
                    del cls.TYPE_MAP

        get_min_capability = _PluginMinCapability(base.get_min_capability)

        def volta_min_capability(self) -> int:
            upstream = int(base.get_min_capability())
            return _volta_min_capability(host, upstream, getattr(self, "volta_raw", None))

        def get_quant_method(self, layer: Any, prefix: str) -> Any:
            raw = getattr(self, "volta_raw", None)
            claimed = host.claim(self, raw, layer, prefix) if raw is not None else None
            if claimed is not None:
                return claimed
            method = super().get_quant_method(layer, prefix)
            unquantized = method is None or "Unquantized" in type(method).__name__
            if self.volta_refusal is not None and not unquantized:
                raise ValueError(f"{prefix}: no Volta plugin claims it; {self.volta_refusal}")
            return method

    VoltaAwqGptqConfig.__name__ = VoltaAwqGptqConfig.__qualname__ = f"Volta{base.__name__}"
    return VoltaAwqGptqConfig


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
    """Subclasses of vLLM's ``compressed-tensors``, ``fp8``, AWQ and GPTQ configs that ask
    the host first, by the ``quant_method`` name each is registered under.

    Built per call (tests pass their own manager); the ones vLLM uses are the module
    attributes :data:`VoltaCompressedTensorsConfig`, :data:`VoltaFp8Config` and the AWQ / GPTQ
    classes (``Volta<vLLM's class name>``, named by :func:`_quant_classes` per family).
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
            upstream = int(Fp8Config.get_min_capability())
            return _volta_min_capability(host, upstream, getattr(self, "volta_raw", None))

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

    overrides: dict[str, type] = {
        "compressed-tensors": VoltaCompressedTensorsConfig,
        "fp8": VoltaFp8Config,
    }
    built: dict[str, type] = {}
    for name, path in family().awq_gptq_configs.items():
        if path not in built:
            module, _, cls = path.partition(":")
            base = load_object(f"vllm.model_executor.layers.quantization.{module}:{cls}")
            method = "awq" if "awq" in name else "gptq"
            built[path] = _awq_gptq_override(host, base, method)
        overrides[name] = built[path]
    return overrides


#: Module attributes built on first access, so pickle finds the classes by name in a spawned
#: process before the general plugin has run there (vLLM pickles its config, quant config
#: included, into the engine-core process).
_QUANT_CLASSES = {"VoltaCompressedTensorsConfig": "compressed-tensors", "VoltaFp8Config": "fp8"}
_quant_overrides: dict[str, type] | None = None


def _quant_classes() -> dict[str, str]:
    """Module attribute -> the ``quant_method`` name its class is registered under (the AWQ
    and GPTQ classes are the installed family's: ``Volta<vLLM's class name>``)."""
    classes = dict(_QUANT_CLASSES)
    for name, path in family().awq_gptq_configs.items():
        classes.setdefault(f"Volta{path.partition(':')[2]}", name)
    return classes


def quantization_overrides() -> dict[str, type]:
    """The process's override classes, bound to the process-wide plugin manager."""
    global _quant_overrides
    if _quant_overrides is None:
        built = make_quantization_overrides(get_plugin_manager(), devices.judge_device)
        for attribute, name in _quant_classes().items():
            built[name].__module__ = __name__
            built[name].__qualname__ = built[name].__name__ = attribute
        _quant_overrides = built
    return _quant_overrides


def __getattr__(name: str) -> Any:
    if name.startswith("Volta") and name in (classes := _quant_classes()):
        return quantization_overrides()[classes[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_quantization_overrides(overrides: dict[str, type]) -> None:
    """Register over the built-ins (vLLM's registry lets a registration replace a name)."""
    from vllm.model_executor.layers.quantization import register_quantization_config

    for name, config_cls in overrides.items():
        register_quantization_config(name)(config_cls)
