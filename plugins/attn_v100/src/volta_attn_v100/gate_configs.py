"""The configurations the compile gate checks: every build the launchers can make on a device.

Pure Python (no torch, no triton): the plugin's ``volta_kernel_configs`` hook returns
:func:`kernel_configs`, made from the device family's table through :mod:`volta_attn_v100.launch`
as the launchers make their launches. :func:`cuda_builds` lists the CUDA-source kernels' builds
(:mod:`volta_attn_v100.cuda`) for the CUDA sm_70 gate, from the same tables.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from volta_attn_v100.launch import (
    ATTENTION_DIVISIBLE,
    AttentionBuild,
    DecodeBuild,
    ahead_tiles,
    aligned_strides_required,
    decode_block_m,
    decode_combine,
    decode_tiles,
    fp16_partials,
    prefill_build,
    takes_ahead,
    takes_one_stage_tail,
    takes_wide_combine,
)
from volta_attn_v100.limits import (
    E4M3_MIN_CAPABILITY,
    HEAD_SIZES,
    MAX_DECODE_QUERY_LEN,
    MAX_SPLITS,
    fp8_decode,
    head_pad,
)
from volta_attn_v100.tables import (
    CUDA_PREFILL_KV_DTYPES,
    SM70_CUDA_PREFILL,
    LaunchTable,
    table_for,
    takes_cuda_prefill,
)
from volta_core import CudaKernelConfig, Device, KernelConfig

KERNEL_MODULE = "volta_attn_v100.kernels"

#: KV storage of each KV dtype as a Triton pointer type (fp8 is stored as bytes).
KV_POINTER_TYPES: dict[str, str] = {"float16": "*fp16", "fp8_e5m2": "*u8", "fp8_e4m3": "*u8"}

_SIGNATURE_HEAD = {
    "q_ptr": "*fp16",
    "kv_ptr": "*fp16",
    "bt_ptr": "*i32",
    "seq_lens_ptr": "*i32",
    "q_start_ptr": "*i32",
    "k_scale_ptr": "*fp32",
    "v_scale_ptr": "*fp32",
}
_STRIDES = (
    "scale_stride",
    "stride_qt",
    "stride_qh",
    "stride_blk",
    "stride_kvh",
    "stride_slot",
    "stride_bt",
    "stride_ot",
    "stride_oh",
)
_DECODE_SIGNATURE_TAIL = {
    "sinks_ptr": "*fp32",
    "out_ptr": "*fp16",
    "part_acc_ptr": "*fp32",
    "part_ml_ptr": "*fp32",
    "counter_ptr": "*i32",
    "sm_scale": "fp32",
    "softcap": "fp32",
    **{
        name: "i32"
        for name in (
            "window",
            "has_sinks",
            "group",
            "heads_per_prog",
            "head_chunks",
            "num_q_heads",
            "num_splits",
            *_STRIDES,
        )
    },
}
_PREFILL_SIGNATURE_TAIL = {
    "sinks_ptr": "*fp32",
    "out_ptr": "*fp16",
    "sm_scale": "fp32",
    "softcap": "fp32",
    **{
        name: "i32"
        for name in (
            "window",
            "has_sinks",
            "group",
            "heads_per_prog",
            "head_chunks",
            "num_seqs",
            *_STRIDES,
        )
    },
}


def decode_config(name: str, build: DecodeBuild, kv_dtype: str, table: LaunchTable) -> KernelConfig:
    """The gate's configuration of one decode build (the partials' pointer type follows
    ``PARTIALS_F16``)."""
    return KernelConfig(
        name=name,
        kernel=f"{KERNEL_MODULE}:paged_decode_kernel",
        signature={
            **_SIGNATURE_HEAD,
            "kv_ptr": KV_POINTER_TYPES[kv_dtype],
            **_DECODE_SIGNATURE_TAIL,
            "part_acc_ptr": "*fp16" if build.partials_f16 else "*fp32",
        },
        constexprs=build.constexprs(),
        num_warps=build.tiles.num_warps,
        num_stages=build.tiles.num_stages,
        divisible_by_16=ATTENTION_DIVISIBLE,
        divisibility_enforced=aligned_strides_required(table, build.head_size),
    )


def prefill_config(
    name: str, build: AttentionBuild, kv_dtype: str, table: LaunchTable
) -> KernelConfig:
    """The gate's configuration of one prefill build."""
    return KernelConfig(
        name=name,
        kernel=f"{KERNEL_MODULE}:paged_prefill_kernel",
        signature={
            **_SIGNATURE_HEAD,
            "kv_ptr": KV_POINTER_TYPES[kv_dtype],
            **_PREFILL_SIGNATURE_TAIL,
        },
        constexprs=build.constexprs(),
        num_warps=build.tiles.num_warps,
        num_stages=build.tiles.num_stages,
        divisible_by_16=ATTENTION_DIVISIBLE,
        divisibility_enforced=aligned_strides_required(table, build.head_size),
    )


