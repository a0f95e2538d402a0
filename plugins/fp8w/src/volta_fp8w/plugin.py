"""The hooks of the ``fp8w`` plugin (entry point target: imports no torch, triton or vllm).

It claims the linear layers and the fused MoE experts of dense FP8 checkpoints (vLLM's ``fp8``
method and compressed-tensors ``float-quantized``, e4m3 weights with block, channel or tensor
scales) on Volta and Turing (compute capability 7.x, where vLLM's ``Fp8Config`` asks for 7.5) and
on the Hopper GPUs the kernels are tested on, and runs them weight-only. Everything else such a
checkpoint quantizes is declined with the reason, so ``vllm-volta plan`` shows why.
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
from volta_fp8w.limits import supports_device
from volta_fp8w.scheme import COMPRESSED_TENSORS, FP8, Fp8Scheme, Unsupported, quant_layer_scheme

VOLTA_HOST_API = "1.4"

#: The quant method's name in plans and claims.
METHOD = "fp8w"

#: The factory the vLLM adapter calls for a claimed linear layer.
FACTORY = "volta_fp8w.linear:make_linear_method"

#: The factory for claimed fused MoE experts.
MOE_FACTORY = "volta_fp8w.moe:make_moe_method"

#: The functions making ``vllm-volta bench``'s calls (:mod:`volta_fp8w.bench_cases`).
LINEAR_CALL = "volta_fp8w.bench_cases:linear_call"
EXPERTS_CALL = "volta_fp8w.bench_cases:experts_call"

#: Claim priority: above a generic plugin, below one written for a specific model.
PRIORITY = 10


@hookimpl
def volta_quant_methods() -> Iterable[QuantMethodSpec]:
    return [
        QuantMethodSpec(
            name=METHOD,
            impl=FACTORY,
            description=(
                "dense FP8 e4m3 weights (vLLM fp8 and compressed-tensors float-quantized; block, "
                "channel or tensor scales) run weight-only with fp16 activations: Triton split-K "
                "GEMVs to 8 tokens, on a V100 with NVRTC a CUDA tensor-core GEMM above; fused "
                "MoE experts: GEMVs on the router's ids, routed blocks above"
            ),
        )
    ]


@hookimpl
def volta_quant_method(
    config: QuantConfig, layer: QuantLayer, device: Device
) -> QuantClaim | QuantDecline | None:
    if config.method not in (FP8, COMPRESSED_TENSORS):
        return None
    scheme = quant_layer_scheme(config.raw, layer)
    if scheme is None:
        return None
    if isinstance(scheme, Unsupported):
        return QuantDecline(METHOD, scheme.reason)
    if not supports_device(device.capability):
        return QuantDecline(
            METHOD,
            f"{device.sm} is neither Volta/Turing nor a tested device; vLLM's own FP8 kernels "
            "run there",
        )
    if layer.kind is LayerKind.FUSED_MOE:
        return QuantClaim(
            method=METHOD,
            impl=MOE_FACTORY,
            priority=PRIORITY,
            detail=f"fused MoE experts, {scheme.label}",
        )
    # The kernels at each token count are the plan's kernel paths (volta_kernel_paths).
    return QuantClaim(method=METHOD, impl=FACTORY, priority=PRIORITY, detail=scheme.label)


@hookimpl
def volta_kernel_configs(device: Device) -> Iterable[KernelConfig]:
    from volta_fp8w.gate_configs import kernel_configs

    return kernel_configs(device)


@hookimpl
def volta_cuda_kernel_configs(device: Device) -> Iterable[CudaKernelConfig]:
    from volta_fp8w.gate_configs import cuda_builds

    return cuda_builds(device)


def _served_scheme(
    layer: AttentionLayer | QuantLayer, served_by: str, quant: QuantConfig | None
) -> Fp8Scheme | None:
    """The scheme of a layer this plugin's method serves, with its shape known (fused experts:
    their sizes; a linear layer: its rank's shape), else None."""
    if served_by != METHOD or quant is None or not isinstance(layer, QuantLayer):
        return None
    if layer.kind not in (LayerKind.LINEAR, LayerKind.FUSED_MOE):
        return None
    if layer.kind is LayerKind.LINEAR and not (layer.input_size and layer.output_size):
        return None
    scheme = quant_layer_scheme(quant.raw, layer)
    return scheme if isinstance(scheme, Fp8Scheme) else None


@hookimpl
def volta_kernel_paths(
    layer: AttentionLayer | QuantLayer, served_by: str, device: Device, quant: QuantConfig | None
) -> Iterable[KernelPath]:
    """For a claimed linear layer or fused experts, the kernel at each range of token counts,
    from the launcher's choices (:func:`volta_fp8w.dispatch.linear_paths`,
    :func:`~volta_fp8w.dispatch.expert_paths`) on the shape one tensor-parallel rank holds, as
    the launcher and the estimate see it (the one-token CUDA GEMV depends on the outputs)."""
    from volta_fp8w.dispatch import expert_layer, expert_paths, linear_paths

    scheme = _served_scheme(layer, served_by, quant)
    if scheme is None or not isinstance(layer, QuantLayer):
        return []
    if layer.kind is LayerKind.FUSED_MOE:
        return expert_paths(device.capability, expert_layer(layer))
    n = layer.outputs_per_rank or layer.output_size
    k = layer.inputs_per_rank or layer.input_size
    return linear_paths(n, k, device.capability)


@hookimpl
def volta_kernel_cost(
    layer: AttentionLayer | QuantLayer,
    served_by: str,
    device: Device,
    quant: QuantConfig | None,
    work: Workload,
) -> StageCost | None:
    """What ``work`` costs on a claimed linear layer or fused experts, on the stage of
    :func:`volta_kernel_paths` it falls in (:func:`volta_fp8w.dispatch.stage_cost`); None for a
    layer this plugin does not serve."""
    from volta_fp8w.dispatch import stage_cost

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
    """For a claimed linear layer or fused experts, the stage and kernel of
    :func:`volta_kernel_cost`'s answer for the same work, made by
    :func:`volta_fp8w.bench_cases.linear_call` or :func:`~volta_fp8w.bench_cases.experts_call`;
    None where the cost is (a layer this plugin does not serve, or of unknown shape)."""
    cost = volta_kernel_cost(layer, served_by, device, quant, work)
    if cost is None or not isinstance(layer, QuantLayer):
        return None
    impl = EXPERTS_CALL if layer.kind is LayerKind.FUSED_MOE else LINEAR_CALL
    return BenchCase(cost.stage, cost.cost.kernel, impl)
