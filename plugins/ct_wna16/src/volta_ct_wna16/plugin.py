"""The hooks of the ``ct_wna16`` plugin (entry point target: imports no torch, triton or vllm).

It claims the linear layers and the fused MoE experts of compressed-tensors ``pack-quantized``
checkpoints that are weight-only int4/int8, group-wise (32, 64, 128) or channel-wise, symmetric
or asymmetric, and of AWQ (GEMM packing) and GPTQ checkpoints of the same schemes (weights
repacked once at load: :mod:`volta_ct_wna16.repack`), on Volta and Turing (compute
capability 7.x, where vLLM's own WNA16, AWQ and Marlin kernels refuse: minimum 7.5) and on
the Hopper H100 the kernels are tested on. Everything else in such a checkpoint is declined
with the reason, so ``vllm-volta plan`` shows why.
"""

from __future__ import annotations

from collections.abc import Iterable

from volta_core import (
    AttentionLayer,
    CudaKernelConfig,
    Device,
    KernelConfig,
    KernelPath,
    LayerKind,
    QuantClaim,
    QuantConfig,
    QuantDecline,
    QuantLayer,
    QuantMethodSpec,
    hookimpl,
)
from volta_core.kernel_api import BenchCase, StageCost, Workload
from volta_ct_wna16.awq_gptq import AWQ_METHODS, GPTQ_METHODS
from volta_ct_wna16.limits import supports_device
from volta_ct_wna16.scheme import Packing, Unsupported, WeightScheme, quant_layer_scheme

VOLTA_HOST_API = "1.4"

#: The quant method's name in plans and claims.
METHOD = "ct-wna16"

#: The factory the vLLM adapter calls for a claimed linear layer.
FACTORY = "volta_ct_wna16.linear:make_linear_method"

#: The factory for claimed fused MoE experts.
MOE_FACTORY = "volta_ct_wna16.moe:make_moe_method"

#: The factories for AWQ and GPTQ checkpoints' linear layers and fused MoE experts.
AWQ_GPTQ_FACTORY = "volta_ct_wna16.awq_gptq_linear:make_linear_method"
AWQ_GPTQ_MOE_FACTORY = "volta_ct_wna16.awq_gptq_moe:make_moe_method"

#: The functions making ``vllm-volta bench``'s calls (:mod:`volta_ct_wna16.bench_cases`).
LINEAR_CALL = "volta_ct_wna16.bench_cases:linear_call"
EXPERTS_CALL = "volta_ct_wna16.bench_cases:experts_call"

#: Claim priority: above a generic plugin, below one written for a specific model.
PRIORITY = 10

COMPRESSED_TENSORS = "compressed-tensors"

#: The ``quant_method`` names the plugin reads (vLLM's Marlin and "auto" variants of AWQ and
#: GPTQ name the same checkpoints).
METHODS = frozenset({COMPRESSED_TENSORS}) | AWQ_METHODS | GPTQ_METHODS


@hookimpl
def volta_quant_methods() -> Iterable[QuantMethodSpec]:
    return [
        QuantMethodSpec(
            name=METHOD,
            impl=FACTORY,
            description=(
                "compressed-tensors pack-quantized, AWQ and GPTQ int4/int8 weights (group "
                "32/64/128 or channel-wise, sym/asym, GPTQ act-order), fp16 activations, "
                "Triton split-K GEMV and GEMM, and "
                "on a V100 with NVRTC a CUDA tensor-core GEMM for 8-256 tokens; fused MoE "
                "experts: GEMVs on the router's ids up to 16 tokens, routed blocks above"
            ),
        )
    ]


@hookimpl
def volta_quant_method(
    config: QuantConfig, layer: QuantLayer, device: Device
) -> QuantClaim | QuantDecline | None:
    if config.method not in METHODS:
        return None
    scheme = quant_layer_scheme(config.raw, layer)
    if scheme is None:
        return None
    if isinstance(scheme, Unsupported):
        return QuantDecline(METHOD, scheme.reason)
    if not supports_device(device.capability):
        return QuantDecline(
            METHOD,
            f"{device.sm} is neither Volta/Turing nor a tested device; "
            "vLLM's own kernels run there",
        )
    compressed = scheme.packing is Packing.CT
    if layer.kind is LayerKind.FUSED_MOE:
        return QuantClaim(
            method=METHOD,
            impl=MOE_FACTORY if compressed else AWQ_GPTQ_MOE_FACTORY,
            priority=PRIORITY,
            detail=f"{scheme.label} fused MoE experts",
        )
    detail = scheme.label
    if scheme.act_order:
        detail += ": rows sorted by group at load, each call gathers its input"
    # The kernels at each token count are the plan's kernel paths (volta_kernel_paths).
    return QuantClaim(
        method=METHOD,
        impl=FACTORY if compressed else AWQ_GPTQ_FACTORY,
        priority=PRIORITY,
        detail=detail,
    )


