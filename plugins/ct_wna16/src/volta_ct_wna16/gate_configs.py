"""The kernel configurations the SM70 compile gate checks: every build the launcher can make
on a device, from that device family's table: the Triton ones (the plugin's
``volta_kernel_configs`` hook) and the CUDA tensor-core GEMM's (:func:`cuda_builds`).

Torch- and triton-free: each configuration names its kernel by import path and takes its
constexprs (NVRTC options) from :mod:`volta_ct_wna16.launch`, as the launcher does, so the gate
compiles exactly the builds that run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

from volta_core import CudaKernelConfig, Device, KernelConfig
from volta_ct_wna16.launch import (
    DEQUANT_MATMUL,
    GEMM,
    SPLITK,
    Launch,
    MoEFused,
    dequant_constexprs,
    gemm_constexprs,
    group_tile,
    mma_options,
    moe_constexprs,
    moe_decode_constexprs,
    moe_fused_constexprs,
    splitk_constexprs,
    unmasked_build,
)
from volta_ct_wna16.limits import MAX_ROUTED_EXPERTS, MMA_CAPABILITY, SUPPORTED_BITS
from volta_ct_wna16.tables import (
    MAX_SELECT_TOP_K,
    ROUTE_COUNT_BLOCK,
    SILU_BLOCK,
    SM70_MMA,
    MoEDecode,
    Table,
    route_place_tile,
    table_for,
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


def splitk_config(
    launch: Launch,
    bits: int,
    zp: bool,
    bias: bool,
    use_ws: bool,
    group_tile: bool,
    zp8: bool = False,
    atomic: bool = False,
    whole: bool = False,
) -> KernelConfig:
    """The gate's configuration of one split-K launch (named by tile, warps, stages, unroll);
    ``zp8``: zero points as uint8 (``Launch.byte_zeros``); ``atomic``: the splits added
    atomically (``Launch.atomic``); ``whole``: every tile inside the layer
    (:func:`volta_ct_wna16.launch.whole_tiles`)."""
    tile = (
        f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
        f"w{launch.num_warps}s{launch.num_stages}r{launch.reduce_unroll}"
    )
    return KernelConfig(
        name=f"splitk_{'dot' if launch.use_dot else 'fma'}_{tile}_w{bits}{'a' if zp else 's'}"
        f"{'_ws' if use_ws else ''}{'_bias' if bias else ''}{'_gt' if group_tile else ''}"
        f"{'_z8' if zp8 else ''}{'_at' if atomic else ''}{'_wh' if whole else ''}",
        kernel=SPLITK_KERNEL,
        signature={**_SPLITK_SIG, "z_ptr": "*u8"} if zp8 else _SPLITK_SIG,
        constexprs=splitk_constexprs(launch, bits, zp, bias, use_ws, group_tile, atomic, whole),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        divisible_by_16=_SPLITK_DIVISIBLE,
    )


def moe_config(
    launch: Launch, bits: int, zp: bool, mul_router: bool, group_tile: bool, atomic: bool
) -> KernelConfig:
    """The gate's configuration of one fused-MoE launch: fp16 rows stored, or (``atomic``)
    fp32 tiles added into zeroed rows, times the router weights with ``mul_router``; a
    swapped tile's (``Launch.swap``) name ends in ``_swap``."""
    tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
    tile += f"w{launch.num_warps}s{launch.num_stages}"
    return KernelConfig(
        name=f"moe_{tile}_w{bits}{'a' if zp else 's'}{'_rw' if mul_router else ''}"
        f"{'_atomic' if atomic else ''}{'_gt' if group_tile else ''}"
        f"{'_swap' if launch.swap else ''}",
        kernel=MOE_KERNEL,
        signature={**_MOE_SIG, "out_ptr": "*fp32" if atomic else "*fp16"},
        constexprs=moe_constexprs(launch, bits, zp, mul_router, group_tile, atomic),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        divisible_by_16=_MOE_DIVISIBLE,
    )


