"""Loading and launching the W8A16 tensor-core GEMM (``fp8_mma.cu``).

:func:`ready` answers whether a device runs a launch's build (NVRTC options,
:func:`.launch_args.mma_options`), by the host's rule (:class:`volta_core.kernel_api.CudaBuilds`):
each is compiled and loaded once; a missing toolkit or a compile error leaves the Triton kernels
to serve, logged once, or raises with ``VLLM_VOLTA_STRICT=1``; a build first asked for during
CUDA-graph capture is left to the Triton path, so :func:`warm_up` loads a layer's builds when
the layer is set up. :func:`mma_linear` launches one.
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
from volta_fp8w.cuda import KERNEL, SOURCE
from volta_fp8w.cuda.launch_args import check_mma_launch, mma_grid, mma_options, mma_splits
from volta_fp8w.cuda.operands import check_operands
from volta_fp8w.layout import Fp8Weights
from volta_fp8w.tables import Launch

#: The most elements a tensor the kernel indexes may have: it indexes with 32-bit ints.
MAX_ELEMENTS = 2**31 - 1

#: The most blocks on the grid's second and third axes (CUDA's limit).
MAX_GRID_YZ = 65535

#: Bytes of one weight load: rows whose start is a multiple of this are read 16 bytes at a time,
#: others byte by byte (an input length not a multiple of 16).
VECTOR_BYTES = 16

#: The GEMM's builds: loaded once per device, the Triton kernels serving where they cannot
#: (:class:`volta_core.kernel_api.CudaBuilds`). The source is compiled behind the host's SM70
#: prelude (``mma_m8n8k4``, ``pack_half2``, the integer typedefs).
BUILDS = CudaBuilds("fp8w: the tensor-core GEMM", with_prelude(SOURCE), KERNEL)


def ready(device: torch.device, launch: Launch) -> bool:
    """Whether ``launch``'s build runs on CUDA ``device``; loaded now if it was not asked for
    before, outside CUDA-graph capture.

    :raises ValueError: not a launch the kernel has a build for.
    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC, with ``VLLM_VOLTA_STRICT=1``.
    :raises CudaCompileError: NVRTC refused the build, with ``VLLM_VOLTA_STRICT=1``.
    :raises RuntimeError: first asked for during capture, with ``VLLM_VOLTA_STRICT=1``.
    """
    return BUILDS.ready(device, mma_options(launch))


def warm_up(device: torch.device, launches: list[Launch]) -> None:
    """Load each of ``launches``' builds on ``device`` (before any CUDA-graph capture)."""
    for launch in launches:
        ready(device, launch)


def mma_linear(
    x2: torch.Tensor,
    w: Fp8Weights,
    bias: torch.Tensor | None,
    launch: Launch,
    out: torch.Tensor,
    ptx_arch: str | None = None,
) -> None:
    """``out = x2 @ W.T (+ bias)`` on the tensor cores, ``W`` the layer's dequantized weights:
    ``x2`` fp16 ``[M, K]`` (any row stride; copied when its rows are not 16-byte vectors),
    ``bias`` None or fp16 ``[N]``, ``out`` fp16 ``[M, N]`` with unit stride along N, for
    arguments :func:`volta_fp8w.ops.fp8_linear`'s checks pass. Any ``M``: the launch's
    ``block_m`` rows a block.

    ``ptx_arch`` (``"compute_70"``) builds PTX for that architecture and lets the driver
    JIT-compile it, instead of a cubin for the device: the V100's build, run on another GPU.

    :raises ValueError: not a tensor-core launch, a k-tile that does not divide the layer's
        scale blocks, not on CUDA, mismatched shapes or dtypes, a tensor past 32-bit indexing
        or a grid past CUDA's, before any launch.
    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC.
    :raises CudaCompileError: NVRTC refused the build.
    """
    check_mma_launch(launch)
    if w.block_k % launch.block_k:
        raise ValueError(
            f"the k-tile of {launch.block_k} inputs does not divide the layer's scale blocks of "
            f"{w.block_k}: {launch}"
        )
    if not x2.is_cuda:
        raise ValueError(f"the tensor-core GEMM runs on CUDA devices, not on {x2.device}")
    check_operands("the tensor-core GEMM", x2, w, bias, out, one_token=False)
    m, k = x2.shape
    if m == 0:
        return
    xk = _vector_rows(x2)
    sizes = {
        "activations": m * xk.stride(0),
        "output": m * out.stride(0),
        "accumulators": m * w.n,
        "weights": w.weight.numel(),
    }
    if max(sizes.values()) > MAX_ELEMENTS:
        raise ValueError(f"the tensor-core GEMM indexes with 32-bit ints; elements: {sizes}")
    splits, per_split = mma_splits(w.n, k, launch, device_facts(x2.device).sm_count, m)
    grid = mma_grid(m, w.n, launch, splits)
    if max(grid[1:]) > MAX_GRID_YZ:
        raise ValueError(
            f"a {w.n}x{w.k} layer gives {launch} the grid {grid}: more than {MAX_GRID_YZ} "
            "blocks on its second or third axis"
        )
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    options = mma_options(launch)
    kernel = BUILDS.loaded(x2.device, options, ptx_arch) or BUILDS.load(
        x2.device, options, ptx_arch
    )
    ws: torch.Tensor | None = None
    counters: torch.Tensor | None = None
    if splits > 1:
        ws = zeroed_accumulators(x2.device, m * w.n)
        counters = arrival_counters(x2.device, grid[0] * grid[1])
    aligned = k % VECTOR_BYTES == 0 and w.weight.data_ptr() % VECTOR_BYTES == 0
    kernel.launch(
        grid,
        launch.num_warps * 32,
        xk, w.weight, w.scales, bias, out, ws, counters,
        m, w.n, k, xk.shape[1], xk.stride(0), out.stride(0),
        w.block_n, w.block_k, w.scales.shape[1], per_split, int(aligned),
    )  # fmt: skip


def _vector_rows(x2: torch.Tensor) -> torch.Tensor:
    """The activations as the kernel reads them, 16-byte vectors of 8 inputs: ``x2`` itself
    where its rows start 16-byte aligned, have unit stride and a length that is a multiple of
    8, else a copy zero-padded to one (an odd input length, a strided view)."""
    k = x2.shape[1]
    if k % 8 == 0 and x2.stride(1) == 1 and x2.stride(0) % 8 == 0 and x2.data_ptr() % 16 == 0:
        return x2
    padded = x2.new_zeros((x2.shape[0], -(-k // 8) * 8))
    padded[:, :k] = x2
    return padded
