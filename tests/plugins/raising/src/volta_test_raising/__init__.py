"""A test-only plugin whose hooks raise when asked about its fictitious method or device.

Inert for real models: it raises only for checkpoints whose ``quant_method`` is
``test-raising``, for reasoning text containing ``volta-test-raise`` (or the text named by
``VOLTA_TEST_RAISE_ON``, which the server end-to-end test sets to what its model generates) and
for kernel configurations on the fictitious capability 1.0.
"""

from __future__ import annotations

import os

from volta_core import Device, hookimpl
from volta_core.host.types import (
    KernelConfig,
    KVRequest,
    KVVerdict,
    QuantClaim,
    QuantConfig,
    QuantLayer,
    QuantMethodSpec,
    ReasoningContext,
    ReasoningSplit,
)

VOLTA_HOST_API = "1.0"

TRIGGER = "test-raising"


@hookimpl
def volta_quant_methods() -> list[QuantMethodSpec]:
    return [QuantMethodSpec(TRIGGER, "volta_test_raising:Method")]


@hookimpl
def volta_quant_method(config: QuantConfig, layer: QuantLayer, device: Device) -> QuantClaim | None:
    if config.method == TRIGGER:
        raise RuntimeError("volta_test_raising raises in volta_quant_method on purpose")
    return None


@hookimpl
def volta_kv_cache_verdict(request: KVRequest) -> KVVerdict | None:
    if request.checkpoint.weight_format == TRIGGER:
        raise RuntimeError("volta_test_raising raises in volta_kv_cache_verdict on purpose")
    return None


@hookimpl
def volta_reasoning_postprocess(
    split: ReasoningSplit, context: ReasoningContext
) -> ReasoningSplit | None:
    markers = ("volta-test-raise", os.environ.get("VOLTA_TEST_RAISE_ON") or "volta-test-raise")
    if any(marker in context.text for marker in markers):
        raise RuntimeError("volta_test_raising raises in volta_reasoning_postprocess on purpose")
    return None


@hookimpl
def volta_kernel_configs(device: Device) -> list[KernelConfig]:
    if device.capability == (1, 0):
        raise RuntimeError("volta_test_raising raises in volta_kernel_configs on purpose")
    return []
