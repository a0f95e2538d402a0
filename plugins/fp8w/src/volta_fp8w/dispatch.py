"""Which kernel runs a linear call or a fused-MoE step on a device family, every Triton build
the tables ship there, and what a launch costs: the one answer the launchers
(:mod:`volta_fp8w.ops`, :mod:`volta_fp8w.experts`), the compile gate and the plan read.

* The launch a call gets, as a :class:`volta_core.kernel_api.Choice`: a linear layer's
  (:func:`linear_choice`: at one token the table's CUDA GEMV where the input count is whole
  16-byte loads and the outputs fill the GPU, on a V100 from :data:`MMA_MIN_M` tokens on the
  CUDA tensor-core GEMM where its cost is no more than the table's, each carrying the table's
  launch as its fallback; else the table's, :func:`table_choice`), and the fused experts'
  (:func:`expert_choice`: the decode GEMVs on the router's ids up to the table's
  ``moe_decode_max_m`` tokens,
  :func:`moe_decode_choice`, the routed blocks above, :func:`moe_blocks_choice`, on a V100 the
  CUDA tensor-core GEMM over them where it costs no more, :func:`moe_mma_launch`). Whether the
  CUDA build loads is the launcher's only decision (:func:`volta_fp8w.cuda.mma.ready`,
  :func:`volta_fp8w.cuda.moe_mma.ready`, :func:`volta_fp8w.cuda.gemv.ready`), and for the GEMV
  whether the layer's tensors are 16-byte aligned (:func:`volta_fp8w.cuda.gemv.runs`).
* What a launch costs (:func:`linear_cost`, :func:`expert_cost`), a
  :class:`volta_core.kernel_api.KernelCost` priced at :data:`volta_core.kernel_api.V100_RATES`:
  the tensor-core choice compares these costs, and the plan's estimate reads them
  (:func:`stage_cost`) on the stages of the plan's kernel paths (:func:`linear_paths`,
  :func:`expert_paths`).
* Every build the plugin ships on a family (:func:`triton_builds`, :func:`moe_builds`,
  :func:`tensor_core_builds`, :func:`moe_tensor_core_builds`, :func:`cuda_gemv_builds`): what
  the SM70 gates compile.
  The experts' launcher takes each launch's ``tl.constexpr`` arguments, warps and stages from
  the same build records (:func:`moe_gemv_build`, :func:`moe_blocks_build`...), so the gate
  compiles what runs.

Reads the launch data (:mod:`volta_fp8w.tables`) and what follows from a launch
(:mod:`volta_fp8w.launch`). Torch- and triton-free: the plugin's hooks import it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TypeAlias

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
    TILE_KS,
    aligned_args,
    dequant_constexprs,
    fitted_tiles,
    gemm_constexprs,
    gemv_splits,
    split_count,
    splitk_constexprs,
)
from volta_fp8w.limits import MAX_ROUTED_EXPERTS, MMA_CAPABILITY
from volta_fp8w.scheme import Fp8Scheme
from volta_fp8w.tables import (
    AUX_NUM_STAGES,
    AUX_NUM_WARPS,
    COUNT_BLOCK,
    CUDA_GEMV,
    DECODE_MAX_M,
    DEQUANT_MATMUL,
    GEMM,
    GEMV_VECTOR,
    MMA,
    PLACE_ELEMENTS,
    PLACE_MAX_BLOCK,
    PLACE_MIN_BLOCK,
    SM70_MMA,
    SM70_MOE_MMA,
    SPLITK,
    SUM_BLOCK,
    Launch,
    MoELaunch,
    Table,
    table_for,
)

#: What each launch path is called in a plan.
KERNEL_NAMES = {
    SPLITK: "Triton split-K GEMV",
    GEMM: "Triton tiled GEMM",
    DEQUANT_MATMUL: "dequantize, then cuBLAS",
    MMA: "tensor cores (CUDA, mma.m8n8k4)",
    CUDA_GEMV: "CUDA GEMV (16-byte loads)",
}

#: The kernels' import paths (the compile gate's configurations name them).
SPLITK_KERNEL = "volta_fp8w.kernels.splitk:fp8w_splitk_kernel"
GEMM_KERNEL = "volta_fp8w.kernels.gemm:fp8w_gemm_kernel"
DEQUANT_KERNEL = "volta_fp8w.kernels.dequant:fp8w_dequant_kernel"

#: The fused experts' kernels as a plan names them: the decode step's GEMVs on the router's ids
#: (gate/up, down, the slot sum), and the routed blocks (routing, then a grouped GEMM for gate/up
#: and one for down), :mod:`volta_fp8w.kernels.moe`.
MOE_DECODE = "Triton MoE decode GEMVs on the router's ids"
MOE_BLOCKS = "Triton grouped GEMM over routed blocks"
MOE_MMA = "tensor cores over routed blocks (CUDA, mma.m8n8k4)"

#: A fused-MoE launch: a Triton tile, or the V100's CUDA tensor-core GEMM (``MMA``).
ExpertLaunch: TypeAlias = MoELaunch | Launch

#: The fused experts' kernels' import paths.
MOE_GEMV_GATE_UP_KERNEL = "volta_fp8w.kernels.moe:moe_gemv_gate_up_kernel"
MOE_GEMV_DOWN_KERNEL = "volta_fp8w.kernels.moe:moe_gemv_down_kernel"
MOE_SUM_KERNEL = "volta_fp8w.kernels.moe:moe_sum_kernel"
MOE_COUNT_KERNEL = "volta_fp8w.kernels.moe:moe_count_kernel"
MOE_PLACE_KERNEL = "volta_fp8w.kernels.moe:moe_place_kernel"
MOE_GATE_UP_KERNEL = "volta_fp8w.kernels.moe:moe_gate_up_kernel"
MOE_DOWN_KERNEL = "volta_fp8w.kernels.moe:moe_down_kernel"

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
    if launch.path == CUDA_GEMV:
        return Unit.FMA
    if capability >= (8, 0) and (launch.path == GEMM or launch.block_m > 1):
        return Unit.TENSOR_CORES
    return Unit.FMA


def table_launch(m: int, n: int, k: int, capability: tuple[int, int]) -> Launch:
    """The table's launch for ``m`` tokens on ``capability``: the GEMV up to one token, the
    multi-token split-K tile up to the table's ``small_max_m``, dequantize-then-cuBLAS from the
    table's ``dequant_from`` on, the tiled GEMM between. The rows depend on ``m`` alone; the
    layer's ``n x k`` acts through :func:`volta_fp8w.launch.split_count`."""
    t = table_for(capability)
    if m <= 1:
        return t.gemv
    if m <= t.small_max_m:
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


