"""The compile gates' configuration of a build: a Triton build as a ``KernelConfig`` (the
kernels' signatures), a CUDA build as a ``CudaKernelConfig`` (source, NVRTC options).

Pure Python (no torch, no triton): :mod:`volta_attn_v100.dispatch` lists every build the
launchers can make on a device and maps each through these, for the plugin's
``volta_kernel_configs`` and ``volta_cuda_kernel_configs`` hooks.
"""

from __future__ import annotations

from volta_attn_v100.launch import (
    ATTENTION_DIVISIBLE,
    DECODE_KERNEL,
    PREFILL_KERNEL,
    AttentionBuild,
    DecodeBuild,
    aligned_strides_required,
    cuda_decode_options,
    cuda_prefill_options,
    cuda_source,
    prefill_shared_bytes,
)
from volta_attn_v100.tables import SM70_CUDA_DECODE, SM70_CUDA_PREFILL, LaunchTable
from volta_core import CudaKernelConfig, KernelConfig

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


def cuda_prefill_config(head_size: int, kv_dtype: str) -> CudaKernelConfig:
    """The CUDA gate's configuration of the prefill build of a head size and KV dtype."""
    tile = SM70_CUDA_PREFILL[head_size]
    return CudaKernelConfig(
        name=f"cuda_prefill_d{head_size}_n{tile.block_n}w{tile.num_warps}_{kv_dtype}",
        source=cuda_source(PREFILL_KERNEL),
        kernel=PREFILL_KERNEL,
        block_threads=tile.num_warps * 32,
        options=cuda_prefill_options(head_size, kv_dtype),
        dynamic_shared_bytes=prefill_shared_bytes(head_size, tile),
        claims_tensor_cores=True,
    )


def cuda_decode_config(head_size: int, kv_dtype: str) -> CudaKernelConfig:
    """The CUDA gate's configuration of the decode build of a head size and KV dtype."""
    tile = SM70_CUDA_DECODE[head_size]
    return CudaKernelConfig(
        name=f"cuda_decode_d{head_size}_w{tile.num_warps}b{tile.min_blocks}_{kv_dtype}",
        source=cuda_source(DECODE_KERNEL),
        kernel=DECODE_KERNEL,
        block_threads=tile.num_warps * 32,
        options=cuda_decode_options(head_size, kv_dtype),
        claims_tensor_cores=True,
    )
