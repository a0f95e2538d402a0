"""Loading and launching the tensor-core prefill (``prefill.cu``) for a batch's prefill call.

:func:`ready` answers whether a device runs a build (head size, KV dtype), by the host's rule
(:class:`volta_core.kernel_api.CudaBuilds`): each is compiled and loaded once; a missing toolkit
or a compile error leaves the Triton kernel to serve, logged once, or raises with
``VLLM_VOLTA_STRICT=1``; a build first asked for during CUDA-graph capture is left to the Triton
path (vLLM runs prefill batches eagerly, and :func:`warm_up` loads a layer's builds ahead).

:func:`launch` takes the arguments :func:`volta_attn_v100.ops.paged_attention` has checked and
the launch :func:`volta_attn_v100.dispatch.choose` made (a
:class:`~volta_attn_v100.launch.CudaPrefillLaunch`). The kernel reads K/V rows with 16-byte
(fp16) or 8-byte (e5m2) loads, so :func:`vector_aligned` says whether a cache's base and strides
allow them (every cache vLLM allocates does); one that does not is left to the Triton kernel.
"""

from __future__ import annotations

import ctypes

import torch

from volta_attn_v100.launch import (
    PREFILL_KERNEL,
    CudaPrefillLaunch,
    cuda_prefill_options,
    cuda_source,
)
from volta_core.kernel_api import CudaBuilds

#: The most query blocks one launch's grid may hold in its first dimension (2^31 - 1, CUDA C++
#: Programming Guide, "Compute Capabilities") and KV programs in its second (65535).
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535

#: The prefill's builds: loaded once per device, the Triton kernel serving where they cannot
#: (:class:`volta_core.kernel_api.CudaBuilds`).
BUILDS = CudaBuilds(
    "attn_v100: the tensor-core prefill", cuda_source(PREFILL_KERNEL), PREFILL_KERNEL
)


def ready(device: torch.device, head_size: int, kv_cache_dtype: str) -> bool:
    """Whether the build for ``head_size`` and ``kv_cache_dtype`` (one the table lists) runs on
    CUDA ``device``; loaded now if it was not asked for before, outside CUDA-graph capture.

    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC, with ``VLLM_VOLTA_STRICT=1``.
    :raises CudaCompileError: NVRTC refused the build, with ``VLLM_VOLTA_STRICT=1``.
    :raises RuntimeError: first asked for during capture, with ``VLLM_VOLTA_STRICT=1``.
    """
    return BUILDS.ready(device, cuda_prefill_options(head_size, kv_cache_dtype))


def warm_up(device: torch.device, head_size: int, kv_cache_dtype: str) -> None:
    """Load the build a layer's prefill takes on ``device`` (before any CUDA-graph capture)."""
    ready(device, head_size, kv_cache_dtype)


def vector_aligned(kv: torch.Tensor) -> bool:
    """Whether the kernel's K/V row loads (8 elements at once) are aligned in ``kv``: its base
    and its block, head and slot strides whole multiples of 8 elements, the base 16-byte (fp16)
    or 8-byte (e5m2) aligned."""
    width = 8 * kv.element_size()
    return kv.data_ptr() % width == 0 and all(kv.stride(d) % 8 == 0 for d in range(3))


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
    launch: CudaPrefillLaunch,
    layout: tuple[int, int, int, int] | None = None,
) -> None:
    """Causal paged prefill of every sequence in the batch into ``out`` as ``launch`` says, for
    inputs :func:`volta_attn_v100.ops.paged_attention` has checked (``kv`` the cache as the
    kernels read it, fp16 or e5m2 bytes; the scales float32 vectors, ``scale_stride`` 0 or 1)
    and a build :func:`ready` loaded. ``layout``: the query's and the output's token and head
    strides when ``query`` and ``out`` are vLLM's ``[tokens, heads x head_size]`` tensors (no
    view is made); None when they are ``[tokens, heads, head_size]``.

    :raises ValueError: the grid would pass CUDA's limits, before any launch.
    """
    page_size = kv.shape[2]
    if layout is None:
        layout = (query.stride(0), query.stride(1), out.stride(0), out.stride(1))
    dims = launch.grid
    if dims[0] > MAX_GRID_X or dims[1] > MAX_GRID_Y:
        raise ValueError(f"the tensor-core prefill's grid {dims} passes CUDA's limits")
    kernel = BUILDS.loaded(query.device, launch.options)
    if kernel is None:
        raise RuntimeError("launch() needs a build ready() loaded")
    kernel.launch(
        dims,
        launch.block_threads,
        query, kv, block_table, seq_lens, query_start_loc, k_scale, v_scale, sinks, out,
        sm_scale, softcap, window, has_sinks, launch.group, launch.heads_per_prog,
        launch.head_chunks, seq_lens.shape[0], scale_stride, page_size, layout[0], layout[1],
        ctypes.c_int64(kv.stride(0)), ctypes.c_int64(kv.stride(1)),
        ctypes.c_int64(kv.stride(2)), block_table.stride(0), layout[2], layout[3],
        shared_mem=launch.shared_bytes,
    )  # fmt: skip