#: ``(mul_router, atomic)`` of every launch a fused-MoE step makes with any tile: gate/up
#: stores fp16 rows, or adds fp32 partials when split; down adds each pair's fp32 tile into
#: its token's row, times the router weight or not (vLLM's ``apply_router_weight_on_input``
#: applies it to the input instead).
MOE_OUTPUTS = ((False, False), (False, True), (True, True))


def _routing_variants(table: Table) -> Iterator[KernelConfig]:
    """The routing's two launches and the SiLU product between the expert kernels."""
    for ids, has_map in itertools.product(("*i32", "*i64"), (False, True)):
        yield KernelConfig(
            name=f"moe_count_{ids[1:]}{'_map' if has_map else ''}",
            kernel=ROUTE_COUNT_KERNEL,
            signature={
                "ids_ptr": ids,
                "map_ptr": "*i32" if has_map else ids,
                "count_ptr": "*i32",
                "rank_ptr": "*i32",
                "local_ptr": "*i32",
                "PAIRS": "i32",
                "EXPERTS": "i32",
            },
            constexprs={"HAS_MAP": has_map, "BLOCK": ROUTE_COUNT_BLOCK},
        )
    experts = 1
    while experts <= MAX_ROUTED_EXPERTS:
        e_pow2, block = route_place_tile(experts)
        for block_m in sorted({table.moe.block_m, table.moe_large.block_m}):
            yield KernelConfig(
                name=f"moe_place_e{e_pow2}_m{block_m}",
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
                constexprs={"BLOCK_M": block_m, "E_POW2": e_pow2, "BLOCK": block},
            )
        experts = e_pow2 + 1
    for h in ("*fp16", "*fp32"):
        yield KernelConfig(
            name=f"silu_mul_{h[1:]}",
            kernel=SILU_KERNEL,
            signature={
                "h_ptr": h,
                "out_ptr": "*fp16",
                "INTER": "i32",
                "stride_h": "i32",
                "stride_o": "i32",
            },
            constexprs={"BLOCK": SILU_BLOCK},
            divisible_by_16=("INTER", "stride_h", "stride_o"),
        )


def _moe_variants(table: Table) -> Iterator[KernelConfig]:
    """4 and 8 bits, both symmetries, scales per word row and (where the tile can take them,
    :func:`~volta_ct_wna16.launch.group_tile`) per tile, every output kind."""
    for launch in (table.moe, table.moe_large):
        tiles = (False, True) if group_tile(launch, launch.block_k) else (False,)
        for bits, zp, gt in itertools.product(SUPPORTED_BITS, (False, True), tiles):
            for mul_router, atomic in MOE_OUTPUTS:
                yield moe_config(launch, bits, zp, mul_router, gt, atomic)


def _renamed(signature: dict[str, str], names: dict[str, str]) -> dict[str, str]:
    return {names.get(name, name): kind for name, kind in signature.items()}


def decode_config(
    launch: Launch, bits: int, zp: bool, has_map: bool, mul: bool, down: bool
) -> KernelConfig:
    """The gate's configuration of one fused-MoE decode launch (gate/up, or ``down``): with or
    without an expert map, the router weight on the input (gate/up) or output (down)."""
    signature = dict(_DECODE_SIG)
    if down:
        signature = {_DECODE_DOWN_NAMES.get(name, name): kind for name, kind in signature.items()}
        signature["SLOT_SPLITS"] = "i32"
    tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
    tile += f"w{launch.num_warps}s{launch.num_stages}r{launch.reduce_unroll}"
    return KernelConfig(
        name=f"moe_decode_{'down' if down else 'gate_up'}_{tile}_w{bits}{'a' if zp else 's'}"
        f"{'_map' if has_map else ''}{'_rw' if mul else ''}",
        kernel=DECODE_DOWN_KERNEL if down else DECODE_GATE_UP_KERNEL,
        signature=signature,
        constexprs=moe_decode_constexprs(launch, bits, zp, has_map, mul, down),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
        divisible_by_16=("N", "K", "KW", "GROUP", "stride_we", "K_PER_SPLIT"),
    )


