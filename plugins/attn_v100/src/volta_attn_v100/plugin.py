"""The plugin module (entry point ``attn_v100``): declarations only, no torch/triton/vllm.

The declaration states exactly what the kernels are tested for (Gemma-4's 512-dim global layers
included, e4m3 KV from SM89); everything else (other head sizes, e4m3 KV below SM89, ALiBi,
encoder attention) falls back per layer through the host. The cache is written in the packed
layout by the plugin that owns each format (vllm-volta-fp8kv), through the host. The kernels and
the vLLM classes are named by import path and imported only when a layer uses them. Which
kernel runs, what the gates compile, the plan's kernel paths and their costs are
:mod:`volta_attn_v100.dispatch`'s answers.
"""

from __future__ import annotations

from collections.abc import Iterable

from volta_attn_v100 import dispatch
from volta_attn_v100.limits import (
    DTYPES,
    HEAD_SIZES,
    KV_DTYPE_MIN_CAPABILITY,
    KV_DTYPES,
    MAX_CAPABILITY,
    MIN_CAPABILITY,
)
from volta_core import (
    PACKED_KV_LAYOUT,
    AttentionBackendSpec,
    AttentionFeature,
    AttentionLayer,
    CudaKernelConfig,
    Device,
    KernelConfig,
    KernelPath,
    QuantConfig,
    QuantLayer,
    hookimpl,
)
from volta_core.kernel_api import BenchCase, StageCost, Workload

VOLTA_HOST_API = "1.3"

#: The backend's name in plans and listings.
BACKEND_NAME = "VOLTA_ATTN_V100"

FEATURES = frozenset(
    {
        AttentionFeature.SLIDING_WINDOW,
        AttentionFeature.LOGITS_SOFT_CAP,
        AttentionFeature.SINKS,
    }
)

SPEC = AttentionBackendSpec(
    name=BACKEND_NAME,
    impl="volta_attn_v100.backend:VoltaAttentionBackend",
    priority=100,
    min_capability=MIN_CAPABILITY,
    max_capability=MAX_CAPABILITY,
    dtypes=frozenset(DTYPES),
    kv_cache_dtypes=frozenset(KV_DTYPES),
    kv_dtype_min_capability=KV_DTYPE_MIN_CAPABILITY,
    head_sizes=frozenset(HEAD_SIZES),
    block_size_multiple=16,
    features=FEATURES,
    vllm_name="CUSTOM",
    kv_cache_layout=PACKED_KV_LAYOUT,
    notes=(
        "Triton split-KV paged decode + paged prefill, on SM70 CUDA tensor-core kernels where "
        "NVRTC is installed; fp16, fp8_e5m2 and (SM89+) fp8_e4m3 KV"
    ),
)


@hookimpl
def volta_attention_backends() -> Iterable[AttentionBackendSpec]:
    return [SPEC]


@hookimpl
def volta_kernel_configs(device: Device) -> Iterable[KernelConfig]:
    return dispatch.kernel_configs(device.capability)


@hookimpl
def volta_cuda_kernel_configs(device: Device) -> Iterable[CudaKernelConfig]:
    return dispatch.cuda_kernel_configs(device.capability)


@hookimpl
def volta_kernel_paths(
    layer: AttentionLayer | QuantLayer, served_by: str, device: Device, quant: QuantConfig | None
) -> Iterable[KernelPath]:
    if served_by != BACKEND_NAME or not isinstance(layer, AttentionLayer):
        return []
    return dispatch.attention_paths(layer, device.capability)


@hookimpl
def volta_kernel_cost(
    layer: AttentionLayer | QuantLayer,
    served_by: str,
    device: Device,
    quant: QuantConfig | None,
    work: Workload,
) -> StageCost | None:
    if served_by != BACKEND_NAME or not isinstance(layer, AttentionLayer):
        return None
    capability = device.capability
    return dispatch.stage_cost(layer, capability, dispatch.plan_sm_count(capability), work)


@hookimpl
def volta_bench_case(
    layer: AttentionLayer | QuantLayer,
    served_by: str,
    device: Device,
    quant: QuantConfig | None,
    work: Workload,
) -> BenchCase | None:
    """The stage and kernel of :func:`volta_kernel_cost`'s answer for the same work, made by
    :func:`volta_attn_v100.bench_cases.attention_call`."""
    cost = volta_kernel_cost(layer, served_by, device, quant, work)
    if cost is None:
        return None
    return BenchCase(cost.stage, cost.cost.kernel, "volta_attn_v100.bench_cases:attention_call")
