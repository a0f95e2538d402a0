"""KV-cache dtype decisions as the adapter applies them, free of vLLM.

The host's combined verdict (:meth:`VoltaPluginManager.decide_kv_cache`) decides before vLLM's
own gate (``_init_kv_cache_quant``) can refuse. What that means for an attention layer is one of
three :class:`KVMethod` values, which the quantization-config subclasses in
:mod:`volta_core.vllm.quantization` turn into vLLM objects. Where an accepting plugin says the
scales come from is read once into a :class:`ScaleSource` (:func:`scale_source`).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from typing import Any

from volta_core.device import Device
from volta_core.host.checkpoint import checkpoint_kv, quant_config
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.resolution import require_accepted
from volta_core.host.types import (
    KVDecision,
    KVRequest,
    KVScaleScheme,
    KVVerdict,
    QuantConfig,
    VerdictStatus,
    canonical_kv_dtype,
)

COMPRESSED_TENSORS = "compressed-tensors"


class KVMethod(str, enum.Enum):
    """What an attention layer of a quantized checkpoint gets for its KV cache."""

    ENGINE = "engine"
    """vLLM's own KV-cache method and gate, unchanged."""
    UNIT_SCALES = "unit_scales"
    """No KV-cache method: vLLM keeps k/v scales at 1.0 and its fp8 gate does not apply."""
    CHECKPOINT_SCALES = "checkpoint_scales"
    """The checkpoint's K/V scales are loaded, and vLLM's e5m2 gate is not applied to them."""


class ScaleSource(enum.Enum):
    """Where an accepting verdict says the K/V scales come from (its ``KVVerdict.scales``)."""

    UNSTATED = "unstated"
    """The verdict names no source the adapter knows (``scales`` empty or another word)."""
    UNIT = "unit"
    """Unit scales: nothing is loaded from the checkpoint."""
    CHECKPOINT = "checkpoint"
    """The checkpoint's K/V scales."""


#: Every ``KVVerdict.scales`` spelling with a meaning for the adapter, word for word: ``unit``,
#: ``checkpoint``, and ``checkpoint:<layout>`` for each scale layout a checkpoint can ship
#: (:class:`~volta_core.host.types.KVScaleScheme`; fp8kv says which one it keeps).
_SCALE_SOURCES: dict[str, ScaleSource] = {
    "unit": ScaleSource.UNIT,
    "checkpoint": ScaleSource.CHECKPOINT,
    **{
        f"checkpoint:{scheme.value}": ScaleSource.CHECKPOINT
        for scheme in KVScaleScheme
        if scheme is not KVScaleScheme.NONE
    },
}


def scale_source(verdict: KVVerdict) -> ScaleSource:
    """The typed source of a verdict's scales (an exact lookup: no spelling is parsed)."""
    return _SCALE_SOURCES.get(verdict.scales, ScaleSource.UNSTATED)


def kv_request(
    kv_cache_dtype: str,
    quant_raw: Mapping[str, Any] | None,
    device: Device,
    activation_dtype: str,
) -> KVRequest:
    """Describe a KV-cache dtype request the way the plan command does (one reading)."""
    checkpoint = checkpoint_kv(quant_config(quant_raw))
    return KVRequest(kv_cache_dtype, checkpoint, device, activation_dtype)


@functools.lru_cache(maxsize=32)
def _decide(manager: VoltaPluginManager, request: KVRequest) -> KVDecision:
    return manager.decide_kv_cache(request)


def decide(manager: VoltaPluginManager, request: KVRequest) -> KVDecision:
    """The host's combined verdict, computed once per process and request.

    Raises :class:`~volta_core.errors.KVCacheDtypeRejected` with every plugin's reason when the
    request is rejected.
    """
    return require_accepted(_decide(manager, request))


def attention_kv_method(config: QuantConfig, decision: KVDecision | None) -> KVMethod:
    """Which KV-cache method an attention layer of this checkpoint gets.

    - A compressed-tensors checkpoint without ``kv_cache_scheme`` is weight-only: it ships no
      KV scales, so its attention layers get no KV-cache method at all, whatever the KV
      dtype (vLLM's ``CompressedTensorsConfig.get_quant_method`` gives every attention layer
      one, and its fp8_e5m2 gate then refuses the cache; vllm-project/vllm#45040 dropped that
      for checkpoints without ``kv_cache_scheme``).
    - An e5m2 cache the host accepted: the checkpoint's scales where an accepting verdict says
      it uses them (:attr:`ScaleSource.CHECKPOINT`) and the checkpoint has some, unit
      scales otherwise (e5m2 needs no scales, so dense FP8-weight checkpoints boot with unit
      ones, as 1CatAI/1Cat-vLLM#54 lets them).
    - Everything else, and no decision (no device to judge for, or no plugin had an opinion):
      the engine's own method and rule.
    """
    if config.method == COMPRESSED_TENSORS and config.kv_cache_scheme is None:
        return KVMethod.UNIT_SCALES
    if decision is None or decision.accepted is not True:
        return KVMethod.ENGINE
    request = decision.request
    if canonical_kv_dtype(request.kv_cache_dtype, request.activation_dtype) != "fp8_e5m2":
        return KVMethod.ENGINE
    uses_checkpoint = any(
        scale_source(verdict) is ScaleSource.CHECKPOINT
        for _, verdict in decision.verdicts
        if verdict.status is VerdictStatus.ACCEPT
    )
    if uses_checkpoint and request.checkpoint.scheme is not KVScaleScheme.NONE:
        return KVMethod.CHECKPOINT_SCALES
    return KVMethod.UNIT_SCALES


def describe(decision: KVDecision) -> str:
    """One log line: the outcome and every plugin's warning."""
    request = decision.request
    outcome = {True: "accepted", False: "rejected", None: "left to vLLM (no plugin opinion)"}[
        decision.accepted
    ]
    line = (
        f"--kv-cache-dtype {request.kv_cache_dtype} on {request.device.sm} "
        f"({request.checkpoint.source or 'checkpoint'}): {outcome}"
    )
    if decision.warnings:
        line += "; warnings: " + "; ".join(decision.warnings)
    return line
