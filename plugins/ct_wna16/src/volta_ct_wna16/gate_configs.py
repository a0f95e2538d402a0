"""The kernel configurations the compile gates check, one for each build the plugin ships on
a device (:func:`volta_ct_wna16.dispatch.triton_builds`,
:func:`~volta_ct_wna16.dispatch.tensor_core_builds` and
:func:`~volta_ct_wna16.dispatch.moe_tensor_core_builds`): each build's kernel by import path, its
signature, and its constexprs (NVRTC options) from :mod:`volta_ct_wna16.launch`, as the
launcher takes them, so the gate compiles exactly the builds that run. Which builds ship is
:mod:`volta_ct_wna16.dispatch`'s; this module only maps one to its configuration.

Torch- and triton-free: the plugin's ``volta_kernel_configs`` and
``volta_cuda_kernel_configs`` hooks return :func:`kernel_configs`, and :func:`cuda_builds`
with :func:`moe_cuda_builds`.
"""

from __future__ import annotations

from volta_core import CudaKernelConfig, Device, KernelConfig
from volta_ct_wna16.dispatch import (
    Build,
    DecodeBuild,
    DequantBuild,
    FusedBuild,
    GemmBuild,
    MmaBuild,
    MoEBuild,
    MoeMmaBuild,
    RouteCountBuild,
    RoutePlaceBuild,
    SiluBuild,
    SplitKBuild,
    TopKBuild,
    moe_tensor_core_builds,
    tensor_core_builds,
    triton_builds,
)
from volta_ct_wna16.launch import (
    dequant_constexprs,
    gemm_constexprs,
    mma_options,
    moe_constexprs,
    moe_decode_constexprs,
    moe_fused_constexprs,
    splitk_constexprs,
)

#: The kernels' import paths, one module per kernel family.
SPLITK_KERNEL = "volta_ct_wna16.kernels.splitk:wna16_splitk_kernel"
GEMM_KERNEL = "volta_ct_wna16.kernels.gemm:wna16_gemm_kernel"
DEQUANT_KERNEL = "volta_ct_wna16.kernels.dequant:wna16_dequant_kernel"
MOE_KERNEL = "volta_ct_wna16.kernels.moe:wna16_moe_kernel"
ROUTE_COUNT_KERNEL = "volta_ct_wna16.kernels.routing:moe_count_kernel"
ROUTE_PLACE_KERNEL = "volta_ct_wna16.kernels.routing:moe_place_kernel"
SILU_KERNEL = "volta_ct_wna16.kernels.activation:silu_mul_kernel"
DECODE_GATE_UP_KERNEL = "volta_ct_wna16.kernels.moe_decode:moe_decode_gate_up_kernel"
DECODE_DOWN_KERNEL = "volta_ct_wna16.kernels.moe_decode:moe_decode_down_kernel"
DECODE_FUSED_KERNEL = "volta_ct_wna16.kernels.moe_decode:moe_decode_fused_kernel"
TOPK_KERNEL = "volta_ct_wna16.kernels.routing:topk_softmax_kernel"

_SPLITK_SIG = {
    "x_ptr": "*fp16",
    "w_ptr": "*i32",
    "s_ptr": "*fp16",
    "z_ptr": "*fp16",
    "b_ptr": "*fp16",
    "out_ptr": "*fp16",
    "ws_ptr": "*fp32",
    "cnt_ptr": "*i32",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "KW": "i32",
    "GROUP": "i32",
    "stride_xm": "i32",
    "stride_om": "i32",
    "K_PER_SPLIT": "i32",
}

_GEMM_SIG = {k: v for k, v in _SPLITK_SIG.items() if k not in ("ws_ptr", "cnt_ptr", "K_PER_SPLIT")}

