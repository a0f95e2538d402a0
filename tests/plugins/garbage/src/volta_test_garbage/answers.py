"""A plugin with valid declarations whose answers are of the wrong type when asked.

Inert for real models: it answers only for checkpoints whose ``quant_method`` is
``test-garbage`` and for reasoning text containing ``volta-test-garbage``.
"""

from __future__ import annotations

from volta_core import Device, hookimpl
from volta_core.host.types import (
    KVRequest,
    QuantConfig,
    QuantLayer,
    QuantMethodSpec,
    ReasoningContext,
    ReasoningSplit,
)

VOLTA_HOST_API = "1.0"

TRIGGER = "test-garbage"


@hookimpl
def volta_quant_methods() -> list[QuantMethodSpec]:
    return [QuantMethodSpec(TRIGGER, "volta_test_garbage.answers:Method")]


@hookimpl
def volta_quant_method(config: QuantConfig, layer: QuantLayer, device: Device) -> object:
    return "claimed" if config.method == TRIGGER else None


@hookimpl
def volta_kv_cache_verdict(request: KVRequest) -> object:
    return {"status": "accept"} if request.checkpoint.weight_format == TRIGGER else None


@hookimpl
def volta_reasoning_postprocess(split: ReasoningSplit, context: ReasoningContext) -> object:
    return "garbage" if "volta-test-garbage" in context.text else None
