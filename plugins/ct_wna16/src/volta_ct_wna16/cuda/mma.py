"""Loading and launching the tensor-core GEMM (``wna16_mma.cu``).

:func:`ready` answers whether a device runs a build (NVRTC options), by the host's rule
(:class:`volta_core.kernel_api.CudaBuilds`): each is compiled and loaded once; a missing toolkit
or a compile error leaves the Triton kernels to serve, logged once, or raises with
``VLLM_VOLTA_STRICT=1``; a build first asked for during CUDA-graph capture is left to the Triton
path, so :func:`warm_up` loads a layer's builds when the layer is set up.
"""

from __future__ import annotations

import torch

from volta_core.kernel_api import (
    CudaBuilds,
    arrival_counters,
    device_facts,
    zeroed_accumulators,
)
from volta_ct_wna16.cuda import KERNEL, SOURCE
from volta_ct_wna16.launch import mma_options, split_count
from volta_ct_wna16.layout import PackedWeights
from volta_ct_wna16.tables import MMA, Launch

#: The most elements a tensor the kernel indexes may have: it indexes with 32-bit ints.
MAX_ELEMENTS = 2**31 - 1

#: The GEMM's builds: loaded once per device, the Triton kernels serving where they cannot
#: (:class:`volta_core.kernel_api.CudaBuilds`).
BUILDS = CudaBuilds("ct_wna16: the tensor-core GEMM", SOURCE, KERNEL)


def ready(device: torch.device, launch: Launch, bits: int, zp: bool) -> bool:
    """Whether ``launch``'s build for ``bits``-bit weights (asymmetric with ``zp``) runs on CUDA
    ``device``; loaded now if it was not asked for before, outside CUDA-graph capture.

    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC, with ``VLLM_VOLTA_STRICT=1``.
    :raises CudaCompileError: NVRTC refused the build, with ``VLLM_VOLTA_STRICT=1``.
    :raises RuntimeError: first asked for during capture, with ``VLLM_VOLTA_STRICT=1``.
    """
    return BUILDS.ready(device, mma_options(launch, bits, zp))


def warm_up(device: torch.device, launches: list[Launch], bits: int, zp: bool) -> None:
    """Load each of ``launches``' builds on ``device`` (before any CUDA-graph capture)."""
    for launch in launches:
        ready(device, launch, bits, zp)


def mma_linear(
    x2: torch.Tensor,
    pw: PackedWeights,
    bias: torch.Tensor | None,
    launch: Launch,
    out: torch.Tensor,
    ptx_arch: str | None = None,
) -> None:
    """``out = x2 @ dequant(W).T (+ bias)`` on the tensor cores, for arguments
    :func:`volta_ct_wna16.ops.wna16_linear` has checked: ``x2`` ``[M, K]`` fp16 of unit stride
    along K, ``out`` a contiguous ``[M, N]`` fp16 tensor.

    ``ptx_arch`` (``"compute_70"``) builds PTX for that architecture and lets the driver
    JIT-compile it, instead of a cubin for the device: the V100's build, run on another GPU.

    :raises ValueError: not the tensor-core GEMM's launch, not on CUDA, or a tensor past 32-bit
        indexing, before any launch.
    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC.
    :raises CudaCompileError: NVRTC refused the build.
    """
    if launch.path != MMA:
        raise ValueError(f"not a tensor-core launch: {launch}")
    if not x2.is_cuda:
        raise ValueError(f"the tensor-core GEMM runs on CUDA devices, not on {x2.device}")
    m, k = x2.shape
    xk = _vector_rows(x2)
    sizes = {
        "activations": m * xk.stride(0),
        "output": m * out.stride(0),
        "weights": pw.qweight.numel(),
    }
    if max(sizes.values()) > MAX_ELEMENTS:
        raise ValueError(f"the tensor-core GEMM indexes with 32-bit ints; elements: {sizes}")
    options = mma_options(launch, pw.bits, pw.zeros is not None)
    kernel = BUILDS.loaded(x2.device, options, ptx_arch) or BUILDS.load(
        x2.device, options, ptx_arch
    )
    splits, per_split = split_count(pw.n, k, launch, device_facts(x2.device).sm_count, m)
    grid = (-(-m // launch.block_m), -(-pw.n // launch.block_n), splits)
    ws: torch.Tensor | None = None
    counters: torch.Tensor | None = None
    if splits > 1:
        ws = zeroed_accumulators(x2.device, m * pw.n)
        counters = arrival_counters(x2.device, grid[0] * grid[1])
    kernel.launch(
        grid,
        launch.num_warps * 32,
        xk, pw.qweight, pw.scales, pw.zeros, bias, out, ws, counters,
        m, pw.n, k, xk.shape[1], pw.words_per_column, pw.group, xk.stride(0), out.stride(0),
        per_split,
    )  # fmt: skip


def _vector_rows(x2: torch.Tensor) -> torch.Tensor:
    """The activations as the kernel reads them, 16-byte vectors of 8 inputs: ``x2`` itself
    where its rows start 16-byte aligned and its length is a multiple of 8, else a copy
    zero-padded to one (an odd input length, a strided view)."""
    k = x2.shape[1]
    if k % 8 == 0 and x2.stride(0) % 8 == 0 and x2.data_ptr() % 16 == 0:
        return x2
    padded = x2.new_zeros((x2.shape[0], -(-k // 8) * 8))
    padded[:, :k] = x2
    return padded
