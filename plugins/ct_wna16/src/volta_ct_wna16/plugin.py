"""The hooks of the ``ct_wna16`` plugin (entry point target: imports no torch, triton or vllm).

It claims the linear layers of compressed-tensors ``pack-quantized`` checkpoints that are
weight-only int4/int8, group-wise (32, 64, 128) or channel-wise, symmetric or asymmetric, on
Volta and Turing (compute capability 7.x, where vLLM's own WNA16 kernels refuse: minimum 7.5
for Marlin-class kernels) and on the Hopper H100 the kernels are tested on. Everything else in
such a checkpoint is declined with the reason, so ``vllm-volta plan`` shows why.
"""

from __future__ import annotations

from collections.abc import Iterable

from volta_core import hookimpl
from volta_core.device import Device
from volta_core.types import (
    KernelConfig,
    LayerKind,
    QuantClaim,
    QuantConfig,
    QuantDecline,
    QuantLayer,
    QuantMethodSpec,
)
from volta_ct_wna16.scheme import Unsupported, layer_scheme

VOLTA_HOST_API = "1.0"

#: The quant method's name in plans and claims.
METHOD = "ct-wna16"

#: The factory the vLLM adapter calls for a claimed layer.
FACTORY = "volta_ct_wna16.linear:make_linear_method"

#: Claim priority: above a generic plugin, below one written for a specific model.
PRIORITY = 10

#: Compute capabilities the kernels run on: Volta/Turing (the target) and Hopper (tested).
CAPABILITY_MAJORS = (7,)
TESTED_CAPABILITIES = ((9, 0),)

COMPRESSED_TENSORS = "compressed-tensors"


def supports_device(device: Device) -> bool:
    return device.capability[0] in CAPABILITY_MAJORS or device.capability in TESTED_CAPABILITIES


@hookimpl
def volta_quant_methods() -> Iterable[QuantMethodSpec]:
    return [
        QuantMethodSpec(
            name=METHOD,
            impl=FACTORY,
            description=(
                "compressed-tensors pack-quantized int4/int8 weights (group 32/64/128 or "
                "channel-wise, sym/asym), fp16 activations, Triton split-K GEMV and GEMM"
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
    # vLLM lets a ``Linear`` target cover fused MoE experts too (they are linear layers fused).
    scheme = layer_scheme(config.raw, layer.prefix, is_linear=True)
    if scheme is None:
        return None
    if isinstance(scheme, Unsupported):
        return QuantDecline(METHOD, scheme.reason)
    if layer.kind is LayerKind.FUSED_MOE:
        return QuantDecline(METHOD, f"{scheme.label}: fused MoE experts are not implemented")
    if not supports_device(device):
        return QuantDecline(
            METHOD,
            f"{device.sm} is neither Volta/Turing nor a tested device; "
            "vLLM's own kernels run there",
        )
    return QuantClaim(
        method=METHOD,
        impl=FACTORY,
        priority=PRIORITY,
        detail=f"{scheme.label}: Triton split-K GEMV (decode) / tiled GEMM",
    )


@hookimpl
def volta_kernel_configs(device: Device) -> Iterable[KernelConfig]:
    from volta_ct_wna16.configs import kernel_configs

    return kernel_configs(device)