@hookimpl
def volta_kernel_configs(device: Device) -> Iterable[KernelConfig]:
    from volta_ct_wna16.gate_configs import kernel_configs

    return kernel_configs(device)


@hookimpl
def volta_cuda_kernel_configs(device: Device) -> Iterable[CudaKernelConfig]:
    from volta_ct_wna16.gate_configs import cuda_builds, moe_cuda_builds

    return [*cuda_builds(device), *moe_cuda_builds(device)]


def _served_scheme(
    layer: AttentionLayer | QuantLayer, served_by: str, quant: QuantConfig | None
) -> WeightScheme | None:
    """The scheme of a layer this plugin's method serves, with its shape known (fused experts:
    their sizes; a linear layer: its rank's shape), else None."""
    if served_by != METHOD or quant is None or not isinstance(layer, QuantLayer):
        return None
    if layer.kind not in (LayerKind.LINEAR, LayerKind.FUSED_MOE):
        return None
    if layer.kind is LayerKind.LINEAR and not (layer.input_size and layer.output_size):
        return None
    scheme = quant_layer_scheme(quant.raw, layer)
    return scheme if isinstance(scheme, WeightScheme) else None


@hookimpl
def volta_kernel_paths(
    layer: AttentionLayer | QuantLayer, served_by: str, device: Device, quant: QuantConfig | None
) -> Iterable[KernelPath]:
    """For a claimed linear layer or fused experts, the kernel at each range of token counts,
    from the launcher's choices (:func:`volta_ct_wna16.dispatch.linear_paths`,
    :func:`~volta_ct_wna16.dispatch.expert_paths`)."""
    from volta_ct_wna16.dispatch import expert_layer, expert_paths, linear_paths

    scheme = _served_scheme(layer, served_by, quant)
    if scheme is None or not isinstance(layer, QuantLayer):
        return []
    if layer.kind is LayerKind.FUSED_MOE:
        return expert_paths(device.capability, expert_layer(layer, scheme))
    return linear_paths(layer.output_size, layer.input_size, scheme, device.capability)


@hookimpl
def volta_kernel_cost(
    layer: AttentionLayer | QuantLayer,
    served_by: str,
    device: Device,
    quant: QuantConfig | None,
    work: Workload,
) -> StageCost | None:
    """What ``work`` costs on a claimed linear layer or fused experts, on the stage of
    :func:`volta_kernel_paths` it falls in (:func:`volta_ct_wna16.dispatch.stage_cost`);
    None for a layer this plugin does not serve."""
    from volta_ct_wna16.dispatch import stage_cost

    scheme = _served_scheme(layer, served_by, quant)
    if scheme is None or not isinstance(layer, QuantLayer):
        return None
    return stage_cost(layer, scheme, device.capability, work)


@hookimpl
def volta_bench_case(
    layer: AttentionLayer | QuantLayer,
    served_by: str,
    device: Device,
    quant: QuantConfig | None,
    work: Workload,
) -> BenchCase | None:
    """For a claimed linear layer or fused experts whose inputs are not gathered (no GPTQ
    act-order), the stage and kernel of :func:`volta_kernel_cost`'s answer for the same work,
    made by :func:`volta_ct_wna16.bench_cases.linear_call` or
    :func:`~volta_ct_wna16.bench_cases.experts_call`; None otherwise."""
    scheme = _served_scheme(layer, served_by, quant)
    if scheme is None or scheme.act_order or not isinstance(layer, QuantLayer):
        return None
    cost = volta_kernel_cost(layer, served_by, device, quant, work)
    if cost is None:
        return None
    impl = EXPERTS_CALL if layer.kind is LayerKind.FUSED_MOE else LINEAR_CALL
    return BenchCase(cost.stage, cost.cost.kernel, impl)