def fused_config(
    fused: MoEFused, bits: int, zp: bool, has_map: bool, mul: bool, whole: bool
) -> KernelConfig:
    """The gate's configuration of the one-launch decode step: with or without an expert map,
    the router weight on the input (``mul``) or the output, every tile inside the layer
    (``whole``) or masked; groups of 128 (the group sizes are ``tl.constexpr``)."""
    tile = f"j{fused.block_j}k{fused.block_k}n{fused.block_n}"
    tile += f"w{fused.num_warps}s{fused.num_stages}"
    return KernelConfig(
        name=f"moe_decode_fused_{tile}_w{bits}{'a' if zp else 's'}"
        f"{'_map' if has_map else ''}{'_rw' if mul else ''}{'' if whole else '_masked'}",
        kernel=DECODE_FUSED_KERNEL,
        signature=_FUSED_SIG,
        constexprs=moe_fused_constexprs(fused, bits, zp, has_map, mul, (128, 128), whole),
        num_warps=fused.num_warps,
        num_stages=fused.num_stages,
        divisible_by_16=(
            "HIDDEN", "INTER", "KW13", "KW2", "stride_w13e", "stride_s13e", "stride_w2e",
            "stride_s2e",
        ),
    )  # fmt: skip


def decode_configs(
    launches: MoEDecode | MoEFused, bits: int, zp: bool, has_map: bool, mul: bool
) -> list[KernelConfig]:
    """The gate's configurations of one decode row: its one launch (every tile inside the
    layer, and masked), or gate/up and down."""
    if isinstance(launches, MoEFused):
        return [fused_config(launches, bits, zp, has_map, mul, whole) for whole in (True, False)]
    return [
        decode_config(launches.gate_up, bits, zp, has_map, mul, down=False),
        decode_config(launches.down, bits, zp, has_map, mul, down=True),
    ]


def _decode_variants(table: Table) -> Iterator[KernelConfig]:
    """Each decode row's kernels for 4 and 8 bits, both symmetries, with and without an
    expert map and router weights (each kernel's variants together); the router's top-k for
    every expert count's vector and logit dtype."""
    seen: set[str] = set()
    for _, launches in table.moe_decode:
        per_variant = [
            decode_configs(launches, *variant)
            for variant in itertools.product(
                SUPPORTED_BITS, (False, True), (False, True), (False, True)
            )
        ]
        for config in itertools.chain.from_iterable(zip(*per_variant, strict=True)):
            if config.name not in seen:
                seen.add(config.name)
                yield config
    e_pow2 = 16
    while e_pow2 <= MAX_ROUTED_EXPERTS:
        for logits in ("*fp16", "*bf16", "*fp32"):
            yield KernelConfig(
                name=f"topk_softmax_e{e_pow2}_{logits[1:]}",
                kernel=TOPK_KERNEL,
                signature={
                    "logits_ptr": logits,
                    "w_ptr": "*fp32",
                    "ids_ptr": "*i32",
                    "EXPERTS": "i32",
                    "TOP_K": "i32",
                    "stride_l": "i32",
                    "RENORMALIZE": "i32",
                },
                constexprs={"TOPK_POW2": MAX_SELECT_TOP_K, "E_POW2": e_pow2},
            )
        e_pow2 *= 2


def _launches(table: Table) -> list[Launch]:
    """The table's compile-distinct launches (``programs_per_sm`` sizes the grid only, so two
    launches that differ in it alone are one kernel build)."""
    seen: list[Launch] = []
    for launch in (
        table.gemv,
        table.wide_gemv[1] if table.wide_gemv else None,
        table.short_gemv[1] if table.short_gemv else None,
        table.small,
        table.decode,
        table.gemm,
        table.dequant,
    ):
        if launch is None:
            continue
        if launch.path == GEMM and table.dequant_from is not None and table.dequant_from <= 17:
            continue
        if launch.path == DEQUANT_MATMUL and table.dequant_from is None:
            continue
        build = replace(launch, programs_per_sm=1)
        if build not in seen:
            seen.append(build)
    return seen


