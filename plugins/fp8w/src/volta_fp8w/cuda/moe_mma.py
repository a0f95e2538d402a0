"""Loading and launching the routed experts' W8A16 tensor-core GEMM (``fp8_moe_mma.cu``).

The host's rule for CUDA builds (:class:`volta_core.kernel_api.CudaBuilds`), as for the dense
GEMM (:mod:`.mma`): each build (gate/up and down of a launch,
:func:`.launch_args.moe_mma_options`) is compiled and loaded once per device; without NVRTC, or
where a build does not compile, the Triton routed blocks serve (logged once; raises with
``VLLM_VOLTA_STRICT=1``); a build first asked for during CUDA-graph capture is left to the
Triton kernels, so :func:`warm_up` loads a layer's builds when the layer is set up.
:func:`moe_mma_linear` launches one.
"""

from __future__ import annotations

import ctypes

import torch

from volta_core.kernel_api import CudaBuilds, with_prelude
from volta_fp8w.cuda import MOE_KERNEL, MOE_SOURCE
from volta_fp8w.cuda.launch_args import check_moe_mma_launch, moe_mma_columns, moe_mma_options
from volta_fp8w.cuda.mma import MAX_ELEMENTS, MAX_GRID_YZ, VECTOR_BYTES, _vector_rows
from volta_fp8w.layout import Fp8Weights
from volta_fp8w.tables import Launch

#: The routed GEMM's builds, loaded once per device (the source behind the host's prelude).
BUILDS = CudaBuilds(
    "fp8w: the routed experts' tensor-core GEMM", with_prelude(MOE_SOURCE), MOE_KERNEL
)


def ready(device: torch.device, launch: Launch) -> bool:
    """Whether ``launch``'s gate/up and down builds both run on CUDA ``device``; loaded now if
    they were not asked for before, outside CUDA-graph capture.

    :raises ValueError: not a launch the kernel has a build for.
    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC, with ``VLLM_VOLTA_STRICT=1``.
    :raises CudaCompileError: NVRTC refused a build, with ``VLLM_VOLTA_STRICT=1``.
    :raises RuntimeError: first asked for during capture, with ``VLLM_VOLTA_STRICT=1``.
    """
    return all(BUILDS.ready(device, moe_mma_options(launch, gate_up)) for gate_up in (True, False))


def warm_up(device: torch.device, launches: list[Launch]) -> None:
    """Load each of ``launches``' builds on ``device`` (before any CUDA-graph capture)."""
    for launch in launches:
        ready(device, launch)


def check_operands(x: torch.Tensor, w: Fp8Weights, launch: Launch, gate_up: bool) -> None:
    """What a GEMM of ``launch`` on experts ``w`` needs of them and of its input ``x``, known
    before the routing runs (:func:`volta_fp8w.experts.experts_forward` asks it of both GEMMs
    first, so a refusal comes before any launch).

    :raises ValueError: not a routed tensor-core launch, a k-tile that does not divide the
        scale blocks, not on CUDA, not fp16, odd gate/up rows.
    """
    check_moe_mma_launch(launch)
    if w.block_k % launch.block_k:
        raise ValueError(
            f"the k-tile of {launch.block_k} inputs does not divide the experts' scale blocks of "
            f"{w.block_k}: {launch}"
        )
    if not x.is_cuda:
        raise ValueError(f"the tensor-core GEMM runs on CUDA devices, not on {x.device}")
    if x.dtype != torch.float16:
        raise ValueError(f"the tensor-core GEMM takes fp16 activations, not {x.dtype}")
    if gate_up and w.n % 2:
        raise ValueError(f"gate/up weights hold gate's rows then up's: {w.n} rows is odd")