def cuda_gemv_launch(n: int, k: int, capability: tuple[int, int]) -> Launch | None:
    """The one-token CUDA GEMV's launch for an ``n x k`` layer on ``capability``: the table's
    row for ``k`` inputs where ``k`` is whole 16-byte loads and ``n`` at least the table's
    ``cuda_gemv_min_n``; else None (the Triton GEMV)."""
    t = table_for(capability)
    if not t.cuda_gemv or k % GEMV_VECTOR or n < t.cuda_gemv_min_n:
        return None
    return next(launch for most, launch in t.cuda_gemv if most is None or k <= most)


def mma_launch(m: int) -> Launch:
    """The tensor-core GEMM's row of :data:`~volta_fp8w.tables.SM70_MMA` for ``m`` tokens: the
    first that takes them, the last (its largest tile) above them all."""
    return next((row for most, row in SM70_MMA if m <= most), SM70_MMA[-1][1])


@functools.cache
def linear_choice(m: int, n: int, k: int, capability: tuple[int, int]) -> Choice[Launch]:
    """The launch for ``m`` tokens on an ``n x k`` layer on ``capability``: at one token the
    table's CUDA GEMV (:func:`cuda_gemv_launch`, :mod:`volta_fp8w.cuda.gemv`), needing
    NVRTC and carrying :func:`table_choice` as its fallback (both read the same bytes; the CUDA
    GEMV spends fewer instructions on each); on a V100
    (:data:`~volta_fp8w.limits.MMA_CAPABILITY`) from :data:`MMA_MIN_M` tokens the tensor-core
    GEMM (:func:`mma_launch`), needing NVRTC and carrying :func:`table_choice` as its fallback,
    where its cost (:func:`linear_cost`) at :data:`~volta_core.kernel_api.V100_RATES` is no more
    than the table launch's: a tie (both bound by the same weight bytes) goes to the tensor
    cores, whose arithmetic is further from binding; above the tensor-core table's rows this
    weighs it against dequantize-then-cuBLAS. Elsewhere :func:`table_choice`. Kept per
    (tokens, shape): the launcher asks on every call. Costs are priced with 128 x 128 blocks
    (the scales are under 0.01% of the bytes at any block the checkpoints use)."""
    table = table_choice(m, n, k, capability)
    gemv = cuda_gemv_launch(n, k, capability) if m == 1 else None
    if gemv is not None:
        return Choice(KERNEL_NAMES[CUDA_GEMV], Unit.FMA, gemv, fallback=table)
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
    * The CUDA GEMV: one launch, ``2nk`` FLOPs on the FMA units; split
      (:func:`volta_fp8w.launch.gemv_splits`), the split-K GEMV's sums.
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
    if launch.path in (SPLITK, CUDA_GEMV):
        if launch.path == SPLITK:
            splits = split_count(n, k, launch, device.sm_count, m)[0]
        else:
            splits = gemv_splits(n, k, launch, device.sm_count)[0]
        if splits > 1:
            read += 4 * m * n
            written += 4 * m * n * (splits + 1)
    return KernelCost(name, (LaunchCost(read, written, 2 * rows * n * k, unit),))