def _variants(table: Table) -> Iterator[KernelConfig]:
    for base in _launches(table):
        for bits in SUPPORTED_BITS:
            launch = base.scaled_for_bits(bits)
            for zp in (False, True):
                tag = f"w{bits}{'a' if zp else 's'}"
                tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
                if launch.path == SPLITK:
                    # Split (fused reduction) or unsplit, each with and without bias; the dot
                    # tiles also with scales per tile (a layer whose groups hold whole tiles).
                    group_tiles = (False, True) if launch.use_dot else (False,)
                    # Zero points as uint8 where the launch takes them from a layer's
                    # ``zeros8``, and as fp16 where it has none (a bare ``PackedWeights``).
                    zp8s = (False, True) if zp and launch.byte_zeros else (False,)
                    # Masked, and unmasked where the launch has that build (whole tiles).
                    wholes = (False, True) if unmasked_build(launch, bits) else (False,)
                    for use_ws, bias, in_group, zp8, whole in itertools.product(
                        (True, False), (True, False), group_tiles, zp8s, wholes
                    ):
                        yield splitk_config(
                            launch, bits, zp, bias, use_ws, in_group, zp8, whole=whole
                        )
                        if use_ws and launch.atomic:
                            yield splitk_config(
                                launch, bits, zp, bias, use_ws, in_group, zp8, True, whole
                            )
                elif launch.path == GEMM:
                    for bias in (False, True):
                        yield KernelConfig(
                            name=f"gemm_{tile}_{tag}{'_bias' if bias else ''}",
                            kernel=GEMM_KERNEL,
                            signature=_GEMM_SIG,
                            constexprs=gemm_constexprs(launch, bits, zp, bias),
                            num_warps=launch.num_warps,
                            num_stages=launch.num_stages,
                            divisible_by_16=_MODEL_DIVISIBLE,
                        )
                else:
                    yield KernelConfig(
                        name=f"dequant_n{launch.block_n}k{launch.block_k}_{tag}",
                        kernel=DEQUANT_KERNEL,
                        signature=_DEQUANT_SIG,
                        constexprs=dequant_constexprs(launch, bits, zp),
                        num_warps=launch.num_warps,
                        num_stages=launch.num_stages,
                        divisible_by_16=_DEQUANT_DIVISIBLE,
                    )


def kernel_configs(device: Device) -> list[KernelConfig]:
    """Every kernel configuration :func:`volta_ct_wna16.tables.choose` can launch on ``device``."""
    table = table_for(device.capability)
    return [
        *_variants(table),
        *_moe_variants(table),
        *_routing_variants(table),
        *_decode_variants(table),
    ]


def cuda_builds(device: Device) -> list[CudaKernelConfig]:
    """Every build of the tensor-core GEMM the launcher can run on ``device``: on a V100 each
    row of :data:`volta_ct_wna16.tables.SM70_MMA` for 4 and 8 bits, symmetric and asymmetric
    (bias and splits are launch arguments, not builds); none elsewhere."""
    from volta_ct_wna16.cuda import KERNEL, SOURCE

    if device.capability != MMA_CAPABILITY:
        return []
    return [
        CudaKernelConfig(
            name=f"mma_m{launch.block_m}n{launch.block_n}w{launch.num_warps}_w{bits}"
            f"{'a' if zp else 's'}",
            source=SOURCE,
            kernel=KERNEL,
            block_threads=launch.num_warps * 32,
            options=mma_options(launch, bits, zp),
            claims_tensor_cores=True,
        )
        for _, launch in SM70_MMA
        for bits in SUPPORTED_BITS
        for zp in (False, True)
    ]
