"""A working test plugin: one declaration per hook family, none of which touches a real model."""

from __future__ import annotations

from volta_core import Device, hookimpl
from volta_core.host.types import (
    AttentionBackendSpec,
    KVRequest,
    KVVerdict,
    QuantClaim,
    QuantConfig,
    QuantLayer,
    QuantMethodSpec,
    ReasoningParserSpec,
)

VOLTA_HOST_API = "1.0"

#: Capability of the fictitious device the KV rule judges; no real GPU has it.
TEST_CAPABILITY = (1, 0)


@hookimpl
def volta_attention_backends() -> list[AttentionBackendSpec]:
    return [
        AttentionBackendSpec(
            name="TEST_HEALTHY_ATTN",
            impl="volta_test_healthy:Backend",
            priority=-100,
            min_capability=TEST_CAPABILITY,
            max_capability=TEST_CAPABILITY,
            dtypes={"float16"},
            kv_cache_dtypes={"float16"},
            head_sizes={8},
        )
    ]


@hookimpl
def volta_quant_methods() -> list[QuantMethodSpec]:
    return [QuantMethodSpec("test-quant", "volta_test_healthy:QuantMethod")]


@hookimpl
def volta_quant_method(config: QuantConfig, layer: QuantLayer, device: Device) -> QuantClaim | None:
    if config.method != "test-quant":
        return None
    return QuantClaim("test-quant", "volta_test_healthy:QuantMethod", detail=layer.prefix)


@hookimpl
def volta_kv_cache_verdict(request: KVRequest) -> KVVerdict | None:
    if request.device.capability != TEST_CAPABILITY:
        return None
    return KVVerdict.accept("test device", "test warning", scales="unit")


@hookimpl
def volta_reasoning_parsers() -> list[ReasoningParserSpec]:
    return [ReasoningParserSpec("test-healthy", "volta_test_healthy:Parser")]