_MOE_SIG = {
    "x_ptr": "*fp16",
    "w_ptr": "*i32",
    "s_ptr": "*fp16",
    "z_ptr": "*fp16",
    "out_ptr": "*fp16",
    "rw_ptr": "*fp32",
    "pair_ptr": "*i32",
    "expert_ptr": "*i32",
    "PAIRS": "i32",
    "N": "i32",
    "K": "i32",
    "KW": "i32",
    "GROUP": "i32",
    "EXPERTS": "i32",
    "ROW_DIV": "i32",
    "OUT_DIV": "i32",
    "stride_xm": "i32",
    "stride_om": "i32",
    "stride_we": "i32",
    "stride_se": "i32",
    "K_PER_SPLIT": "i32",
}

#: The decode kernels' arguments (gate/up's; down's renamed as below, plus its
#: ``SLOT_SPLITS``).
_DECODE_SIG = {
    "x_ptr": "*fp16",
    "w_ptr": "*i32",
    "s_ptr": "*fp16",
    "z_ptr": "*fp16",
    "h_ptr": "*fp16",
    "rw_ptr": "*fp32",
    "ids_ptr": "*i32",
    "map_ptr": "*i32",
    "ws_ptr": "*fp32",
    "cnt_ptr": "*i32",
    "PAIRS": "i32",
    "N": "i32",
    "K": "i32",
    "KW": "i32",
    "GROUP": "i32",
    "EXPERTS": "i32",
    "TOP_K": "i32",
    "stride_xm": "i32",
    "stride_hm": "i32",
    "stride_we": "i32",
    "stride_se": "i32",
    "K_PER_SPLIT": "i32",
}
_DECODE_DOWN_NAMES = {
    "x_ptr": "h_ptr",
    "h_ptr": "out_ptr",
    "PAIRS": "TOKENS",
    "stride_xm": "stride_hm",
    "stride_hm": "stride_om",
}

#: The one-launch decode step's arguments.
_FUSED_SIG = {
    "x_ptr": "*fp16",
    "w13_ptr": "*i32",
    "s13_ptr": "*fp16",
    "z13_ptr": "*fp16",
    "w2_ptr": "*i32",
    "s2_ptr": "*fp16",
    "z2_ptr": "*fp16",
    "out_ptr": "*fp16",
    "rw_ptr": "*fp32",
    "ids_ptr": "*i32",
    "map_ptr": "*i32",
    "acc_ptr": "*fp32",
    "cnt_ptr": "*i32",
    "PAIRS": "i32",
    "HIDDEN": "i32",
    "INTER": "i32",
    "KW13": "i32",
    "KW2": "i32",
    "EXPERTS": "i32",
    "TOP_K": "i32",
    "stride_xm": "i32",
    "stride_om": "i32",
    "stride_w13e": "i32",
    "stride_s13e": "i32",
    "stride_w2e": "i32",
    "stride_s2e": "i32",
}

_DEQUANT_SIG = {
    "w_ptr": "*i32",
    "s_ptr": "*fp16",
    "z_ptr": "*fp16",
    "out_ptr": "*fp16",
    "N": "i32",
    "K": "i32",
    "KW": "i32",
    "GROUP": "i32",
}


#: Integer arguments that are multiples of 16 for model-sized layers (every shape of the
#: benchmark, and the group sizes); the JIT specializes them, and the gate compiles them so
#: as well as unspecialized (:func:`volta_devkit.gate.gate_variants`).
_MODEL_DIVISIBLE = ("N", "K", "KW", "GROUP", "stride_xm", "stride_om")
_SPLITK_DIVISIBLE = (*_MODEL_DIVISIBLE, "K_PER_SPLIT")
_DEQUANT_DIVISIBLE = ("N", "K", "KW", "GROUP")
_MOE_DIVISIBLE = (*_MODEL_DIVISIBLE, "stride_we", "stride_se", "K_PER_SPLIT")
#: The decode kernels', each taking those it has: the routed blocks' sizes, weight strides and
#: split length, and the rows of their activations and outputs (gate/up's ``stride_xm`` and
#: ``stride_hm``, down's ``stride_hm`` and ``stride_om``).
_DECODE_DIVISIBLE = (*_MOE_DIVISIBLE, "stride_hm")

