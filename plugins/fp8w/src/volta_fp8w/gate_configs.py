"""The kernel configurations the compile gates check, one for each build the plugin ships on a
device (:func:`volta_fp8w.dispatch.triton_builds` and
:func:`~volta_fp8w.dispatch.tensor_core_builds`): each build's kernel by import path, its
signature, and its constexprs (NVRTC options) as the launcher takes them, so the gate compiles
exactly the builds that run. Which builds ship is :mod:`volta_fp8w.dispatch`'s; this module only
maps one to its configuration.

Torch- and triton-free: the plugin's ``volta_kernel_configs`` and ``volta_cuda_kernel_configs``
hooks return :func:`kernel_configs` and :func:`cuda_builds`.
"""

from __future__ import annotations

from volta_core import CudaKernelConfig, Device, KernelConfig
from volta_fp8w.cuda.launch_args import mma_config
from volta_fp8w.dispatch import (
    DEQUANT_KERNEL,
    GEMM_KERNEL,
    SPLITK_KERNEL,
    TritonBuild,
    tensor_core_builds,
    triton_builds,
)

_INTS = ("N", "K", "stride_xm", "stride_wn", "stride_sn", "stride_sk", "stride_om")

#: Each kernel's arguments before its constexprs (the e4m3 codes as bytes, fp32 scales).
_SIGNATURES: dict[str, dict[str, str]] = {
    SPLITK_KERNEL: {
        "x_ptr": "*fp16",
        "w_ptr": "*u8",
        "s_ptr": "*fp32",
        "b_ptr": "*fp16",
        "out_ptr": "*fp16",
        "ws_ptr": "*fp32",
        "cnt_ptr": "*i32",
        "M": "i32",
        **dict.fromkeys(_INTS, "i32"),
        "SCALE_N": "i32",
        "SCALE_K": "i32",
        "K_PER_SPLIT": "i32",
    },
    GEMM_KERNEL: {
        "x_ptr": "*fp16",
        "w_ptr": "*u8",
        "s_ptr": "*fp32",
        "b_ptr": "*fp16",
        "out_ptr": "*fp16",
        "M": "i32",
        **dict.fromkeys(_INTS, "i32"),
        "SCALE_N": "i32",
        "SCALE_K": "i32",
    },
    DEQUANT_KERNEL: {
        "w_ptr": "*u8",
        "s_ptr": "*fp32",
        "out_ptr": "*fp16",
        "N": "i32",
        "K": "i32",
        "stride_wn": "i32",
        "stride_sn": "i32",
        "stride_sk": "i32",
        "stride_on": "i32",
        "SCALE_N": "i32",
        "SCALE_K": "i32",
    },
}

#: Constexprs as a configuration's name spells them.
_SHORT = {
    "BLOCK_M": "m",
    "BLOCK_N": "n",
    "BLOCK_K": "k",
    "GROUP_M": "g",
    "HAS_BIAS": "bias",
    "SPLIT": "split",
}

#: Integer arguments that are multiples of 16 for model-sized layers: the JIT specializes them,
#: and the gate compiles each build so as well as unspecialized.
_MODEL_DIVISIBLE = ("N", "K", "stride_xm", "stride_wn", "stride_om", "stride_on")


def triton_config(build: TritonBuild) -> KernelConfig:
    """The gate's configuration of one Triton build."""
    signature = _SIGNATURES[build.kernel]
    constexprs = dict(build.constexprs)
    tile = "_".join(
        _SHORT.get(name, name.lower()) + ("" if isinstance(value, bool) else str(value))
        for name, value in build.constexprs
        if value is not False
    )
    divisible = tuple(
        dict.fromkeys(a for a in (*build.aligned, *_MODEL_DIVISIBLE) if a in signature)
    )
    return KernelConfig(
        name=f"{build.kernel.rsplit(':', 1)[1].removesuffix('_kernel')}_{tile}_w{build.num_warps}",
        kernel=build.kernel,
        signature=signature,
        constexprs=constexprs,
        num_warps=build.num_warps,
        divisible_by_16=divisible,
    )


def kernel_configs(device: Device) -> list[KernelConfig]:
    """Every Triton build the plugin ships on ``device``."""
    return [triton_config(build) for build in triton_builds(device.capability)]


def cuda_builds(device: Device) -> list[CudaKernelConfig]:
    """Every tensor-core GEMM build the plugin ships on ``device`` (none off the V100)."""
    return [mma_config(launch) for launch in tensor_core_builds(device.capability)]
