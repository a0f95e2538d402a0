"""Loading and launching the SM70 tensor-core decode (``decode.cu``) for a batch's decode call.

:func:`ready` answers whether a device runs a build (head size, KV dtype), by the host's rule
(:class:`volta_core.kernel_api.CudaBuilds`): each is compiled and loaded once; a missing toolkit
or a compile error leaves the Triton kernel to serve, logged once, or raises with
``VLLM_VOLTA_STRICT=1``; a build first asked for during CUDA-graph capture is left to the Triton
path, so :func:`warm_up` loads a layer's builds before capture.

:func:`launch` takes the arguments :func:`volta_attn_v100.ops.paged_attention` has checked and
the launch :func:`volta_attn_v100.dispatch.choose` made (a
:class:`~volta_attn_v100.launch.CudaDecodeLaunch`), and can build the compute_70 PTX a V100
starts from, JIT-compiled by the driver. The kernel reads K with 16-byte loads and Q with 8-byte
ones, so :func:`vector_aligned` says whether the tensors allow them (every cache vLLM allocates
does); others are left to the Triton kernel.
"""

from __future__ import annotations

import torch

from volta_attn_v100.launch import (
    DECODE_KERNEL,
    CudaDecodeLaunch,
    cuda_decode_options,
    cuda_source,
)
from volta_attn_v100.limits import MAX_SPLITS
from volta_core.kernel_api import CudaBuilds, arrival_counters

#: The grid's third dimension counts sequences: at most 65535 (CUDA C++ Programming Guide,
#: "Compute Capabilities").
MAX_GRID_Z = 65535

#: The decode's builds: loaded once per device, the Triton kernel serving where they cannot
#: (:class:`volta_core.kernel_api.CudaBuilds`).
BUILDS = CudaBuilds("attn_v100: the tensor-core decode", cuda_source(DECODE_KERNEL), DECODE_KERNEL)


def ready(device: torch.device, head_size: int, kv_cache_dtype: str) -> bool:
    """Whether the build for ``head_size`` and ``kv_cache_dtype`` (one the table lists) runs on
    CUDA ``device`` (its own cubin); loaded now if it was not asked for before, outside CUDA-graph
    capture.

    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC, with ``VLLM_VOLTA_STRICT=1``.
    :raises CudaCompileError: NVRTC refused the build, with ``VLLM_VOLTA_STRICT=1``.
    :raises RuntimeError: first asked for during capture, with ``VLLM_VOLTA_STRICT=1``.
    """
    return BUILDS.ready(device, cuda_decode_options(head_size, kv_cache_dtype))


def warm_up(device: torch.device, head_size: int, kv_cache_dtype: str) -> None:
    """Load the build a layer's decode takes on ``device`` (before any CUDA-graph capture)."""
    ready(device, head_size, kv_cache_dtype)


def vector_aligned(
    query: torch.Tensor, kv: torch.Tensor, strides: tuple[int, int] | None = None
) -> bool:
    """Whether the kernel's loads are aligned: K rows in 16-byte chunks (the cache's base and its
    block, head and slot strides whole multiples of 16 bytes) and Q in 8-byte steps (its base and
    token and head strides multiples of 4 elements). ``strides``: the query's token and head
    strides when ``query`` is ``[tokens, heads x head_size]``; else ``query``'s own."""
    kv_bytes = kv.element_size()
    token, head = strides if strides is not None else (query.stride(0), query.stride(1))
    return (
        kv.data_ptr() % 16 == 0
        and all(kv.stride(d) * kv_bytes % 16 == 0 for d in range(3))
        and query.data_ptr() % 8 == 0
        and token % 4 == 0
        and head % 4 == 0
    )


def launch(
    query: torch.Tensor,
    kv: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    *,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    scale_stride: int,
    sinks: torch.Tensor,
    has_sinks: int,
    sm_scale: float,
    softcap: float,
    window: int,
    launch: CudaDecodeLaunch,
    ptx_arch: str | None = None,
    partials: tuple[torch.Tensor, torch.Tensor] | None = None,
    layout: tuple[int, int, int, int] | None = None,
) -> None:
    """Split-KV paged decode of every sequence in the batch into ``out`` as ``launch`` says, for
    inputs :func:`volta_attn_v100.ops.paged_attention` has checked (``kv`` the cache as the
    kernels read it, fp16 or e5m2 bytes; the scales float32 vectors, ``scale_stride`` 0 or 1),
    every sequence with at most ``launch.max_query_len`` query tokens, and a build :func:`ready`
    loaded. ``partials``: the float32 partial accumulators ``[tokens, heads, partitions,
    head_size]`` and running max and sum ``[tokens, heads, partitions, 2]`` to use when the
    launch has partitions (a step's layers share them); made here when not given. ``layout``:
    the query's and the output's token and head strides when ``query`` and ``out`` are vLLM's
    ``[tokens, heads x head_size]`` tensors (``launch`` gives the heads and their size, no view
    is made); None when they are ``[tokens, heads, head_size]``.

    :raises ValueError: ``launch.num_splits`` outside 1..64 or too many sequences for the grid,
        before any launch.
    """
    num_seqs = seq_lens.shape[0]
    num_kv_heads, page_size = kv.shape[1], kv.shape[2]
    if layout is None:
        num_tokens, num_heads, head_size = query.shape
        layout = (query.stride(0), query.stride(1), out.stride(0), out.stride(1))
    else:
        num_tokens, num_heads = query.shape[0], launch.group * num_kv_heads
        head_size = launch.head_size
    num_splits = launch.num_splits
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in 1..{MAX_SPLITS}, got {num_splits}")
    if num_seqs > MAX_GRID_Z:
        raise ValueError(f"the tensor-core decode takes at most {MAX_GRID_Z} sequences a launch")
    kernel = BUILDS.loaded(query.device, launch.options, ptx_arch)
    if kernel is None:
        raise RuntimeError("launch() needs a build ready() loaded")
    device = query.device
    if num_splits > 1:
        if partials is None:
            partials = (
                torch.empty(
                    (num_tokens, num_heads, num_splits, head_size),
                    dtype=torch.float32,
                    device=device,
                ),
                torch.empty(
                    (num_tokens, num_heads, num_splits, 2), dtype=torch.float32, device=device
                ),
            )
        part_acc, part_ml = partials
        counters = arrival_counters(device, num_seqs * num_kv_heads * launch.row_chunks)
    else:
        part_acc = part_ml = counters = None
    kernel.launch(
        launch.grid,
        launch.block_threads,
        query, kv, block_table, seq_lens, query_start_loc, k_scale, v_scale, sinks, out,
        part_acc, part_ml, counters, sm_scale, softcap, window, has_sinks, launch.group,
        num_heads, launch.row_chunks, num_splits, scale_stride, page_size, layout[0], layout[1],
        kv.stride(0), kv.stride(1), kv.stride(2), block_table.stride(0), layout[2], layout[3],
    )  # fmt: skip