def decode_launches(
    table: LaunchTable, head_size: int, kv_fp8: bool, kv_per_prog: int = 1
) -> list[tuple[int, int, int]]:
    """Every ``(BLOCK_M, COMBINE_M, SPLIT_CHUNK)`` a decode launch of this head size and KV
    dtype can take, over every query-length and head-group pad, wide combine or not; with
    ``kv_per_prog`` over 1, those of launches walking that many KV heads a program."""
    policy = table.policy(kv_fp8)
    pairing = policy.pairing
    if kv_per_prog > 1 and (pairing is None or head_pad(head_size) > pairing.max_pad):
        return []
    # The wide combine as the smallest grid split the most takes it, and as a grid too large
    # for any GPU does not; launches walking several KV heads fill the GPU unsplit.
    grids = ((1, MAX_SPLITS), (1 << 30, 1)) if kv_per_prog == 1 else ((1 << 30, 1),)
    wides = {takes_wide_combine(policy, head_size, n, 1, s) for n, s in grids}
    found: list[tuple[int, int, int]] = []
    q_pads = [1 << i for i in range(MAX_DECODE_QUERY_LEN.bit_length())]
    for q_pad, wide in itertools.product(q_pads, sorted(wides)):
        wide_floats = policy.wide_combine.floats if wide and policy.wide_combine else None
        for group_pad in (1 << i for i in range(8)):
            block_m = decode_block_m(table, head_size, q_pad, group_pad)
            if q_pad * group_pad * kv_per_prog > block_m:
                continue
            rows = group_pad * kv_per_prog
            combine = decode_combine(table, block_m, q_pad, rows, head_size, wide_floats)
            if (block_m, *combine) not in found:
                found.append((block_m, *combine))
    return sorted(found)


def _decode_configs(
    table: LaunchTable, capability: tuple[int, int], head_size: int, kv_dtype: str
) -> list[KernelConfig]:
    """Every decode build of a head size and KV dtype: each launch shape with and without
    scores ahead and each masked-tile loop the table can pick, then those walking several KV
    heads a program (always with scores ahead)."""
    fp8 = kv_dtype != "float16"
    policy = table.policy(fp8)
    # The choice for the shortest program and for the longest; unsplit, and split short.
    aheads = sorted({takes_ahead(policy, keys) for keys in (1, 1 << 30)})
    tails = sorted({takes_one_stage_tail(table, splits, 1) for splits in (1, 2)})

    def build(block_m: int, combine: tuple[int, int], ahead: bool, per_prog: int, tail: bool):
        tiles = decode_tiles(table, head_size, block_m, fp8)
        return DecodeBuild(
            head_size=head_size,
            tiles=ahead_tiles(table, tiles, head_size) if ahead else tiles,
            kv_fp8=fp8,
            fp8_decode=fp8_decode(kv_dtype, capability),
            halves=policy.halves,
            partials_f16=fp16_partials(table, combine[0]),
            combine_m=combine[0],
            split_chunk=combine[1],
            ahead=ahead,
            kv_per_prog=per_prog,
            one_stage_tail=tail,
        )

    configs = []
    for (block_m, rows, chunk), ahead, tail in itertools.product(
        decode_launches(table, head_size, fp8), aheads, tails
    ):
        name = (
            f"decode_d{head_size}_m{block_m}_c{rows}x{chunk}_{kv_dtype}"
            f"{'_ahead' if ahead else ''}{'_tail1' if tail else ''}"
        )
        b = build(block_m, (rows, chunk), ahead, 1, tail)
        configs.append(decode_config(name, b, kv_dtype, table))
    per_progs = policy.pairing.kv_heads if policy.pairing else ()
    for per_prog, tail in itertools.product(per_progs, tails):
        for block_m, rows, chunk in decode_launches(table, head_size, fp8, per_prog):
            name = (
                f"decode_d{head_size}_m{block_m}_c{rows}x{chunk}_{kv_dtype}"
                f"_kv{per_prog}{'_tail1' if tail else ''}"
            )
            b = build(block_m, (rows, chunk), True, per_prog, tail)
            configs.append(decode_config(name, b, kv_dtype, table))
    return configs


def _prefill_configs(
    table: LaunchTable, capability: tuple[int, int], head_size: int, kv_dtype: str
) -> list[KernelConfig]:
    """Every prefill build of a head size and KV dtype, named by its keys per tile where the
    tile follows the query length."""
    choices = table.prefill_tiles[head_pad(head_size)].choices()
    configs = []
    for tiles in choices:
        keys = f"_n{tiles.block_n}" if len(choices) > 1 else ""
        build = prefill_build(table, capability, kv_dtype, head_size, tiles)
        name = f"prefill_d{head_size}{keys}_{kv_dtype}"
        configs.append(prefill_config(name, build, kv_dtype, table))
    return configs


def _offsets_64(config: KernelConfig) -> KernelConfig:
    """An attention configuration's build for a cache too large for 32-bit row offsets, named
    with ``_offsets64``."""
    constexprs = {**config.constexprs, "CACHE_OFFSETS_32": False}
    return replace(config, name=f"{config.name}_offsets64", constexprs=constexprs)


