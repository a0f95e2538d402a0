"""Loading and launching the tensor-core prefill (``prefill.cu``) for a batch's prefill call.

:func:`ready` answers whether a device runs a build (head size, KV dtype), by the host's rule
(:class:`volta_core.kernel_api.CudaBuilds`): each is compiled and loaded once; a missing toolkit
or a compile error leaves the Triton kernel to serve, logged once, or raises with
``VLLM_VOLTA_STRICT=1``; a build first asked for during CUDA-graph capture is left to the Triton
path (vLLM runs prefill batches eagerly, and :func:`warm_up` loads a layer's builds ahead).

:func:`launch` takes the arguments :func:`volta_attn_v100.ops.paged_attention` has checked. The
kernel reads K/V rows with 16-byte (fp16) or 8-byte (e5m2) loads, so :func:`vector_aligned`
says whether a cache's base and strides allow them (every cache vLLM allocates does); one that
does not is left to the Triton kernel.
"""

from __future__ import annotations

import ctypes

import torch

from volta_attn_v100.cuda import (
    PREFILL_KERNEL,
    PREFILL_SOURCE,
    prefill_options,
    prefill_shared_bytes,
)
from volta_attn_v100.tables import SM70_CUDA_PREFILL, CudaPrefillTile
from volta_core.kernel_api import CudaBuilds

#: The most query blocks one launch's grid may hold in its first dimension (2^31 - 1, CUDA C++
#: Programming Guide, "Compute Capabilities") and KV programs in its second (65535).
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535

#: The prefill's builds: loaded once per device, the Triton kernel serving where they cannot
#: (:class:`volta_core.kernel_api.CudaBuilds`).
BUILDS = CudaBuilds("attn_v100: the tensor-core prefill", PREFILL_SOURCE, PREFILL_KERNEL)


def _options(head_size: int, kv_cache_dtype: str) -> tuple[str, ...]:
    return prefill_options(head_size, kv_cache_dtype != "float16", SM70_CUDA_PREFILL[head_size])


def ready(device: torch.device, head_size: int, kv_cache_dtype: str) -> bool:
    """Whether the build for ``head_size`` and ``kv_cache_dtype`` (one the table lists) runs on
    CUDA ``device``; loaded now if it was not asked for before, outside CUDA-graph capture.

    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC, with ``VLLM_VOLTA_STRICT=1``.
    :raises CudaCompileError: NVRTC refused the build, with ``VLLM_VOLTA_STRICT=1``.
    :raises RuntimeError: first asked for during capture, with ``VLLM_VOLTA_STRICT=1``.
    """
    return BUILDS.ready(device, _options(head_size, kv_cache_dtype))


def warm_up(device: torch.device, head_size: int, kv_cache_dtype: str) -> None:
    """Load the build a layer's prefill takes on ``device`` (before any CUDA-graph capture)."""
    ready(device, head_size, kv_cache_dtype)


def vector_aligned(kv: torch.Tensor) -> bool:
    """Whether the kernel's K/V row loads (8 elements at once) are aligned in ``kv``: its base
    and its block, head and slot strides whole multiples of 8 elements, the base 16-byte (fp16)
    or 8-byte (e5m2) aligned."""
    width = 8 * kv.element_size()
    return kv.data_ptr() % width == 0 and all(kv.stride(d) % 8 == 0 for d in range(3))


def grid(
    tile: CudaPrefillTile, num_tokens: int, num_seqs: int, group: int, num_kv_heads: int
) -> tuple[tuple[int, int], int, int]:
    """``(grid, heads_per_prog, head_chunks)`` of a launch: a program's rows hold the whole head
    group (up to its rows) for ``block_m // heads_per_prog`` query tokens; programs are numbered
    as the Triton prefill numbers them (a sequence's blocks plus one for its ragged end)."""
    heads_per_prog = min(group, tile.block_m)
    head_chunks = -(-group // heads_per_prog)
    block_q = tile.block_m // heads_per_prog
    return (
        (num_tokens // block_q + num_seqs, num_kv_heads * head_chunks),
        heads_per_prog,
        head_chunks,
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
    kv_cache_dtype: str,
) -> None:
    """Causal paged prefill of every sequence in the batch into ``out``, for inputs
    :func:`volta_attn_v100.ops.paged_attention` has checked (``kv`` the cache as the kernels
    read it, fp16 or e5m2 bytes; the scales float32 vectors, ``scale_stride`` 0 or 1) and a build
    :func:`ready` loaded.

    :raises ValueError: the grid would pass CUDA's limits, before any launch.
    """
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads, page_size = kv.shape[1], kv.shape[2]
    tile = SM70_CUDA_PREFILL[head_size]
    dims, heads_per_prog, head_chunks = grid(
        tile, num_tokens, seq_lens.shape[0], num_heads // num_kv_heads, num_kv_heads
    )
    if dims[0] > MAX_GRID_X or dims[1] > MAX_GRID_Y:
        raise ValueError(f"the tensor-core prefill's grid {dims} passes CUDA's limits")
    kernel = BUILDS.loaded(query.device, _options(head_size, kv_cache_dtype))
    if kernel is None:
        raise RuntimeError("launch() needs a build ready() loaded")
    kernel.launch(
        dims,
        tile.num_warps * 32,
        query, kv, block_table, seq_lens, query_start_loc, k_scale, v_scale, sinks, out,
        sm_scale, softcap, window, has_sinks, num_heads // num_kv_heads, heads_per_prog,
        head_chunks, seq_lens.shape[0], scale_stride, page_size, query.stride(0),
        query.stride(1), ctypes.c_int64(kv.stride(0)), ctypes.c_int64(kv.stride(1)),
        ctypes.c_int64(kv.stride(2)), block_table.stride(0), out.stride(0), out.stride(1),
        shared_mem=prefill_shared_bytes(head_size, tile),
    )  # fmt: skip