def moe_mma_linear(
    x: torch.Tensor,
    w: Fp8Weights,
    pairs: torch.Tensor,
    counts: torch.Tensor,
    num_pairs: int,
    launch: Launch,
    out: torch.Tensor,
    *,
    gate_up: bool,
    row_div: int = 1,
    out_div: int = 1,
    router_weights: torch.Tensor | None,
    ptx_arch: str | None = None,
) -> None:
    """Every routed pair ``p`` placed in ``pairs`` (blocks of ``launch.block_m`` rows, padded
    with ``num_pairs``, the experts' blocks in order: ``ceil(counts[e] / block_m)`` of expert
    ``e``'s, as :mod:`volta_fp8w.kernels.moe` places them) times its expert's weights ``w``
    (every local expert stacked on a first axis: codes ``[E, rows, k]``, scales ``[E, ...]``) on
    the tensor cores, the input row ``x[p // row_div]``:

    * ``gate_up``: ``w`` holds gate's ``n`` rows then up's; fp16 ``out[p, c] = SiLU(g) * u``
      for the ``n = rows / 2`` intermediate columns ``c``, ``g`` and ``u`` times
      ``router_weights[p]`` first where given.
    * down: ``router_weights[p]`` (where given, else 1) times the row is added into fp32
      ``out[p // out_div]`` (zeroed by the caller), so each token's pairs sum into its row.

    ``x`` fp16 (any row stride; copied when its rows are not 16-byte vectors); ``out`` unit
    stride along its columns. ``ptx_arch`` (``"compute_70"``) builds PTX for that architecture
    and lets the driver JIT-compile it: the V100's build, run on another GPU.

    :raises ValueError: not a routed tensor-core launch, a k-tile that does not divide the
        scale blocks, not on CUDA, mismatched shapes or dtypes, a tensor past 32-bit indexing
        or a grid past CUDA's, before any launch.
    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC.
    :raises CudaCompileError: NVRTC refused the build.
    """
    check_operands(x, w, launch, gate_up)
    n = w.n // 2 if gate_up else w.n
    blocks = pairs.numel() // launch.block_m
    experts = w.weight.shape[0] if w.weight.dim() == 3 else 0
    out_dtype = torch.float16 if gate_up else torch.float32
    rows = num_pairs // max(out_div, 1)
    if (
        x.dim() != 2
        or x.shape[1] != w.k
        or x.dtype != torch.float16
        or out.dtype != out_dtype
        or tuple(out.shape) != (rows, n)
        or (out.numel() > 0 and n > 1 and out.stride(1) != 1)
        or w.weight.dim() != 3
        or pairs.dtype != torch.int32
        or counts.dtype != torch.int32
        or pairs.numel() % launch.block_m
        or tuple(counts.shape) != (experts,)
        or not pairs.is_contiguous()
        or not counts.is_contiguous()
        or (router_weights is not None and router_weights.dtype != torch.float32)
        or (router_weights is not None and router_weights.shape != (num_pairs,))
        or row_div < 1
        or out_div < 1
        or (gate_up and out_div != 1)
        or num_pairs % out_div
    ):
        raise ValueError(
            f"the routed tensor-core GEMM takes x fp16 [tokens, {w.k}], out "
            f"{out_dtype} [{rows}, {n}] with unit column stride, int32 pairs in blocks of "
            f"{launch.block_m}, int32 counts [{experts}], fp32 router weights [{num_pairs}]; "
            f"got x {x.dtype} {tuple(x.shape)}, out {out.dtype} {tuple(out.shape)}, pairs "
            f"{pairs.dtype} {tuple(pairs.shape)}, counts {counts.dtype} {tuple(counts.shape)}, "
            f"row and output divisors {row_div}, {out_div}"
        )
    if blocks == 0 or num_pairs == 0:
        return
    xk = _vector_rows(x)
    sizes = {
        "activations": xk.shape[0] * xk.stride(0),
        "output": out.shape[0] * out.stride(0),
        "one expert's weights": w.weight.stride(0),
    }
    if max(sizes.values()) > MAX_ELEMENTS:
        raise ValueError(f"the tensor-core GEMM indexes with 32-bit ints; elements: {sizes}")
    grid = (blocks, -(-n // moe_mma_columns(launch, gate_up)))
    if grid[1] > MAX_GRID_YZ:
        raise ValueError(f"{n} columns give {launch} {grid[1]} blocks on the grid's second axis")
    options = moe_mma_options(launch, gate_up)
    kernel = BUILDS.loaded(x.device, options, ptx_arch) or BUILDS.load(x.device, options, ptx_arch)
    aligned = (
        w.k % VECTOR_BYTES == 0
        and w.weight.data_ptr() % VECTOR_BYTES == 0
        and w.weight.stride(0) % VECTOR_BYTES == 0
    )
    kernel.launch(
        grid,
        launch.num_warps * 32,
        xk, w.weight, w.scales, out if gate_up else None, None if gate_up else out,
        router_weights, pairs, counts, num_pairs, experts, n, w.k, xk.shape[1],
        xk.stride(0), out.stride(0), row_div, out_div, w.block_n, w.block_k,
        w.scales.shape[-1], ctypes.c_int64(w.weight.stride(0)),
        ctypes.c_int64(w.scales.stride(0)), int(aligned),
    )  # fmt: skip