# -- the fused experts: choices, what follows from a launch, costs ------------------------------


def moe_unit(launch: MoELaunch, capability: tuple[int, int]) -> Unit:
    """Where an experts' launch runs its products, by :func:`triton_unit`'s rule: the routed
    blocks' ``tl.dot`` tiles on the tensor cores from SM80 on, on the FMA units on SM70
    (triton-lang/triton#5066); the decode GEMVs (one row a program, no dot) on the FMA units."""
    if capability >= (8, 0) and launch.block_m > 1:
        return Unit.TENSOR_CORES
    return Unit.FMA


def moe_decode_choice(tokens: int, capability: tuple[int, int]) -> Choice[MoELaunch] | None:
    """The decode GEMVs for ``tokens`` tokens on ``capability``: the table's ``moe_decode`` up
    to its ``moe_decode_max_m`` tokens; None above, where the routed blocks serve. Depends on
    the batch only, so a captured CUDA graph keeps its launches."""
    table = table_for(capability)
    if tokens > table.moe_decode_max_m:
        return None
    return Choice(MOE_DECODE, moe_unit(table.moe_decode, capability), table.moe_decode)


def moe_blocks_choice(pairs: int, experts: int, capability: tuple[int, int]) -> Choice[MoELaunch]:
    """The routed blocks' tile for ``pairs`` routed (token, expert) rows over ``experts`` local
    experts: the first of the table's ``moe_blocks`` whose ``block_m`` is at least the mean
    routed rows of an expert, the largest where none is. Depends on the batch only (not on the
    routing), so a captured CUDA graph keeps its tile."""
    launches = table_for(capability).moe_blocks
    mean = pairs / max(experts, 1)
    launch = next((la for la in launches if la.block_m >= mean), launches[-1])
    return Choice(MOE_BLOCKS, moe_unit(launch, capability), launch)


def moe_mma_launches(capability: tuple[int, int]) -> tuple[Launch, ...]:
    """The routed experts' tensor-core launches on ``capability``: every row of
    :data:`~volta_fp8w.tables.SM70_MOE_MMA` on a V100, none elsewhere."""
    return tuple(row for _, row in SM70_MOE_MMA) if capability == MMA_CAPABILITY else ()


def moe_mma_launch(pairs: int, experts: int) -> Launch:
    """The routed experts' tensor-core tile for ``pairs`` routed rows over ``experts`` local
    experts: the first row of :data:`~volta_fp8w.tables.SM70_MOE_MMA` whose most rows an
    expert averages holds the mean, the last past them all. Depends on the batch only (not on
    the routing), so a captured CUDA graph keeps its tile."""
    mean = pairs / max(experts, 1)
    return next(row for most, row in SM70_MOE_MMA if most is None or mean <= most)