#: Pipeline stages of the routing's, the SiLU product's and the router's top-k launches, which
#: pass none: Triton's CUDA default (``CUDAOptions.num_stages``,
#: ``triton/backends/nvidia/compiler.py``), part of a build's cache key. None of these kernels
#: has a loop that loads, so the code is that of one stage.
TRITON_DEFAULT_STAGES = 3


def splitk_config(build: SplitKBuild) -> KernelConfig:
    """A split-K build's configuration, named by tile, warps, stages, unroll and its flags."""
    launch, bits, zp = build.launch, build.bits, build.zp
    tile = (
        f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
        f"w{launch.num_warps}s{launch.num_stages}r{launch.reduce_unroll}"
    )
    return KernelConfig(
        name=f"splitk_{'dot' if launch.use_dot else 'fma'}_{tile}_w{bits}{'a' if zp else 's'}"
        f"{'_ws' if build.use_ws else ''}{'_bias' if build.bias else ''}"
        f"{'_gt' if build.group_tile else ''}{'_z8' if build.zp8 else ''}"
        f"{'_at' if build.atomic else ''}{'_wh' if build.whole else ''}",
        kernel=SPLITK_KERNEL,
        signature={**_SPLITK_SIG, "z_ptr": "*u8"} if build.zp8 else _SPLITK_SIG,
        constexprs=splitk_constexprs(
            launch, bits, zp, build.bias, build.use_ws, build.group_tile, build.atomic, build.whole
        ),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        divisible_by_16=_SPLITK_DIVISIBLE,
    )


def gemm_config(build: GemmBuild) -> KernelConfig:
    """A GEMM build's configuration."""
    launch = build.launch
    tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
    return KernelConfig(
        name=f"gemm_{tile}_w{build.bits}{'a' if build.zp else 's'}{'_bias' if build.bias else ''}",
        kernel=GEMM_KERNEL,
        signature=_GEMM_SIG,
        constexprs=gemm_constexprs(launch, build.bits, build.zp, build.bias),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        divisible_by_16=_MODEL_DIVISIBLE,
    )


def dequant_config(build: DequantBuild) -> KernelConfig:
    """A dequantize build's configuration."""
    launch = build.launch
    return KernelConfig(
        name=f"dequant_n{launch.block_n}k{launch.block_k}_w{build.bits}{'a' if build.zp else 's'}",
        kernel=DEQUANT_KERNEL,
        signature=_DEQUANT_SIG,
        constexprs=dequant_constexprs(launch, build.bits, build.zp),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        divisible_by_16=_DEQUANT_DIVISIBLE,
    )


def moe_config(build: MoEBuild) -> KernelConfig:
    """A routed blocks' build's configuration; a swapped tile's (``Launch.swap``) name ends in
    ``_swap``."""
    launch = build.launch
    tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
    tile += f"w{launch.num_warps}s{launch.num_stages}"
    return KernelConfig(
        name=f"moe_{tile}_w{build.bits}{'a' if build.zp else 's'}"
        f"{'_rw' if build.mul_router else ''}{'_atomic' if build.atomic else ''}"
        f"{'_gt' if build.group_tile else ''}{'_swap' if launch.swap else ''}",
        kernel=MOE_KERNEL,
        signature={**_MOE_SIG, "out_ptr": "*fp32" if build.atomic else "*fp16"},
        constexprs=moe_constexprs(
            launch, build.bits, build.zp, build.mul_router, build.group_tile, build.atomic
        ),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        divisible_by_16=_MOE_DIVISIBLE,
    )


