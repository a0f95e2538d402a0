"""The kernel configurations the compile gates check, one for each build the plugin ships on a
device (:func:`volta_fp8w.dispatch.triton_builds`, :func:`~volta_fp8w.dispatch.moe_builds`,
:func:`~volta_fp8w.dispatch.tensor_core_builds`,
:func:`~volta_fp8w.dispatch.moe_tensor_core_builds` and
:func:`~volta_fp8w.dispatch.cuda_gemv_builds`): each build's kernel by import path, its
signature, and its constexprs (NVRTC options) as the launcher takes them, so the gate compiles
exactly the builds that run. Which builds ship is :mod:`volta_fp8w.dispatch`'s; this module only
maps one to its configuration.

Torch- and triton-free: the plugin's ``volta_kernel_configs`` and ``volta_cuda_kernel_configs``
hooks return :func:`kernel_configs` and :func:`cuda_builds`.
"""

from __future__ import annotations

from volta_core import CudaKernelConfig, Device, KernelConfig
from volta_fp8w.cuda.launch_args import gemv_config, mma_config, moe_mma_config
from volta_fp8w.dispatch import (
    DEQUANT_KERNEL,
    GEMM_KERNEL,
    MOE_COUNT_KERNEL,
    MOE_DOWN_KERNEL,
    MOE_GATE_UP_KERNEL,
    MOE_GEMV_DOWN_KERNEL,
    MOE_GEMV_GATE_UP_KERNEL,
    MOE_PLACE_KERNEL,
    MOE_SUM_KERNEL,
    SPLITK_KERNEL,
    TritonBuild,
    cuda_gemv_builds,
    moe_builds,
    moe_tensor_core_builds,
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
    # The fused experts' kernels (volta_fp8w.kernels.moe): stacked e4m3 codes and fp32 scales
    # with the expert first, fp16 activations, fp32 router weights; the router's ids and the
    # expert map as int32 here (a build's own types replace them, TritonBuild.types).
    MOE_GEMV_GATE_UP_KERNEL: {
        "x_ptr": "*fp16",
        "w_ptr": "*u8",
        "s_ptr": "*fp32",
        "act_ptr": "*fp32",
        "rw_ptr": "*fp32",
        "ids_ptr": "*i32",
        "map_ptr": "*i32",
        **dict.fromkeys(("HIDDEN", "INTER", "EXPERTS", "GLOBAL", "TOP_K", "S_COLS"), "i32"),
        **dict.fromkeys(("stride_xm", "stride_we", "stride_se"), "i32"),
    },
    MOE_GEMV_DOWN_KERNEL: {
        "act_ptr": "*fp32",
        "w_ptr": "*u8",
        "s_ptr": "*fp32",
        "part_ptr": "*fp32",
        "rw_ptr": "*fp32",
        "ids_ptr": "*i32",
        "map_ptr": "*i32",
        **dict.fromkeys(("HIDDEN", "INTER", "EXPERTS", "GLOBAL", "S_COLS"), "i32"),
        **dict.fromkeys(("stride_we", "stride_se"), "i32"),
    },
    MOE_SUM_KERNEL: {
        "part_ptr": "*fp32",
        "out_ptr": "*fp16",
        "HIDDEN": "i32",
        "TOP_K": "i32",
        "stride_om": "i32",
    },
    MOE_COUNT_KERNEL: {
        "ids_ptr": "*i32",
        "map_ptr": "*i32",
        "count_ptr": "*i32",
        "rank_ptr": "*i32",
        "PAIRS": "i32",
        "EXPERTS": "i32",
        "GLOBAL": "i32",
    },
    MOE_PLACE_KERNEL: {
        "ids_ptr": "*i32",
        "map_ptr": "*i32",
        "count_ptr": "*i32",
        "rank_ptr": "*i32",
        "sorted_ptr": "*i32",
        "PAIRS": "i32",
        "EXPERTS": "i32",
        "GLOBAL": "i32",
    },
    MOE_GATE_UP_KERNEL: {
        "x_ptr": "*fp16",
        "w_ptr": "*u8",
        "s_ptr": "*fp32",
        "act_ptr": "*fp16",
        "rw_ptr": "*fp32",
        "sorted_ptr": "*i32",
        "count_ptr": "*i32",
        **dict.fromkeys(("PAIRS", "HIDDEN", "INTER", "EXPERTS", "TOP_K", "S_COLS"), "i32"),
        **dict.fromkeys(("stride_xm", "stride_am", "stride_we", "stride_se"), "i32"),
    },
    MOE_DOWN_KERNEL: {
        "act_ptr": "*fp16",
        "w_ptr": "*u8",
        "s_ptr": "*fp32",
        "out_ptr": "*fp32",
        "rw_ptr": "*fp32",
        "sorted_ptr": "*i32",
        "count_ptr": "*i32",
        **dict.fromkeys(("PAIRS", "HIDDEN", "INTER", "EXPERTS", "TOP_K", "S_COLS"), "i32"),
        **dict.fromkeys(("stride_am", "stride_om", "stride_we", "stride_se"), "i32"),
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
    "HAS_MAP": "map",
    "MUL_INPUT": "rw",
    "MUL_ROUTER": "rw",
    "E_POW2": "e",
    "BLOCK": "b",
}

#: Integer arguments that are multiples of 16 for model-sized layers: the JIT specializes them,
#: and the gate compiles each build so as well as unspecialized. The experts': the hidden and
#: intermediate sizes, the activations' and outputs' row strides, and an expert's codes.
_MODEL_DIVISIBLE = (
    "N",
    "K",
    "stride_xm",
    "stride_wn",
    "stride_om",
    "stride_on",
    "HIDDEN",
    "INTER",
    "stride_am",
    "stride_we",
)


def triton_config(build: TritonBuild) -> KernelConfig:
    """The gate's configuration of one Triton build: named by its kernel, constexprs and warps
    (and, where set, its stages and an argument type other than int32 ids)."""
    signature = {**_SIGNATURES[build.kernel], **dict(build.types)}
    constexprs = dict(build.constexprs)
    tile = "_".join(
        _SHORT.get(name, name.lower()) + ("" if isinstance(value, bool) else str(value))
        for name, value in build.constexprs
        if value is not False and name != "NUM_STAGES"  # the build's stages, named below
    )
    divisible = tuple(
        dict.fromkeys(a for a in (*build.aligned, *_MODEL_DIVISIBLE) if a in signature)
    )
    suffix = f"_s{build.num_stages}" if build.num_stages != 1 else ""
    if signature.get("ids_ptr", "*i32") != "*i32":
        suffix += f"_ids{signature['ids_ptr'].lstrip('*')}"
    return KernelConfig(
        name=f"{build.kernel.rsplit(':', 1)[1].removesuffix('_kernel')}_{tile}_w{build.num_warps}"
        + suffix,
        kernel=build.kernel,
        signature=signature,
        constexprs=constexprs,
        num_warps=build.num_warps,
        num_stages=build.num_stages,
        divisible_by_16=divisible,
    )


def kernel_configs(device: Device) -> list[KernelConfig]:
    """Every Triton build the plugin ships on ``device``: the linear layers' and the fused
    experts'."""
    builds = [*triton_builds(device.capability), *moe_builds(device.capability)]
    return [triton_config(build) for build in builds]


def cuda_builds(device: Device) -> list[CudaKernelConfig]:
    """Every CUDA build the plugin ships on ``device``: the one-token GEMV's, and on a V100 the
    tensor-core GEMMs' of the linear layers and the routed experts (gate/up and down)."""
    gemv = [gemv_config(launch) for launch in cuda_gemv_builds(device.capability)]
    dense = [mma_config(launch) for launch in tensor_core_builds(device.capability)]
    routed = [
        moe_mma_config(launch, gate_up)
        for launch, gate_up in moe_tensor_core_builds(device.capability)
    ]
    return gemv + dense + routed
