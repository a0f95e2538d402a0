"""Loading and launching the SM70 tensor-core decode (``decode.cu``) for a batch's decode call.

:func:`ready` answers whether a device runs a build (head size, KV dtype), by the host's rule
(:class:`volta_core.kernel_api.CudaBuilds`): each is compiled and loaded once; a missing toolkit
or a compile error leaves the Triton kernel to serve, logged once, or raises with
``VLLM_VOLTA_STRICT=1``; a build first asked for during CUDA-graph capture is left to the Triton
path, so :func:`warm_up` loads a layer's builds before capture.

:func:`launch` takes the arguments :func:`volta_attn_v100.ops.paged_attention` has checked;
:func:`paged_decode` checks them itself (the tests, the benchmark), and can build the compute_70
PTX a V100 starts from, JIT-compiled by the driver. The kernel reads K with 16-byte loads and Q
with 8-byte ones, so :func:`vector_aligned` says whether the tensors allow them (every cache vLLM
allocates does); others are left to the Triton kernel.
"""

from __future__ import annotations

import torch

from volta_attn_v100.cuda import DECODE_KERNEL, DECODE_SOURCE, decode_options
from volta_attn_v100.limits import MAX_DECODE_QUERY_LEN, MAX_SPLITS
from volta_attn_v100.tables import CUDA_DECODE_ROWS, SM70_CUDA_DECODE
from volta_core.kernel_api import CudaBuilds, arrival_counters

#: The grid's third dimension counts sequences: at most 65535 (CUDA C++ Programming Guide,
#: "Compute Capabilities").
MAX_GRID_Z = 65535

#: The decode's builds: loaded once per device, the Triton kernel serving where they cannot
#: (:class:`volta_core.kernel_api.CudaBuilds`).
BUILDS = CudaBuilds("attn_v100: the tensor-core decode", DECODE_SOURCE, DECODE_KERNEL)


def _options(head_size: int, kv_cache_dtype: str) -> tuple[str, ...]:
    tile = SM70_CUDA_DECODE[head_size]
    return decode_options(head_size, kv_cache_dtype != "float16", tile.num_warps, tile.min_blocks)


def ready(device: torch.device, head_size: int, kv_cache_dtype: str) -> bool:
    """Whether the build for ``head_size`` and ``kv_cache_dtype`` (one the table lists) runs on
    CUDA ``device`` (its own cubin); loaded now if it was not asked for before, outside CUDA-graph
    capture.

    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC, with ``VLLM_VOLTA_STRICT=1``.
    :raises CudaCompileError: NVRTC refused the build, with ``VLLM_VOLTA_STRICT=1``.
    :raises RuntimeError: first asked for during capture, with ``VLLM_VOLTA_STRICT=1``.
    """
    return BUILDS.ready(device, _options(head_size, kv_cache_dtype))


def warm_up(device: torch.device, head_size: int, kv_cache_dtype: str) -> None:
    """Load the build a layer's decode takes on ``device`` (before any CUDA-graph capture)."""
    ready(device, head_size, kv_cache_dtype)


def vector_aligned(query: torch.Tensor, kv: torch.Tensor) -> bool:
    """Whether the kernel's loads are aligned: K rows in 16-byte chunks (the cache's base and its
    block, head and slot strides whole multiples of 16 bytes) and Q in 8-byte steps (its base and
    token and head strides multiples of 4 elements)."""
    kv_bytes = kv.element_size()
    return (
        kv.data_ptr() % 16 == 0
        and all(kv.stride(d) * kv_bytes % 16 == 0 for d in range(3))
        and query.data_ptr() % 8 == 0
        and query.stride(0) % 4 == 0
        and query.stride(1) % 4 == 0
    )


