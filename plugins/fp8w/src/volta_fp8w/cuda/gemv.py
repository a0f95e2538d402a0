"""Loading and launching the one-token CUDA GEMV (``fp8_gemv.cu``).

:func:`ready` answers whether a device runs a launch's build (NVRTC options,
:func:`.launch_args.gemv_options`) by the host's rule (:class:`volta_core.kernel_api.CudaBuilds`):
compiled and loaded once; a missing toolkit or a compile error leaves the Triton GEMV to serve,
logged once, or raises with ``VLLM_VOLTA_STRICT=1``; a build first asked for during CUDA-graph
capture is left to the Triton GEMV, so :func:`warm_up` loads it when a layer is set up.
:func:`runs` says whether a layer's tensors meet the kernel's 16-byte loads; :func:`gemv_linear`
launches it.
"""

from __future__ import annotations

import torch

from volta_core.kernel_api import (
    CudaBuilds,
    arrival_counters,
    device_facts,
    with_prelude,
    zeroed_accumulators,
)
from volta_fp8w.cuda import GEMV_KERNEL, GEMV_SOURCE
from volta_fp8w.cuda.launch_args import gemv_grid, gemv_options, gemv_rows
from volta_fp8w.cuda.operands import check_operands
from volta_fp8w.launch import gemv_splits
from volta_fp8w.layout import Fp8Weights
from volta_fp8w.tables import GEMV_VECTOR, Launch

#: The GEMV's builds: loaded once per device, the Triton GEMV serving where they cannot.
BUILDS = CudaBuilds("fp8w: the one-token CUDA GEMV", with_prelude(GEMV_SOURCE), GEMV_KERNEL)

#: The largest input count and row stride the kernel takes: it finds a load's scale column with
#: a float product, exact below 2**24 inputs (``fp8_gemv.cu``'s ``scale_column``).
MAX_INPUTS = 2**24 - 16


def ready(device: torch.device, launch: Launch) -> bool:
    """Whether ``launch``'s build runs on CUDA ``device``; loaded now if it was not asked for
    before, outside CUDA-graph capture.

    :raises ValueError: not a CUDA GEMV launch.
    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC, with ``VLLM_VOLTA_STRICT=1``.
    :raises CudaCompileError: NVRTC refused the build, with ``VLLM_VOLTA_STRICT=1``.
    :raises RuntimeError: first asked for during capture, with ``VLLM_VOLTA_STRICT=1``.
    """
    return BUILDS.ready(device, gemv_options(launch))


def warm_up(device: torch.device, launch: Launch) -> None:
    """Load ``launch``'s build on ``device`` (before any CUDA-graph capture)."""
    ready(device, launch)


def runs(w: Fp8Weights) -> bool:
    """Whether the kernel's 16-byte loads take ``w``: its input count, row stride and base
    address multiples of 16 bytes and below :data:`MAX_INPUTS`, on CUDA. (Scale blocks are
    multiples of 32 inputs, so a load's 16 inputs share one scale.)"""
    codes = w.weight
    return (
        codes.is_cuda
        and w.k % GEMV_VECTOR == 0
        and codes.stride(0) % GEMV_VECTOR == 0
        and codes.data_ptr() % GEMV_VECTOR == 0
        and w.k <= MAX_INPUTS
        and codes.stride(0) <= MAX_INPUTS
    )


def gemv_linear(
    x2: torch.Tensor,
    w: Fp8Weights,
    bias: torch.Tensor | None,
    launch: Launch,
    out: torch.Tensor,
    ptx_arch: str | None = None,
) -> None:
    """``out = x2 @ W.T (+ bias)`` for one token: ``x2`` fp16 ``[1, K]``, ``bias`` None or fp16
    ``[N]``, ``out`` fp16 ``[1, N]`` with unit stride, ``W`` the layer's dequantized weights,
    for arguments :func:`volta_fp8w.ops.fp8_linear`'s checks pass and a layer :func:`runs`
    takes. The activations are copied where their row is not 16-byte aligned. The input is
    split as :func:`volta_fp8w.launch.gemv_splits` says for the device's SMs.

    ``ptx_arch`` (``"compute_70"``) builds PTX for that architecture and lets the driver
    JIT-compile it, instead of a cubin for the device: the V100's build, run on another GPU.

    :raises ValueError: more than one token, a layer the kernel's loads do not take, mismatched
        shapes or dtypes, not a CUDA GEMV launch; before any launch.
    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC.
    :raises CudaCompileError: NVRTC refused the build.
    """
    gemv_rows(launch)
    if not runs(w):
        raise ValueError(
            f"the CUDA GEMV reads 16 bytes at a time: it takes CUDA codes whose input count "
            f"({w.k}), row stride ({w.weight.stride(0)}) and address are multiples of "
            f"{GEMV_VECTOR}, the first two at most {MAX_INPUTS}"
        )
    check_operands("the CUDA GEMV", x2, w, bias, out, one_token=True)
    if x2.stride(1) != 1 or x2.data_ptr() % GEMV_VECTOR:
        x2 = x2.clone()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    options = gemv_options(launch)
    kernel = BUILDS.loaded(x2.device, options, ptx_arch) or BUILDS.load(
        x2.device, options, ptx_arch
    )
    splits, per_split = gemv_splits(w.n, w.k, launch, device_facts(x2.device).sm_count)
    grid = gemv_grid(w.n, launch, splits)
    ws: torch.Tensor | None = None
    counters: torch.Tensor | None = None
    if splits > 1:
        ws = zeroed_accumulators(x2.device, w.n)
        counters = arrival_counters(x2.device, grid[0])
    kernel.launch(
        grid,
        launch.num_warps * 32,
        x2, w.weight, w.scales, bias, out, ws, counters,
        w.n, w.k, w.weight.stride(0), w.scales.stride(0), w.scales.stride(1),
        w.block_n, 1.0 / w.block_k, per_split,
    )  # fmt: skip