def _e4m3_builds(configs: list[KernelConfig], capability: tuple[int, int]) -> list[KernelConfig]:
    """The e4m3 twins listed beside the e5m2 builds (SM89+): every prefill build and each head
    size's first decode build. A twin differs only in the instruction that converts a code
    (``FP8_DECODE``); listing every decode twin would double CI's sm_90 fp8 compiles, and the
    H100 GPU tests compile and run the e4m3 decode in every form the launcher picks."""
    twins: list[KernelConfig] = []
    decode_heads: set[int] = set()
    for config in configs:
        if "_fp8_e5m2" not in config.name:
            continue
        head_size = int(config.constexprs["HEAD_SIZE"])
        if config.name.startswith("decode"):
            if head_size in decode_heads:
                continue
            decode_heads.add(head_size)
        constexprs = {**config.constexprs, "FP8_DECODE": fp8_decode("fp8_e4m3", capability)}
        name = config.name.replace("_fp8_e5m2", "_fp8_e4m3")
        twins.append(replace(config, name=name, constexprs=constexprs))
    return twins


def kernel_configs(capability: tuple[int, int]) -> list[KernelConfig]:
    """Every configuration the launchers would use on a device of this capability, each with
    32-bit cache offsets; from SM89 the e4m3 twins (:func:`_e4m3_builds`); on SM70 (what the
    gate must see exactly) each again with 64-bit offsets. SM80+ lists leave the 64-bit builds
    out: they differ only in one integer's width, doubled CI's sm_90 compile check, and the
    H100 GPU tests compile and run them."""
    table = table_for(capability)
    configs: list[KernelConfig] = []
    for head_size in HEAD_SIZES:
        for kv_dtype in ("float16", "fp8_e5m2"):
            configs += _decode_configs(table, capability, head_size, kv_dtype)
            configs += _prefill_configs(table, capability, head_size, kv_dtype)
    if capability >= E4M3_MIN_CAPABILITY:
        configs += _e4m3_builds(configs, capability)
    if not table.gate_64_bit_offsets:
        return configs
    return [*configs, *(_offsets_64(c) for c in configs if c.constexprs.get("CACHE_OFFSETS_32"))]


# -- CUDA-source builds (volta_attn_v100/cuda): what the CUDA sm_70 gate compiles ---------------


def _prefill_builds(device: Device) -> list[CudaKernelConfig]:
    """The tensor-core prefill's builds on ``device``: on a V100 every head size of
    :data:`volta_attn_v100.tables.SM70_CUDA_PREFILL` for fp16 and e5m2 KV; none elsewhere."""
    from volta_attn_v100.cuda import (
        PREFILL_KERNEL,
        PREFILL_SOURCE,
        prefill_options,
        prefill_shared_bytes,
    )

    builds = []
    for head_size, tile in SM70_CUDA_PREFILL.items():
        for kv_dtype in CUDA_PREFILL_KV_DTYPES:
            if not takes_cuda_prefill(device.capability, head_size, kv_dtype):
                continue
            builds.append(
                CudaKernelConfig(
                    name=f"cuda_prefill_d{head_size}_n{tile.block_n}w{tile.num_warps}_{kv_dtype}",
                    source=PREFILL_SOURCE,
                    kernel=PREFILL_KERNEL,
                    block_threads=tile.num_warps * 32,
                    options=prefill_options(head_size, kv_dtype != "float16", tile),
                    dynamic_shared_bytes=prefill_shared_bytes(head_size, tile),
                    claims_tensor_cores=True,
                )
            )
    return builds


def _decode_builds(device: Device) -> list[CudaKernelConfig]:
    """The tensor-core decode's builds on ``device``: on a V100 every head size of
    :data:`volta_attn_v100.tables.SM70_CUDA_DECODE` for fp16 and e5m2 KV; none elsewhere."""
    from volta_attn_v100.cuda import DECODE_KERNEL, DECODE_SOURCE, decode_options
    from volta_attn_v100.tables import CUDA_DECODE_KV_DTYPES, SM70_CUDA_DECODE, takes_cuda_decode

    return [
        CudaKernelConfig(
            name=f"cuda_decode_d{head_size}_w{tile.num_warps}b{tile.min_blocks}_{kv_dtype}",
            source=DECODE_SOURCE,
            kernel=DECODE_KERNEL,
            block_threads=tile.num_warps * 32,
            options=decode_options(
                head_size, kv_dtype != "float16", tile.num_warps, tile.min_blocks
            ),
            claims_tensor_cores=True,
        )
        for head_size, tile in SM70_CUDA_DECODE.items()
        for kv_dtype in CUDA_DECODE_KV_DTYPES
        if takes_cuda_decode(device.capability, head_size, kv_dtype, 1, 1)
    ]


def cuda_builds(device: Device) -> list[CudaKernelConfig]:
    """Every CUDA-source build the launchers can run on ``device``, one helper per kernel."""
    return [*_prefill_builds(device), *_decode_builds(device)]