@functools.lru_cache(maxsize=4096)
def expert_choice(
    tokens: int,
    pairs: int,
    experts: int,
    capability: tuple[int, int],
    shape: tuple[int, int] | None = None,
) -> Choice[ExpertLaunch]:
    """The experts' kernel for ``tokens`` tokens routed to ``pairs`` (token, expert) pairs over
    ``experts`` local experts: the decode GEMVs where they serve (:func:`moe_decode_choice`),
    else the routed blocks (:func:`moe_blocks_choice`). On a V100
    (:data:`~volta_fp8w.limits.MMA_CAPABILITY`), for experts of known ``shape`` (``(hidden,
    inter)``), the routed blocks go to the CUDA tensor-core GEMM (:func:`moe_mma_launch`,
    needing NVRTC and carrying the Triton routed blocks as their fallback) where its cost
    (:func:`expert_launch_cost`) at :data:`~volta_core.kernel_api.V100_RATES` is no more than
    the Triton kernel's: a tie (both bound by the experts' bytes) goes to the tensor cores, as
    :func:`linear_choice`'s. The decode GEMVs are never replaced. Costs are priced with
    :data:`PRICING_BLOCK` scales. The launcher asks once per step of a layer, so answers are
    kept."""
    decode = moe_decode_choice(tokens, capability)
    if decode is not None:
        return Choice(decode.kernel, decode.unit, decode.launch)
    blocks = moe_blocks_choice(pairs, experts, capability)
    triton: Choice[ExpertLaunch] = Choice(blocks.kernel, blocks.unit, blocks.launch)
    if shape is None or capability != MMA_CAPABILITY:
        return triton
    mma: Choice[ExpertLaunch] = Choice(
        MOE_MMA, Unit.TENSOR_CORES, moe_mma_launch(pairs, experts), fallback=triton
    )
    hidden, inter = shape
    top_k = max(1, pairs // max(tokens, 1))
    costs = [
        expert_launch_cost(choice, tokens, hidden, inter, experts, top_k, PRICING_BLOCK)
        for choice in (mma, triton)
    ]
    return mma if costs[0].seconds(V100_RATES) <= costs[1].seconds(V100_RATES) else triton


def moe_tile_k(launch_k: int, block_k: int) -> int:
    """A launch's input tile on scale blocks of ``block_k`` inputs (a multiple of 32): its own,
    halved until it divides the block (32 always does), so one scale serves a tile."""
    tile = launch_k
    while block_k % tile:
        tile //= 2
    return tile


def moe_tiles(launch: MoELaunch) -> tuple[int, ...]:
    """Every input tile :func:`moe_tile_k` can give ``launch`` on some layer."""
    return tuple(tile for tile in TILE_KS if launch.block_k % tile == 0)


def moe_e_pow2(experts: int) -> int:
    """The experts' count as the routed kernels' vectors hold it: the next power of two, at
    least 16."""
    return max(16, 1 << (max(experts, 1) - 1).bit_length())


def route_place_tile(experts: int) -> tuple[int, int]:
    """The routing's placing launch for ``experts`` local experts: ``(E_POW2, pairs a
    program)``, the pairs as many as keep a program's comparisons with every expert within
    :data:`~volta_fp8w.tables.PLACE_ELEMENTS` (16 to 1024)."""
    e_pow2 = moe_e_pow2(experts)
    return e_pow2, max(PLACE_MIN_BLOCK, min(PLACE_MAX_BLOCK, PLACE_ELEMENTS // e_pow2))


def max_blocks(pairs: int, experts: int, block_m: int) -> int:
    """The most blocks of ``block_m`` rows any routing of ``pairs`` pairs over ``experts``
    experts fills: ``sum_e ceil(c_e / block_m) <= pairs // block_m + min(experts, pairs)``."""
    return pairs // block_m + min(experts, pairs)


def expert_bytes(hidden: int, inter: int, block: tuple[int, int] | None) -> tuple[int, int]:
    """One expert's gate/up and down weights as the kernels read them: a byte a weight
    (gate/up ``2 inter x hidden``, down ``hidden x inter``) and four a scale, ``block``'s
    ``(block_n, block_k)`` blocks (gate's and up's rows each in whole blocks, as the loader
    stacks them), or one a row where None (channel and tensor scales)."""

    def scales(n: int, k: int) -> int:
        if block is None:
            return n
        return -(-n // block[0]) * -(-k // block[1])

    return (
        2 * inter * hidden + 4 * 2 * scales(inter, hidden),
        hidden * inter + 4 * scales(hidden, inter),
    )


def touched_experts(tokens: int, experts: int, top_k: int) -> float:
    """How many of ``experts`` a step of ``tokens`` tokens of ``top_k`` experts each touches,
    routed uniformly: ``experts x (1 - (1 - top_k / experts) ** tokens)``, never more than
    ``min(experts, tokens x top_k)``."""
    if experts < 1 or tokens < 1:
        return 0.0
    expected = experts * (1 - (1 - min(top_k, experts) / experts) ** tokens)
    return min(expected, float(min(experts, tokens * top_k)))


def expert_cost(
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    block: tuple[int, int] | None,
    capability: tuple[int, int],
) -> KernelCost:
    """What ``tokens`` tokens cost on fused experts (``experts`` of them, ``top_k`` a token,
    ``hidden`` in and out, ``inter`` intermediate rows; ``block`` the scale blocks, None for
    one scale a row), by the kernel :func:`expert_choice` picks for the layer
    (:func:`expert_launch_cost`)."""
    chosen = expert_choice(tokens, tokens * top_k, experts, capability, (hidden, inter))
    return expert_launch_cost(chosen, tokens, hidden, inter, experts, top_k, block)


def expert_launch_cost(
    chosen: Choice[ExpertLaunch],
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    block: tuple[int, int] | None,
) -> KernelCost:
    """What ``tokens`` tokens cost on ``chosen``'s kernel, launch by launch in order, for fused
    experts as :func:`expert_cost` takes them.

    Weights: those of the experts the step touches (:func:`touched_experts`, at most
    ``min(experts, tokens x top_k)``, :func:`expert_bytes`), each read once; every other tensor
    is counted once too (what HBM serves: a token's row read again for each of its experts
    comes from L2). FLOPs ``2 x pairs x 3 x inter x hidden`` (gate, up and down for every
    routed pair, ``pairs = tokens x top_k``), on the choice's unit.

    * The decode step (three launches): gate/up with the SiLU product reads its weights, the
      fp16 activations (``2 tokens x hidden``) and the router's weights and ids (``8 pairs``)
      and writes fp32 rows (``4 pairs x inter``); down reads those rows, its weights and the
      router's and writes each pair's fp32 outputs (``4 pairs x hidden``); the slot sum reads
      those and writes the fp16 outputs (``2 tokens x hidden``).
    * The routed blocks (three launches): the routing (counting and placing, one launch each,
      priced as one, no arithmetic) reads the ids twice and the ranks once (``12 pairs``),
      writes the ranks (``4 pairs``) and the block slots (filled, then placed: ``8 slots``,
      ``slots`` the most blocks' rows, :func:`max_blocks`); gate/up reads its weights, the
      activations and the slots and router weights, writes fp16 rows (``2 pairs x inter``);
      down reads its weights, those rows, the slots and router weights, zeroes the fp32
      outputs (``4 tokens x hidden``), adds each pair's row into them (``4 pairs x hidden``)
      and casts them to fp16 (reading ``4 tokens x hidden``, writing ``2 tokens x hidden``).
    * The tensor cores over the routed blocks (:data:`MOE_MMA`): the same launches, their
      products padded as its blocks run them: each touched expert's last block half empty on
      average, so ``touched x block_m / 2`` rows more (rounded) in gate/up and in down.
    """
    pairs = tokens * top_k
    touched = touched_experts(tokens, experts, top_k)
    gate_up_bytes, down_bytes = expert_bytes(hidden, inter, block)
    gate_up_w, down_w = round(touched * gate_up_bytes), round(touched * down_bytes)
    x, out = 2 * tokens * hidden, 2 * tokens * hidden
    router = 8 * pairs
    unit = chosen.unit
    if chosen.kernel == MOE_DECODE:
        gate_up_flops, down_flops = 2 * pairs * 2 * inter * hidden, 2 * pairs * hidden * inter
        launches = (
            LaunchCost(gate_up_w + x + router, 4 * pairs * inter, gate_up_flops, unit),
            LaunchCost(down_w + 4 * pairs * inter + router, 4 * pairs * hidden, down_flops, unit),
            LaunchCost(4 * pairs * hidden, out, 0, Unit.FMA),
        )
        return KernelCost(chosen.kernel, launches)
    slots = max_blocks(pairs, experts, chosen.launch.block_m) * chosen.launch.block_m
    rows = pairs
    if chosen.kernel == MOE_MMA:
        rows += round(touched * chosen.launch.block_m / 2)
    gate_up_flops, down_flops = 2 * rows * 2 * inter * hidden, 2 * rows * hidden * inter
    fp32_out = 4 * tokens * hidden
    launches = (
        LaunchCost(12 * pairs, 4 * pairs + 8 * slots, 0, Unit.FMA),
        LaunchCost(gate_up_w + x + 4 * slots + 4 * pairs, 2 * pairs * inter, gate_up_flops, unit),
        LaunchCost(
            down_w + 2 * pairs * inter + 4 * slots + 4 * pairs + fp32_out,
            fp32_out + 4 * pairs * hidden + out,
            down_flops,
            unit,
        ),
    )
    return KernelCost(chosen.kernel, launches)


@dataclass(frozen=True)
class TritonBuild:
    """One Triton kernel build: the kernel's import path, its ``tl.constexpr`` arguments (in
    :mod:`volta_fp8w.launch`'s order), its warps, and the integer arguments that are multiples
    of 16 at every launch of it (:func:`volta_fp8w.launch.aligned_args`; the others may be or
    not, and the JIT builds both); its pipeline stages, and its pointer arguments' types where
    a launch may pass more than one (the router's ids: ``(("ids_ptr", "*i64"), ...)``)."""

    kernel: str
    constexprs: tuple[tuple[str, int | bool], ...]
    num_warps: int
    aligned: tuple[str, ...]
    num_stages: int = 1
    types: tuple[tuple[str, str], ...] = ()

    def options(self) -> dict[str, int | bool]:
        """The keyword arguments a launch of this build passes: its constexprs, warps and
        stages (the experts' launcher launches with them)."""
        return {
            **dict(self.constexprs),
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }


def _build(kernel: str, constexprs: dict[str, int | bool], launch: Launch) -> TritonBuild:
    return TritonBuild(
        kernel,
        tuple(constexprs.items()),
        launch.num_warps,
        aligned_args(launch),
        launch.num_stages,
    )


def triton_builds(capability: tuple[int, int]) -> list[TritonBuild]:
    """Every distinct Triton build the launcher can run with the table of ``capability``:
    each launch of the table that serves some token count, at every input tile
    :func:`volta_fp8w.launch.fitted` gives it on some layer; the GEMV split and not, each
    GEMV and GEMM with and without bias, reading codes as words; the byte-reading form of each
    (layers whose codes are not 4-byte aligned) in its largest variant, split with bias; the
    dequantize kernel where the table has dequantize-then-cuBLAS."""
    t = table_for(capability)
    launches = [t.gemv, t.small]
    if t.dequant_from is None or t.dequant_from > t.small_max_m + 1:
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
                bytewise = splitk_constexprs(launch, True, True, words=False)
                variants.append(_build(SPLITK_KERNEL, bytewise, launch))
            elif launch.path == GEMM:
                variants = [
                    _build(GEMM_KERNEL, gemm_constexprs(launch, bias), launch)
                    for bias in (False, True)
                ]
                variants.append(_build(GEMM_KERNEL, gemm_constexprs(launch, True, False), launch))
            else:
                variants = [_build(DEQUANT_KERNEL, dequant_constexprs(launch), launch)]
            builds.extend(build for build in variants if build not in builds)
    return builds


def tensor_core_builds(capability: tuple[int, int]) -> list[Launch]:
    """The tensor-core GEMM's launches on ``capability``: every row of
    :data:`~volta_fp8w.tables.SM70_MMA` on a V100, none elsewhere."""
    return [launch for _, launch in SM70_MMA] if capability == MMA_CAPABILITY else []


def cuda_gemv_builds(capability: tuple[int, int]) -> list[Launch]:
    """The CUDA GEMV's launches on ``capability``: its table's rows."""
    return [launch for _, launch in table_for(capability).cuda_gemv]


def moe_tensor_core_builds(capability: tuple[int, int]) -> list[tuple[Launch, bool]]:
    """The routed experts' tensor-core builds on ``capability``: each of
    :func:`moe_mma_launches`, gate/up (True) and down (False); none off a V100."""
    launches = moe_mma_launches(capability)
    return [(launch, gate_up) for launch in launches for gate_up in (True, False)]


# -- the fused experts' builds ------------------------------------------------------------------

#: The router's ids as the experts' launcher passes them (vLLM's int32, or int64): the kernels
#: load either, and the JIT builds each.
MOE_ID_TYPES = ("i32", "i64")

#: Scale block rows the gate compiles the experts' weight kernels with: ``QN`` and ``QK`` (a
#: layer's scale block) are ``tl.constexpr``, so each checkpoint's blocks are a build of their
#: own; the gate compiles every input tile at 128 rows a block (the FP8 releases' blocks) and at
#: one (blocks the loader expands to one a row), ``QK`` 128 where the tile is the launch's own,
#: else the tile; channel and tensor scales take :data:`WHOLE_ROW_QK`.
GATE_SCALE_ROWS = (128, 1)

#: ``QK`` of experts whose scales have one column a row (channel and tensor scales): a block
#: longer than any layer's input, so ``k // QK`` is 0 and every such layer, whatever its input
#: length, is one build (one warmup and gate compile), not one per length rounded to 128.
WHOLE_ROW_QK = 1 << 16


def moe_scale_block(block_n: int, block_k: int, k: int) -> tuple[int, int]:
    """The ``(QN, QK)`` the experts' Triton kernels take for scales in blocks of
    ``(block_n, block_k)`` on ``k`` inputs: the blocks, or :data:`WHOLE_ROW_QK` where one
    block spans the input (``ExpertWeights.check`` refuses longer inputs at load)."""
    return (block_n, WHOLE_ROW_QK if block_k >= k else block_k)


def _id_types(ids: str, has_map: bool) -> tuple[tuple[str, str], ...]:
    """The ids' and the map's pointer types: without a map the launcher passes the ids for it
    (never read)."""
    return (("ids_ptr", f"*{ids}"), ("map_ptr", "*i32" if has_map else f"*{ids}"))


def moe_gemv_build(
    launch: MoELaunch,
    scales: tuple[int, int],
    *,
    down: bool,
    has_map: bool,
    mul: bool,
    ids: str = "i32",
) -> TritonBuild:
    """A decode GEMV launch (gate/up, or ``down``) on weights of ``scales``
    (``(block_n, block_k)``): ``mul`` the router weight on the input (gate/up's
    ``MUL_INPUT``) or on the output (down's ``MUL_ROUTER``), ``has_map`` an expert map."""
    qn, qk = scales
    constexprs: dict[str, int | bool] = {
        "QN": qn,
        "QK": qk,
        "HAS_MAP": has_map,
        "MUL_ROUTER" if down else "MUL_INPUT": mul,
        "BLOCK_N": launch.block_n,
        "BLOCK_K": moe_tile_k(launch.block_k, qk),
        "NUM_STAGES": launch.num_stages,
    }
    return TritonBuild(
        MOE_GEMV_DOWN_KERNEL if down else MOE_GEMV_GATE_UP_KERNEL,
        tuple(constexprs.items()),
        launch.num_warps,
        (),
        launch.num_stages,
        _id_types(ids, has_map),
    )


def moe_sum_build() -> TritonBuild:
    """The decode step's slot sum."""
    return TritonBuild(MOE_SUM_KERNEL, (("BLOCK", SUM_BLOCK),), AUX_NUM_WARPS, (), AUX_NUM_STAGES)


def moe_count_build(*, has_map: bool, ids: str = "i32") -> TritonBuild:
    """The routing's counting launch."""
    return TritonBuild(
        MOE_COUNT_KERNEL,
        (("HAS_MAP", has_map), ("BLOCK", COUNT_BLOCK)),
        AUX_NUM_WARPS,
        (),
        AUX_NUM_STAGES,
        _id_types(ids, has_map),
    )


def moe_place_build(block_m: int, experts: int, *, has_map: bool, ids: str = "i32") -> TritonBuild:
    """The routing's placing launch for blocks of ``block_m`` rows over ``experts`` local
    experts (:func:`route_place_tile`)."""
    e_pow2, block = route_place_tile(experts)
    constexprs = {"HAS_MAP": has_map, "BLOCK_M": block_m, "E_POW2": e_pow2, "BLOCK": block}
    return TritonBuild(
        MOE_PLACE_KERNEL,
        tuple(constexprs.items()),
        AUX_NUM_WARPS,
        (),
        AUX_NUM_STAGES,
        _id_types(ids, has_map),
    )


def moe_blocks_build(
    launch: MoELaunch, scales: tuple[int, int], experts: int, *, down: bool, mul: bool
) -> TritonBuild:
    """A routed blocks' grouped GEMM launch (gate/up, or ``down``) over ``experts`` local
    experts, on weights of ``scales``: ``mul`` as :func:`moe_gemv_build`'s."""
    qn, qk = scales
    constexprs: dict[str, int | bool] = {
        "QN": qn,
        "QK": qk,
        "MUL_ROUTER" if down else "MUL_INPUT": mul,
        "BLOCK_M": launch.block_m,
        "BLOCK_N": launch.block_n,
        "BLOCK_K": moe_tile_k(launch.block_k, qk),
        "E_POW2": moe_e_pow2(experts),
    }
    return TritonBuild(
        MOE_DOWN_KERNEL if down else MOE_GATE_UP_KERNEL,
        tuple(constexprs.items()),
        launch.num_warps,
        (),
        launch.num_stages,
    )


def _gate_scales(launch: MoELaunch) -> list[tuple[int, int]]:
    """Every input tile ``launch`` takes, as the scale blocks the gate compiles it with
    (:data:`GATE_SCALE_ROWS`), then one scale column a row (:func:`moe_scale_block`), which
    takes the launch's own tile."""
    return [
        *(
            (rows, 128 if tile == launch.block_k else tile)
            for tile in moe_tiles(launch)
            for rows in GATE_SCALE_ROWS
        ),
        (1, WHOLE_ROW_QK),
    ]


def _expert_counts() -> list[int]:
    """One local expert count per ``E_POW2`` the routed kernels take (16 to
    :data:`~volta_fp8w.limits.MAX_ROUTED_EXPERTS`)."""
    counts = [16]
    while counts[-1] < moe_e_pow2(MAX_ROUTED_EXPERTS):
        counts.append(2 * counts[-1])
    return counts


def moe_builds(capability: tuple[int, int]) -> list[TritonBuild]:
    """Every fused-MoE Triton build the experts' launcher can run with the table of
    ``capability``: the decode GEMVs (gate/up and down, every input tile at
    :data:`GATE_SCALE_ROWS`, either id type, with and without an expert map and the router
    weight) and the slot sum; the routing (counting; placing for each routed blocks' tile and
    every ``E_POW2``, and on a V100 for each tensor-core tile); the
    routed blocks' grouped GEMMs (gate/up and down, each tile's input tiles at
    :data:`GATE_SCALE_ROWS`, with and without the router weight, every ``E_POW2``)."""
    builds = list(_moe_builds(table_for(capability)))
    for launch in moe_mma_launches(capability):
        for experts, ids, has_map in itertools.product(
            _expert_counts(), MOE_ID_TYPES, (False, True)
        ):
            builds.append(moe_place_build(launch.block_m, experts, has_map=has_map, ids=ids))
    return list(dict.fromkeys(builds))


def _moe_builds(table: Table) -> Iterator[TritonBuild]:
    decode = table.moe_decode
    for scales in _gate_scales(decode):
        for ids, has_map, mul in itertools.product(MOE_ID_TYPES, (False, True), (False, True)):
            for down in (False, True):
                yield moe_gemv_build(decode, scales, down=down, has_map=has_map, mul=mul, ids=ids)
    yield moe_sum_build()
    for ids, has_map in itertools.product(MOE_ID_TYPES, (False, True)):
        yield moe_count_build(has_map=has_map, ids=ids)
    for launch in table.moe_blocks:
        for experts, ids, has_map in itertools.product(
            _expert_counts(), MOE_ID_TYPES, (False, True)
        ):
            yield moe_place_build(launch.block_m, experts, has_map=has_map, ids=ids)
    for launch in table.moe_blocks:
        for scales in _gate_scales(launch):
            for mul, experts in itertools.product((False, True), _expert_counts()):
                for down in (False, True):
                    yield moe_blocks_build(launch, scales, experts, down=down, mul=mul)


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
    last = max(SM70_MMA[-1][0], table.small_max_m, table.dequant_from or 0) + 1

    def choose(m: int) -> Choice[Launch]:
        return linear_choice(m, n, k, capability)

    return tuple(stage_ranges(range(1, last + 1), choose, open_ended=True))


def linear_paths(n: int, k: int, capability: tuple[int, int]) -> list[KernelPath]:
    """One :class:`~volta_core.KernelPath` per range of token counts with the same kernels
    (:func:`linear_choice`), for an ``n`` outputs by ``k`` inputs layer: the tensor-core ranges
    need NVRTC, and name the table's launch that serves without it."""
    return kernel_paths(_linear_stages(n, k, capability), token_stage)


#: A fused-MoE layer as the plan prices it: ``(experts, top_k, (hidden, inter))``.
ExpertLayer: TypeAlias = tuple[int, int, tuple[int, int]]


@functools.cache
def _expert_stages(
    capability: tuple[int, int], layer: ExpertLayer | None = None
) -> tuple[tuple[int, int | None, Choice[ExpertLaunch]], ...]:
    """The experts' kernels by token count: the decode GEMVs up to the table's
    ``moe_decode_max_m`` tokens, the routed blocks above. Without the layer the Triton routed
    blocks, whose kernel and unit do not depend on the tile (one pair a token over one expert
    stands for any layer); with it, on a V100, :func:`expert_choice`'s tensor-core choice,
    walked until the experts' blocks take the last row of
    :data:`~volta_fp8w.tables.SM70_MOE_MMA` (past it both kernels' work grows with the
    tokens, the tensor cores' padding a fixed number of rows)."""
    last = table_for(capability).moe_decode_max_m
    if layer is None:
        return tuple(
            stage_ranges(
                range(1, last + 2),
                lambda tokens: expert_choice(tokens, tokens, 1, capability),
                open_ended=True,
            )
        )
    experts, top_k, shape = layer
    rows = max(most or 0 for most, _ in SM70_MOE_MMA)
    last = max(last, -(-rows * experts // top_k))

    def choose(tokens: int) -> Choice[ExpertLaunch]:
        return expert_choice(tokens, tokens * top_k, experts, capability, shape)

    return tuple(stage_ranges(range(1, last + 2), choose, open_ended=True))


def expert_layer(layer: QuantLayer) -> ExpertLayer | None:
    """Fused experts' ``(experts, top_k, (hidden, inter))`` (``input_size`` the hidden size,
    ``output_size`` one expert's intermediate size on the rank), None where the shape, the
    expert count or top-k is not known."""
    if not 0 < layer.top_k <= layer.experts or not (layer.output_size and layer.input_size):
        return None
    return layer.experts, layer.top_k, (layer.input_size, layer.output_size)


def expert_paths(capability: tuple[int, int], layer: ExpertLayer | None = None) -> list[KernelPath]:
    """The fused experts' kernels by token count (:func:`expert_choice`): the decode GEMVs on
    the router's ids, then the routed blocks; on a V100, for a layer of known ``(experts,
    top_k, (hidden, inter))`` (:func:`expert_layer`), on the tensor cores where they cost no
    more (needing NVRTC, the Triton routed blocks their fallback)."""
    return kernel_paths(_expert_stages(capability, layer), token_stage)


def stage_cost(
    layer: QuantLayer, scheme: Fp8Scheme, capability: tuple[int, int], work: Workload
) -> StageCost | None:
    """What ``work`` (``m = work.tokens`` tokens) costs on ``layer`` with ``scheme``: for a
    linear layer (its rank's ``output_size x input_size``) the :func:`linear_paths` stage
    holding ``m``, the cost (:func:`linear_cost`) of the launch :func:`linear_choice` takes there
    and, where it needs NVRTC, of its fallback; for fused experts (``output_size`` one expert's
    intermediate size on the rank, ``input_size`` the hidden size) the :func:`expert_paths`
    stage and the cost (:func:`expert_launch_cost`) of :func:`expert_choice`'s kernel for
    ``layer.experts`` experts, ``layer.top_k`` a token, and, where it needs NVRTC, of its
    fallback. None where the layer's shape, expert count or top-k is not known."""
    m = work.tokens
    n, k = layer.output_size, layer.input_size
    if not (n and k):
        return None
    if layer.kind is LayerKind.FUSED_MOE:
        known = expert_layer(layer)
        if known is None:
            return None
        experts, top_k, shape = known
        stages = _expert_stages(capability, known)
        first, last, _ = stages[stage_of(m, stages)]
        chosen = expert_choice(m, m * top_k, experts, capability, shape)
        cost = expert_launch_cost(chosen, m, k, n, experts, top_k, scheme.block)
        fallback = None
        if chosen.fallback is not None:
            fallback = expert_launch_cost(chosen.fallback, m, k, n, experts, top_k, scheme.block)
        return StageCost(token_stage(first, last), cost, fallback)
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
