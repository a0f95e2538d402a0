"""Loading and launching the routed experts' tensor-core GEMM (``wna16_moe_mma.cu``).

The host's rule for CUDA builds (:class:`volta_core.kernel_api.CudaBuilds`), as for the dense
GEMM (:mod:`.mma`): each build is compiled and loaded once per device; without NVRTC, or where a
build does not compile, the Triton routed-blocks kernel serves (logged once; raises with
``VLLM_VOLTA_STRICT=1``); a build first asked for during CUDA-graph capture is left to the
Triton kernel, so :func:`warm_up` loads a layer's builds when the layer is set up.
"""

from __future__ import annotations

import ctypes

import torch

from volta_core.kernel_api import CudaBuilds
from volta_ct_wna16.cuda import MOE_KERNEL, MOE_SOURCE
from volta_ct_wna16.cuda.mma import MAX_ELEMENTS, _vector_rows
from volta_ct_wna16.launch import mma_options
from volta_ct_wna16.layout import PackedWeights
from volta_ct_wna16.routing import Blocks
from volta_ct_wna16.tables import MMA, Launch

#: The routed GEMM's builds, loaded once per device.
BUILDS = CudaBuilds("ct_wna16: the routed experts' tensor-core GEMM", MOE_SOURCE, MOE_KERNEL)


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


def moe_mma_linear(
    x: torch.Tensor,
    pw: PackedWeights,
    blocks: Blocks,
    launch: Launch,
    out: torch.Tensor,
    row_div: int,
    out_div: int,
    router_weights: torch.Tensor | None,
    ptx_arch: str | None = None,
) -> None:
    """Every routed pair ``p`` of ``blocks`` times its expert's weights on the tensor cores:
    ``x[p // row_div] @ dequant(W_e).T`` (times ``router_weights[p]`` where given) stored as
    fp16 row ``p`` of ``out``, or added into fp32 row ``p // out_div`` of ``out`` (zeroed by the
    caller). ``pw`` holds every local expert's weights stacked on a first axis; arguments as
    :func:`volta_ct_wna16.ops.moe_linear` has checked them. ``ptx_arch`` (``"compute_70"``)
    builds PTX for the V100 and lets the driver JIT-compile it.

    :raises ValueError: not a tensor-core launch, not on CUDA, or a tensor past 32-bit
        indexing, before any launch.
    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC.
    :raises CudaCompileError: NVRTC refused the build.
    """
    if launch.path != MMA or blocks.block_m != launch.block_m:
        raise ValueError(f"not a tensor-core launch for blocks of {blocks.block_m}: {launch}")
    if not x.is_cuda:
        raise ValueError(f"the tensor-core GEMM runs on CUDA devices, not on {x.device}")
    xk = _vector_rows(x)
    sizes = {
        "activations": xk.shape[0] * xk.stride(0),
        "output": out.shape[0] * out.stride(0),
        "one expert's weights": pw.qweight.stride(0),
    }
    if max(sizes.values()) > MAX_ELEMENTS:
        raise ValueError(f"the tensor-core GEMM indexes with 32-bit ints; elements: {sizes}")
    options = mma_options(launch, pw.bits, pw.zeros is not None)
    kernel = BUILDS.loaded(x.device, options, ptx_arch) or BUILDS.load(x.device, options, ptx_arch)
    fp32 = out.dtype == torch.float32
    kernel.launch(
        (blocks.blocks, -(-pw.n // launch.block_n)),
        launch.num_warps * 32,
        xk, pw.qweight, pw.scales, pw.zeros, None if fp32 else out, out if fp32 else None,
        router_weights, blocks.pairs, blocks.experts, blocks.num_pairs, blocks.num_experts,
        pw.n, pw.k, xk.shape[1], pw.qweight.shape[1], pw.group, row_div, out_div,
        xk.stride(0), out.stride(0), ctypes.c_int64(pw.qweight.stride(0)),
        ctypes.c_int64(pw.scales.stride(0)),
    )  # fmt: skip
