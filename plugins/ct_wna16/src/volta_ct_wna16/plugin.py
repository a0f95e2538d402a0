"""The hooks of the ``ct_wna16`` plugin (entry point target: imports no torch, triton or vllm).

It claims the linear layers and the fused MoE experts of compressed-tensors ``pack-quantized``
checkpoints that are weight-only int4/int8, group-wise (32, 64, 128) or channel-wise, symmetric
or asymmetric, on Volta and Turing (compute capability 7.x, where vLLM's own WNA16 kernels
refuse: minimum 7.5 for Marlin-class kernels) and on the Hopper H100 the kernels are tested on.
Everything else in such a checkpoint is declined with the reason, so ``vllm-volta plan`` shows
why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

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
from volta_ct_wna16.limits import supports_device
from volta_ct_wna16.scheme import Unsupported, WeightScheme, layer_scheme

VOLTA_HOST_API = "1.1"

#: The quant method's name in plans and claims.
METHOD = "ct-wna16"

#: The factory the vLLM adapter calls for a claimed linear layer.
FACTORY = "volta_ct_wna16.linear:make_linear_method"

#: The factory for claimed fused MoE experts.
MOE_FACTORY = "volta_ct_wna16.moe:make_moe_method"

#: The checkpoint names of one expert's gate, up and down projections (vLLM's defaults).
EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")

#: Claim priority: above a generic plugin, below one written for a specific model.
PRIORITY = 10

COMPRESSED_TENSORS = "compressed-tensors"


@hookimpl
def volta_quant_methods() -> Iterable[QuantMethodSpec]:
    return [
        QuantMethodSpec(
            name=METHOD,
            impl=FACTORY,
            description=(
                "compressed-tensors pack-quantized int4/int8 weights (group 32/64/128 or "
                "channel-wise, sym/asym), fp16 activations, Triton split-K GEMV and GEMM, and "
                "on a V100 with NVRTC a CUDA tensor-core GEMM for 8-256 tokens; fused MoE "
                "experts: GEMVs on the router's ids up to 16 tokens, routed blocks above"
            ),
        )
    ]


@hookimpl
def volta_quant_method(
    config: QuantConfig, layer: QuantLayer, device: Device
) -> QuantClaim | QuantDecline | None:
    if config.method != COMPRESSED_TENSORS:
        return None
    if layer.kind in (LayerKind.ATTENTION, LayerKind.EMBEDDING):
        return None
    moe = layer.kind is LayerKind.FUSED_MOE
    scheme = (
        expert_scheme(config.raw, layer.prefix)
        if moe
        else layer_scheme(config.raw, layer.prefix, is_linear=True)
    )
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
    if moe:
        return QuantClaim(
            method=METHOD,
            impl=MOE_FACTORY,
            priority=PRIORITY,
            detail=f"{scheme.label} fused MoE experts",
        )
    # The kernels at each token count are the plan's kernel paths (volta_kernel_paths).
    return QuantClaim(method=METHOD, impl=FACTORY, priority=PRIORITY, detail=scheme.label)


def expert_scheme(
    raw: Mapping[str, Any],
    prefix: str,
    projections: Sequence[str] = EXPERT_PROJECTIONS,
    ignore: Iterable[str] | None = None,
) -> WeightScheme | Unsupported | None:
    """The scheme of a fused-experts module, read from expert 0's projections as vLLM does.

    The checkpoint quantizes each expert's projections as linear layers (a ``Linear`` target
    covers them); vLLM fuses them into one module and requires one scheme for all three.
    ``ignore`` replaces the checkpoint's list (the factory passes vLLM's, mapped to its module
    names). None: the experts stay unquantized.
    """
    if ignore is not None:
        raw = {**raw, "ignore": list(ignore)}
    names = [f"{prefix}.0.{projection}" for projection in projections]
    schemes = [layer_scheme(raw, name, is_linear=True) for name in names]
    if any(s != schemes[0] for s in schemes):
        found = ", ".join(
            f"{name.rsplit('.', 1)[-1]}: {_describe(s)}"
            for name, s in zip(names, schemes, strict=True)
        )
        return Unsupported(f"the experts' projections are quantized differently ({found})")
    return schemes[0]


def _describe(scheme: WeightScheme | Unsupported | None) -> str:
    if isinstance(scheme, WeightScheme):
        return scheme.label
    return scheme.reason if scheme is not None else "unquantized"


@hookimpl
def volta_kernel_configs(device: Device) -> Iterable[KernelConfig]:
    from volta_ct_wna16.gate_configs import kernel_configs

    return kernel_configs(device)


@hookimpl
def volta_cuda_kernel_configs(device: Device) -> Iterable[CudaKernelConfig]:
    from volta_ct_wna16.gate_configs import cuda_builds

    return cuda_builds(device)


@hookimpl
def volta_kernel_paths(
    layer: AttentionLayer | QuantLayer, served_by: str, device: Device, quant: QuantConfig | None
) -> Iterable[KernelPath]:
    """For a claimed linear layer or fused experts, the kernel at each range of token counts
    (from the launcher's rules, :mod:`volta_ct_wna16.paths`)."""
    from volta_ct_wna16.paths import expert_paths, linear_paths

    if served_by != METHOD or quant is None or not isinstance(layer, QuantLayer):
        return []
    if layer.kind is LayerKind.FUSED_MOE:
        return expert_paths(device.capability)
    if layer.kind is not LayerKind.LINEAR or not (layer.input_size and layer.output_size):
        return []
    scheme = layer_scheme(quant.raw, layer.prefix, is_linear=True)
    if not isinstance(scheme, WeightScheme):
        return []
    return linear_paths(layer.output_size, layer.input_size, scheme, device.capability)