def decode_config(build: DecodeBuild) -> KernelConfig:
    """A decode GEMV build's configuration (gate/up, or down with its ``SLOT_SPLITS``)."""
    launch = build.launch
    signature = dict(_DECODE_SIG)
    if build.down:
        signature = {_DECODE_DOWN_NAMES.get(name, name): kind for name, kind in signature.items()}
        signature["SLOT_SPLITS"] = "i32"
    tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
    tile += f"w{launch.num_warps}s{launch.num_stages}r{launch.reduce_unroll}"
    return KernelConfig(
        name=f"moe_decode_{'down' if build.down else 'gate_up'}_{tile}_w{build.bits}"
        f"{'a' if build.zp else 's'}{'_map' if build.has_map else ''}"
        f"{'_rw' if build.mul else ''}",
        kernel=DECODE_DOWN_KERNEL if build.down else DECODE_GATE_UP_KERNEL,
        signature=signature,
        constexprs=moe_decode_constexprs(
            launch, build.bits, build.zp, build.has_map, build.mul, build.down
        ),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        divisible_by_16=tuple(name for name in _DECODE_DIVISIBLE if name in signature),
    )


def fused_config(build: FusedBuild) -> KernelConfig:
    """A one-launch decode build's configuration, for groups of 128 (the group sizes are
    ``tl.constexpr``)."""
    fused = build.fused
    tile = f"j{fused.block_j}k{fused.block_k}n{fused.block_n}"
    tile += f"w{fused.num_warps}s{fused.num_stages}"
    return KernelConfig(
        name=f"moe_decode_fused_{tile}_w{build.bits}{'a' if build.zp else 's'}"
        f"{'_map' if build.has_map else ''}{'_rw' if build.mul else ''}"
        f"{'' if build.whole else '_masked'}",
        kernel=DECODE_FUSED_KERNEL,
        signature=_FUSED_SIG,
        constexprs=moe_fused_constexprs(
            fused, build.bits, build.zp, build.has_map, build.mul, (128, 128), build.whole
        ),
        num_warps=fused.num_warps,
        num_stages=fused.num_stages,
        divisible_by_16=(
            "HIDDEN", "INTER", "KW13", "KW2", "stride_w13e", "stride_s13e", "stride_w2e",
            "stride_s2e",
        ),
    )  # fmt: skip


def route_count_config(build: RouteCountBuild) -> KernelConfig:
    """The routing's first launch's configuration."""
    ids = f"*{build.ids}"
    return KernelConfig(
        name=f"moe_count_{build.ids}{'_map' if build.has_map else ''}",
        kernel=ROUTE_COUNT_KERNEL,
        signature={
            "ids_ptr": ids,
            "map_ptr": "*i32" if build.has_map else ids,
            "count_ptr": "*i32",
            "rank_ptr": "*i32",
            "local_ptr": "*i32",
            "PAIRS": "i32",
            "EXPERTS": "i32",
        },
        constexprs={"HAS_MAP": build.has_map, "BLOCK": build.block},
        num_stages=TRITON_DEFAULT_STAGES,
    )


def route_place_config(build: RoutePlaceBuild) -> KernelConfig:
    """The routing's second launch's configuration."""
    return KernelConfig(
        name=f"moe_place_e{build.e_pow2}_m{build.block_m}",
        kernel=ROUTE_PLACE_KERNEL,
        signature={
            "count_ptr": "*i32",
            "rank_ptr": "*i32",
            "local_ptr": "*i32",
            "pair_ptr": "*i32",
            "expert_ptr": "*i32",
            "PAIRS": "i32",
            "EXPERTS": "i32",
            "BLOCKS": "i32",
        },
        constexprs={"BLOCK_M": build.block_m, "E_POW2": build.e_pow2, "BLOCK": build.block},
        num_stages=TRITON_DEFAULT_STAGES,
    )


