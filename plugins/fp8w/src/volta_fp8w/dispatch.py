"""Which kernel runs a linear call on a device family, every Triton build the tables ship there,
and what a launch costs: the one answer the launcher (:mod:`volta_fp8w.ops`), the compile gate
and the plan read.

* The launch a call gets, as a :class:`volta_core.kernel_api.Choice` (:func:`linear_choice`:
  on a V100 from :data:`MMA_MIN_M` tokens on the CUDA tensor-core GEMM where its cost is no
  more than the table's, carrying the table's launch as its fallback; else the table's,
  :func:`table_choice`). Whether the CUDA build loads is the launcher's only decision
  (:func:`volta_fp8w.cuda.mma.ready`).
* What a launch costs (:func:`linear_cost`), a :class:`volta_core.kernel_api.KernelCost`
  priced at :data:`volta_core.kernel_api.V100_RATES`: the tensor-core choice compares these
  costs, and the plan's estimate reads them (:func:`stage_cost`) on the stages of the plan's
  kernel paths (:func:`linear_paths`).
* Every build the plugin ships on a family (:func:`triton_builds`, :func:`tensor_core_builds`):
  what the SM70 gates compile.

Reads the launch data (:mod:`volta_fp8w.tables`) and what follows from a launch
(:mod:`volta_fp8w.launch`). Torch- and triton-free: the plugin's hooks import it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from volta_core import KernelPath, LayerKind, QuantLayer
from volta_core.kernel_api import (
    V100_RATES,
    Choice,
    DeviceFacts,
    KernelCost,
    LaunchCost,
    StageCost,
    Unit,
    Workload,
    kernel_paths,
    stage_of,
    stage_ranges,
    token_stage,
)
from volta_fp8w.launch import (
    aligned_args,
    dequant_constexprs,
    fitted_tiles,
    gemm_constexprs,
    split_count,
    splitk_constexprs,
)
from volta_fp8w.limits import MMA_CAPABILITY
from volta_fp8w.scheme import Fp8Scheme
from volta_fp8w.tables import (
    DECODE_MAX_M,
    DEQUANT_MATMUL,
    GEMM,
    MMA,
    SM70_MMA,
    SPLITK,
    Launch,
    table_for,
)

#: What each launch path is called in a plan.
KERNEL_NAMES = {
    SPLITK: "Triton split-K GEMV",
    GEMM: "Triton tiled GEMM",
    DEQUANT_MATMUL: "dequantize, then cuBLAS",
    MMA: "tensor cores (CUDA, mma.m8n8k4)",
}

#: The kernels' import paths (the compile gate's configurations name them).
SPLITK_KERNEL = "volta_fp8w.kernels.splitk:fp8w_splitk_kernel"
GEMM_KERNEL = "volta_fp8w.kernels.gemm:fp8w_gemm_kernel"
DEQUANT_KERNEL = "volta_fp8w.kernels.dequant:fp8w_dequant_kernel"

#: The device costs are priced for: a V100 SXM2 (80 SMs), the device of
#: :data:`volta_core.kernel_api.V100_RATES`.
V100 = DeviceFacts((7, 0), 80)

#: The scale block choices are priced with (Qwen's FP8 releases and llm-compressor's FP8_BLOCK).
PRICING_BLOCK = (128, 128)


def triton_unit(launch: Launch, capability: tuple[int, int]) -> Unit:
    """Where a launch's products run: dequantize-then-cuBLAS and the CUDA GEMM on the tensor
    cores; a ``tl.dot`` launch (the GEMM, a GEMV tile of more than one token) on the tensor
    cores from SM80 on; everything else on the FMA units, every Triton launch on SM70
    (``tl.dot`` runs on them there, triton-lang/triton#5066) and the 1-token GEMV."""
    if launch.path in (DEQUANT_MATMUL, MMA):
        return Unit.TENSOR_CORES
    if capability >= (8, 0) and (launch.path == GEMM or launch.block_m > 1):
        return Unit.TENSOR_CORES
    return Unit.FMA


def table_launch(m: int, n: int, k: int, capability: tuple[int, int]) -> Launch:
    """The table's launch for ``m`` tokens on ``capability``: the GEMV up to one token, the
    small GEMV up to :data:`~volta_fp8w.tables.DECODE_MAX_M`, dequantize-then-cuBLAS from the
    table's ``dequant_from`` on, the tiled GEMM between. The rows depend on ``m`` alone; the
    layer's ``n x k`` acts through :func:`volta_fp8w.launch.split_count`."""
    t = table_for(capability)
    if m <= 1:
        return t.gemv
    if m <= DECODE_MAX_M:
        return t.small
    if t.dequant_from is not None and m >= t.dequant_from:
        return t.dequant
    return t.gemm


def table_choice(m: int, n: int, k: int, capability: tuple[int, int]) -> Choice[Launch]:
    """:func:`table_launch` as a choice: its path's name and unit (:func:`triton_unit`)."""
    launch = table_launch(m, n, k, capability)
    return Choice(KERNEL_NAMES[launch.path], triton_unit(launch, capability), launch)


#: The fewest tokens the tensor-core GEMM is weighed for: from here on the GEMV's FMAs are about
#: as slow as its bytes on a V100 (``2mnk`` at 15.7 TFLOP/s against ``nk`` at 900 GB/s), so the
#: tensor cores, whose arithmetic is 8 times faster, stop being a loss.
MMA_MIN_M = DECODE_MAX_M


def mma_launch(m: int) -> Launch:
    """The tensor-core GEMM's row of :data:`~volta_fp8w.tables.SM70_MMA` for ``m`` tokens: the
    first that takes them, the last (its largest tile) above them all."""
    return next((row for most, row in SM70_MMA if m <= most), SM70_MMA[-1][1])


@functools.cache
def linear_choice(m: int, n: int, k: int, capability: tuple[int, int]) -> Choice[Launch]:
    """The launch for ``m`` tokens on an ``n x k`` layer on ``capability``: on a V100
    (:data:`~volta_fp8w.limits.MMA_CAPABILITY`) from :data:`MMA_MIN_M` tokens the tensor-core
    GEMM (:func:`mma_launch`), needing NVRTC and carrying :func:`table_choice` as its fallback,
    where its cost (:func:`linear_cost`) at :data:`~volta_core.kernel_api.V100_RATES` is no more
    than the table launch's: a tie (both bound by the same weight bytes) goes to the tensor
    cores, whose arithmetic is further from binding; above the tensor-core table's rows this
    weighs it against dequantize-then-cuBLAS. Elsewhere :func:`table_choice`. Kept per
    (tokens, shape): the launcher asks on every call. Costs are priced with 128 x 128 blocks
    (the scales are under 0.01% of the bytes at any block the checkpoints use)."""
    table = table_choice(m, n, k, capability)
    if capability != MMA_CAPABILITY or m < MMA_MIN_M:
        return table
    launch = mma_launch(m)
    mma = linear_cost(launch, m, n, k, PRICING_BLOCK)
    triton = linear_cost(table.launch, m, n, k, PRICING_BLOCK)
    if mma.seconds(V100_RATES) <= triton.seconds(V100_RATES):
        return Choice(KERNEL_NAMES[MMA], Unit.TENSOR_CORES, launch, fallback=table)
    return table


def linear_cost(
    launch: Launch, m: int, n: int, k: int, block: tuple[int, int], device: DeviceFacts = V100
) -> KernelCost:
    """What ``launch`` costs for ``m`` tokens on an ``n x k`` layer of ``block``
    (``(block_n, block_k)``) scale blocks on ``device``: weights read at one byte each, scales
    at four, fp16 activations (``2mk``) and outputs (``2mn``).

    * Split-K GEMV and tiled GEMM: one launch, ``2mnk`` FLOPs on :func:`triton_unit`'s unit.
      A GEMV of more than one split (:func:`volta_fp8w.launch.split_count` on ``device``'s
      SMs) also adds ``4mn`` per split into the fp32 accumulators, and its last arrivers read
      the sums and write zeros back (``4mn`` each).
    * Dequantize-then-cuBLAS: two launches, one after the other; the dequantization reads the
      weights and scales and writes ``W`` in fp16 (``2nk``), no arithmetic counted; cuBLAS
      reads it back with the activations, writes the outputs and runs ``2mnk`` FLOPs on the
      tensor cores.
    * The CUDA tensor-core GEMM: one launch, ``2mnk`` FLOPs (tokens padded to ``block_m``) on
      the tensor cores.
    """
    name = KERNEL_NAMES[launch.path]
    block_n, block_k = block
    weights = n * k + 4 * -(-n // block_n) * -(-k // block_k)
    unit = triton_unit(launch, device.capability)
    if launch.path == DEQUANT_MATMUL:
        dense = 2 * n * k
        return KernelCost(
            name,
            (
                LaunchCost(weights, dense, 0, Unit.FMA),
                LaunchCost(dense + 2 * m * k, 2 * m * n, 2 * m * n * k, unit),
            ),
        )
    rows = -(-m // launch.block_m) * launch.block_m if launch.path == MMA else m
    read, written = weights + 2 * m * k, 2 * m * n
    if launch.path == SPLITK:
        splits = split_count(n, k, launch, device.sm_count, m)[0]
        if splits > 1:
            read += 4 * m * n
            written += 4 * m * n * (splits + 1)
    return KernelCost(name, (LaunchCost(read, written, 2 * rows * n * k, unit),))


@dataclass(frozen=True)
class TritonBuild:
    """One Triton kernel build: the kernel's import path, its ``tl.constexpr`` arguments (in
    :mod:`volta_fp8w.launch`'s order), its warps, and the integer arguments that are multiples
    of 16 at every launch of it (:func:`volta_fp8w.launch.aligned_args`; the others may be or
    not, and the JIT builds both)."""

    kernel: str
    constexprs: tuple[tuple[str, int | bool], ...]
    num_warps: int
    aligned: tuple[str, ...]


def _build(kernel: str, constexprs: dict[str, int | bool], launch: Launch) -> TritonBuild:
    return TritonBuild(kernel, tuple(constexprs.items()), launch.num_warps, aligned_args(launch))


def triton_builds(capability: tuple[int, int]) -> list[TritonBuild]:
    """Every distinct Triton build the launcher can run with the table of ``capability``:
    each launch of the table that serves some token count, at every input tile
    :func:`volta_fp8w.launch.fitted` gives it on some layer; the GEMV split and not, each
    GEMV and GEMM with and without bias; the dequantize kernel where the table has
    dequantize-then-cuBLAS."""
    t = table_for(capability)
    launches = [t.gemv, t.small]
    if t.dequant_from is None or t.dequant_from > DECODE_MAX_M + 1:
        launches.append(t.gemm)
    if t.dequant_from is not None:
        launches.append(t.dequant)
    builds: list[TritonBuild] = []
    for base in launches:
        for tile in fitted_tiles(base):
            launch = replace(base, block_k=tile)
            if launch.path == SPLITK:
                variants = [
                    _build(SPLITK_KERNEL, splitk_constexprs(launch, bias, split), launch)
                    for split in (True, False)
                    for bias in (False, True)
                ]
            elif launch.path == GEMM:
                variants = [
                    _build(GEMM_KERNEL, gemm_constexprs(launch, bias), launch)
                    for bias in (False, True)
                ]
            else:
                variants = [_build(DEQUANT_KERNEL, dequant_constexprs(launch), launch)]
            builds.extend(build for build in variants if build not in builds)
    return builds


def tensor_core_builds(capability: tuple[int, int]) -> list[Launch]:
    """The tensor-core GEMM's launches on ``capability``: every row of
    :data:`~volta_fp8w.tables.SM70_MMA` on a V100, none elsewhere."""
    return [launch for _, launch in SM70_MMA] if capability == MMA_CAPABILITY else []


# -- the plan's kernel paths and their costs ------------------------------------------------------


def scheme_block(scheme: Fp8Scheme, k: int) -> tuple[int, int]:
    """The ``(block_n, block_k)`` a layer's scales cover: its blocks, or one row of the whole
    input for channel and tensor scales (expanded per row at load)."""
    return scheme.block if scheme.block is not None else (1, k)


@functools.cache
def _linear_stages(
    n: int, k: int, capability: tuple[int, int]
) -> tuple[tuple[int, int | None, Choice[Launch]], ...]:
    """:func:`linear_choice` walked over every token count until it no longer changes, in runs
    of the same kernels (:func:`volta_core.kernel_api.stage_ranges`)."""
    table = table_for(capability)
    last = max(SM70_MMA[-1][0], DECODE_MAX_M, table.dequant_from or 0) + 1

    def choose(m: int) -> Choice[Launch]:
        return linear_choice(m, n, k, capability)

    return tuple(stage_ranges(range(1, last + 1), choose, open_ended=True))


def linear_paths(n: int, k: int, capability: tuple[int, int]) -> list[KernelPath]:
    """One :class:`~volta_core.KernelPath` per range of token counts with the same kernels
    (:func:`linear_choice`), for an ``n`` outputs by ``k`` inputs layer: the tensor-core ranges
    need NVRTC, and name the table's launch that serves without it."""
    return kernel_paths(_linear_stages(n, k, capability), token_stage)


def stage_cost(
    layer: QuantLayer, scheme: Fp8Scheme, capability: tuple[int, int], work: Workload
) -> StageCost | None:
    """What ``work`` (``m = work.tokens`` tokens) costs on a linear ``layer`` (its rank's
    ``output_size x input_size``) with ``scheme``: the :func:`linear_paths` stage holding ``m``,
    the cost (:func:`linear_cost`) of the launch :func:`linear_choice` takes there and, where it
    needs NVRTC, of its fallback. Fused experts: :func:`volta_fp8w.experts_dispatch.expert_cost`
    on their stage. None where the layer's shape is not known."""
    m = work.tokens
    n, k = layer.output_size, layer.input_size
    if not (n and k):
        return None
    if layer.kind is not LayerKind.LINEAR:
        return None
    stages = _linear_stages(n, k, capability)
    first, last, _ = stages[stage_of(m, stages)]
    block = scheme_block(scheme, k)
    chosen = linear_choice(m, n, k, capability)
    cost = linear_cost(chosen.launch, m, n, k, block)
    fallback = None
    if chosen.fallback is not None:
        fallback = linear_cost(chosen.fallback.launch, m, n, k, block)
    return StageCost(token_stage(first, last), cost, fallback)