def row_chunks(max_query_len: int, group: int) -> int:
    """Blocks of 8 rows (query token x head of the group) one KV head's rows take."""
    return -(-max(max_query_len, 1) * group // CUDA_DECODE_ROWS)


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
    max_query_len: int,
    num_splits: int,
    ptx_arch: str | None = None,
) -> None:
    """Split-KV paged decode of every sequence in the batch into ``out``, for inputs
    :func:`volta_attn_v100.ops.paged_attention` has checked (``kv`` the cache as the kernels read
    it, fp16 or e5m2 bytes; the scales float32 vectors, ``scale_stride`` 0 or 1), every sequence
    with at most ``max_query_len`` query tokens, and a build :func:`ready` loaded.

    :raises ValueError: ``num_splits`` outside 1..64 or too many sequences for the grid, before
        any launch.
    """
    num_tokens, num_heads, head_size = query.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads, page_size = kv.shape[1], kv.shape[2]
    group = num_heads // num_kv_heads
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in 1..{MAX_SPLITS}, got {num_splits}")
    if num_seqs > MAX_GRID_Z:
        raise ValueError(f"the tensor-core decode takes at most {MAX_GRID_Z} sequences a launch")
    kernel = BUILDS.loaded(query.device, _options(head_size, kv_cache_dtype), ptx_arch)
    if kernel is None:
        raise RuntimeError("launch() needs a build ready() loaded")
    chunks = row_chunks(max_query_len, group)
    device = query.device
    if num_splits > 1:
        part_acc = torch.empty(
            (num_tokens, num_heads, num_splits, head_size), dtype=torch.float32, device=device
        )
        part_ml = torch.empty(
            (num_tokens, num_heads, num_splits, 2), dtype=torch.float32, device=device
        )
        counters = arrival_counters(device, num_seqs * num_kv_heads * chunks)
    else:
        part_acc = part_ml = counters = None
    tile = SM70_CUDA_DECODE[head_size]
    kernel.launch(
        (chunks * num_splits, num_kv_heads, num_seqs),
        tile.num_warps * 32,
        query, kv, block_table, seq_lens, query_start_loc, k_scale, v_scale, sinks, out,
        part_acc, part_ml, counters, sm_scale, softcap, window, has_sinks, group, num_heads,
        chunks, num_splits, scale_stride, page_size, query.stride(0), query.stride(1),
        kv.stride(0), kv.stride(1), kv.stride(2), block_table.stride(0), out.stride(0),
        out.stride(1),
    )  # fmt: skip


def paged_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    *,
    max_query_len: int,
    max_seq_len: int,
    sm_scale: float,
    kv_cache_dtype: str = "float16",
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
    num_splits: int | None = None,
    ptx_arch: str | None = None,
    check_bounds: bool = True,
) -> torch.Tensor:
    """The CUDA decode alone, whatever the device (the tests run it on the H100, where the Triton
    path is chosen): :func:`volta_attn_v100.ops.paged_attention`'s checks and arguments, then
    :func:`launch`. ``num_splits`` defaults to the device's split policy.

    :raises AttentionInputError: bad input, before any launch.
    :raises ValueError: a build the table does not list, or tensors its loads cannot read.
    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC.
    :raises CudaCompileError: NVRTC refused the build.
    """
    from volta_attn_v100 import ops

    kv = ops.cache_view(kv_cache, kv_cache_dtype)
    ops.check_inputs(
        query, kv, block_table, seq_lens, query_start_loc, out, sinks, check_bounds=check_bounds
    )
    ops.check_masking(sliding_window, logits_soft_cap)
    if max_query_len > MAX_DECODE_QUERY_LEN:
        raise ops.AttentionInputError(
            f"the decode kernel takes at most {MAX_DECODE_QUERY_LEN} query tokens per sequence, "
            f"got {max_query_len}"
        )
    head_size = query.shape[2]
    if head_size not in SM70_CUDA_DECODE or kv_cache_dtype == "fp8_e4m3":
        raise ValueError(f"the tensor-core decode has no build for {head_size} / {kv_cache_dtype}")
    if not vector_aligned(query, kv):
        raise ValueError(
            "the tensor-core decode needs 16-byte aligned cache rows and 8-byte Q rows"
        )
    num_kv_heads = kv.shape[1]
    scales = ops.kv_scales(k_scale, v_scale, num_kv_heads, query.device, check_values=check_bounds)
    if num_splits is None:
        num_splits = ops.default_num_splits(
            seq_lens.shape[0], num_kv_heads, max_seq_len, query.device, kv_cache_dtype
        )
    if seq_lens.shape[0] == 0 or query.shape[0] == 0:
        return out
    # The caller asked for this path by name: a build that cannot load raises here.
    BUILDS.load(query.device, _options(head_size, kv_cache_dtype), ptx_arch)
    launch(
        query, kv, block_table, seq_lens, query_start_loc, out,
        k_scale=scales.k, v_scale=scales.v, scale_stride=scales.stride,
        sinks=sinks.to(torch.float32).contiguous() if sinks is not None else scales.k,
        has_sinks=int(sinks is not None), sm_scale=float(sm_scale),
        softcap=float(logits_soft_cap), window=int(sliding_window or 0),
        kv_cache_dtype=kv_cache_dtype, max_query_len=max_query_len, num_splits=num_splits,
        ptx_arch=ptx_arch,
    )  # fmt: skip
    return out