def silu_config(build: SiluBuild) -> KernelConfig:
    """The SiLU product's configuration."""
    return KernelConfig(
        name=f"silu_mul_{build.gate_up}",
        kernel=SILU_KERNEL,
        signature={
            "h_ptr": f"*{build.gate_up}",
            "out_ptr": "*fp16",
            "INTER": "i32",
            "stride_h": "i32",
            "stride_o": "i32",
        },
        constexprs={"BLOCK": build.block},
        divisible_by_16=("INTER", "stride_h", "stride_o"),
        num_stages=TRITON_DEFAULT_STAGES,
    )


def topk_config(build: TopKBuild) -> KernelConfig:
    """The router's top-k configuration."""
    return KernelConfig(
        name=f"topk_softmax_e{build.e_pow2}_{build.logits}",
        kernel=TOPK_KERNEL,
        signature={
            "logits_ptr": f"*{build.logits}",
            "w_ptr": "*fp32",
            "ids_ptr": "*i32",
            "EXPERTS": "i32",
            "TOP_K": "i32",
            "stride_l": "i32",
            "RENORMALIZE": "i32",
        },
        constexprs={"TOPK_POW2": build.top_k_pow2, "E_POW2": build.e_pow2},
        num_stages=TRITON_DEFAULT_STAGES,
    )


def kernel_config(build: Build) -> KernelConfig:
    """The gate's configuration of one Triton build."""
    if isinstance(build, SplitKBuild):
        return splitk_config(build)
    if isinstance(build, GemmBuild):
        return gemm_config(build)
    if isinstance(build, DequantBuild):
        return dequant_config(build)
    if isinstance(build, MoEBuild):
        return moe_config(build)
    if isinstance(build, DecodeBuild):
        return decode_config(build)
    if isinstance(build, FusedBuild):
        return fused_config(build)
    if isinstance(build, RouteCountBuild):
        return route_count_config(build)
    if isinstance(build, RoutePlaceBuild):
        return route_place_config(build)
    if isinstance(build, SiluBuild):
        return silu_config(build)
    return topk_config(build)


def kernel_configs(device: Device) -> list[KernelConfig]:
    """The configuration of every Triton build the plugin ships for ``device``."""
    return [kernel_config(build) for build in triton_builds(device.capability)]


def cuda_config(build: MmaBuild) -> CudaKernelConfig:
    """The CUDA gate's configuration of one tensor-core GEMM build."""
    from volta_ct_wna16.cuda import KERNEL, SOURCE

    launch = build.launch
    return CudaKernelConfig(
        name=f"mma_m{launch.block_m}n{launch.block_n}w{launch.num_warps}_w{build.bits}"
        f"{'a' if build.zp else 's'}",
        source=SOURCE,
        kernel=KERNEL,
        block_threads=launch.num_warps * 32,
        options=mma_options(launch, build.bits, build.zp),
        claims_tensor_cores=True,
    )


def cuda_builds(device: Device) -> list[CudaKernelConfig]:
    """The configuration of every tensor-core GEMM build the plugin ships for ``device``."""
    return [cuda_config(build) for build in tensor_core_builds(device.capability)]


def moe_cuda_config(build: MoeMmaBuild) -> CudaKernelConfig:
    """The CUDA gate's configuration of one routed experts' tensor-core GEMM build."""
    from volta_ct_wna16.cuda import MOE_KERNEL, MOE_SOURCE

    launch = build.launch
    return CudaKernelConfig(
        name=f"moe_mma_m{launch.block_m}n{launch.block_n}w{launch.num_warps}_w{build.bits}"
        f"{'a' if build.zp else 's'}",
        source=MOE_SOURCE,
        kernel=MOE_KERNEL,
        block_threads=launch.num_warps * 32,
        options=mma_options(launch, build.bits, build.zp),
        claims_tensor_cores=True,
    )


def moe_cuda_builds(device: Device) -> list[CudaKernelConfig]:
    """The configuration of every routed experts' tensor-core GEMM build the plugin ships for
    ``device``."""
    return [moe_cuda_config(build) for build in moe_tensor_core_builds(device.capability)]
