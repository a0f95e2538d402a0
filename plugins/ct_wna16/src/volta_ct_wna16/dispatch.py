"""Which kernel runs a call of this plugin on a device family, every launch it ships there, and
what a launch costs: the one answer the launcher (:mod:`volta_ct_wna16.ops`,
:mod:`volta_ct_wna16.experts`), the compile gates (:mod:`volta_ct_wna16.gate_configs`), the
plan's kernel paths and its estimate (:mod:`volta_ct_wna16.plugin`) all read.

* The launch a call gets, as a :class:`volta_core.kernel_api.Choice`: a linear layer's
  (:func:`linear_choice`: on a V100 the CUDA tensor-core GEMM where its cost is no more than the
  table's, carrying the table's launch as its fallback; else the table's,
  :func:`table_choice`), the experts' decode step (:func:`moe_decode_choice`) and routed
  blocks (:func:`moe_blocks_choice`). Whether the CUDA build loads is the launcher's only
  decision (:func:`volta_ct_wna16.cuda.mma.ready`).
* Every build the plugin ships for a device family (:func:`triton_builds`,
  :func:`tensor_core_builds`): what the compile gates compile, one build record per kernel
  configuration, in the gates' order.
* What a launch costs (:func:`linear_cost`, :func:`expert_cost`), as
  :class:`volta_core.kernel_api.KernelCost` priced at :data:`volta_core.kernel_api.V100_RATES`:
  the tensor-core choice compares these costs, and the plan's estimate reads them
  (:func:`stage_cost`) on the stages of the plan's kernel paths (:func:`linear_paths`,
  :func:`expert_paths`).

Reads the launch data (:mod:`volta_ct_wna16.tables`) and what follows from a launch
(:mod:`volta_ct_wna16.launch`); nothing below it imports it. Torch- and triton-free: the
plugin's hooks import it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from volta_core import KernelPath, LayerKind, QuantLayer
from volta_core.kernel_api import (
    V100_RATES,
    Choice,
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
from volta_ct_wna16.launch import group_tile, mma_k_tile, route_place_tile, unmasked_build
from volta_ct_wna16.limits import MAX_ROUTED_EXPERTS, MMA_CAPABILITY, SUPPORTED_BITS
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import (
    DEQUANT_MATMUL,
    GEMM,
    MAX_SELECT_TOP_K,
    MMA,
    MMA_MAX_M,
    MMA_MIN_M,
    ROUTE_COUNT_BLOCK,
    SILU_BLOCK,
    SM70_MMA,
    SM70_MOE_MMA,
    SPLITK,
    Launch,
    MoEDecode,
    MoEFused,
    Table,
    table_for,
)

#: What each linear launch path is called in a plan.
KERNEL_NAMES = {
    SPLITK: "Triton split-K",
    GEMM: "Triton tiled GEMM",
    DEQUANT_MATMUL: "dequantize, then cuBLAS",
    MMA: "tensor cores (CUDA, mma.m8n8k4)",
}

#: The experts' kernels: the decode step on the router's ids in one launch or two
#: (:mod:`volta_ct_wna16.kernels.moe_decode`), and the routed blocks
#: (:mod:`volta_ct_wna16.kernels.moe`).
MOE_DECODE_ONE = "Triton MoE decode step in one launch on the router's ids"
MOE_DECODE = "Triton MoE decode GEMVs on the router's ids"
MOE_BLOCKS = "Triton grouped GEMM over routed blocks"
MOE_MMA = "tensor cores over routed blocks (CUDA, mma.m8n8k4)"

#: A launch of the experts' kernels: the routed blocks' tile, or a decode row.
ExpertLaunch = Launch | MoEDecode | MoEFused


# -- choices ----------------------------------------------------------------------------------


def triton_unit(launch: Launch, capability: tuple[int, int]) -> Unit:
    """Where a launch of the Triton paths runs its products: dequantize-then-cuBLAS on the
    tensor cores (cuBLAS's); a dot launch (the GEMM kernel, a ``use_dot`` tile) on the tensor
    cores from SM80 on; everything else on the FMA units, every launch of the SM70 family
    (``tl.dot`` runs on them there, triton-lang/triton#5066) and every launch without a dot."""
    if launch.path == DEQUANT_MATMUL:
        return Unit.TENSOR_CORES
    if capability >= (8, 0) and (launch.path == GEMM or launch.use_dot):
        return Unit.TENSOR_CORES
    return Unit.FMA


def table_launch(m: int, n: int, k: int | None, bits: int, capability: tuple[int, int]) -> Launch:
    """The table's launch for ``m`` tokens, ``n`` outputs and ``k`` inputs on ``capability``
    with ``bits``-bit weights.

    One token: the wide tile from ``wide_gemv``'s outputs on, else the short one up to
    ``short_gemv``'s inputs (``k`` None: not known, so not short), else the narrow one. The
    input length also acts through :func:`volta_ct_wna16.launch.split_count` (a long input is
    cut into more splits).
    """
    t = table_for(capability)
    if m <= 1:
        launch = t.gemv
        if t.wide_gemv is not None and n >= t.wide_gemv[0]:
            launch = t.wide_gemv[1]
        elif t.short_gemv is not None and k is not None and k <= t.short_gemv[0]:
            launch = t.short_gemv[1]
    elif m <= 4:
        launch = t.small
    elif m <= t.decode_max_m:
        launch = t.decode
    elif t.dequant_from is not None and m >= t.dequant_from:
        launch = t.dequant
    else:
        launch = t.gemm
    return launch.scaled_for_bits(bits)


def table_choice(
    m: int, n: int, k: int | None, bits: int, capability: tuple[int, int]
) -> Choice[Launch]:
    """:func:`table_launch` as a choice: its path's name and unit (:func:`triton_unit`)."""
    launch = table_launch(m, n, k, bits, capability)
    return Choice(KERNEL_NAMES[launch.path], triton_unit(launch, capability), launch)


def mma_launches(capability: tuple[int, int]) -> tuple[Launch, ...]:
    """The tensor-core GEMM's launches on ``capability``: every row of
    :data:`~volta_ct_wna16.tables.SM70_MMA` on a V100, none elsewhere."""
    return tuple(launch for _, launch in SM70_MMA) if capability == MMA_CAPABILITY else ()


@functools.lru_cache(maxsize=4096)
def linear_choice(
    m: int, n: int, k: int, bits: int, weight_bytes: int, capability: tuple[int, int]
) -> Choice[Launch]:
    """The launch for ``m`` tokens on an ``n x k`` layer of ``bits``-bit weights
    (``weight_bytes`` read): on a V100 (:data:`~volta_ct_wna16.limits.MMA_CAPABILITY`) at
    :data:`~volta_ct_wna16.tables.MMA_MIN_M`-:data:`~volta_ct_wna16.tables.MMA_MAX_M` tokens
    the tensor-core GEMM, needing NVRTC and carrying :func:`table_choice` as its fallback,
    where its cost (:func:`linear_cost`) at :data:`~volta_core.kernel_api.V100_RATES` is no
    more than the table launch's. A tie (both bound by the same bytes, 8-bit weights at 8
    tokens) goes to the tensor cores, whose arithmetic is further from binding. Elsewhere
    :func:`table_choice`. The launcher asks once per call, so answers are kept (a model has a
    handful of layer shapes, and a step's token count repeats)."""
    table = table_choice(m, n, k, bits, capability)
    if capability != MMA_CAPABILITY or not MMA_MIN_M <= m <= MMA_MAX_M:
        return table
    launch = next(row for most, row in SM70_MMA if m <= most)
    mma = linear_cost(m, n, k, launch, bits, weight_bytes, capability)
    triton = linear_cost(m, n, k, table.launch, bits, weight_bytes, capability)
    if mma.seconds(V100_RATES) <= triton.seconds(V100_RATES):
        return Choice(KERNEL_NAMES[MMA], Unit.TENSOR_CORES, launch, fallback=table)
    return table


def moe_blocks_choice(pairs: int, experts: int, capability: tuple[int, int]) -> Choice[Launch]:
    """The routed blocks' tile for ``pairs`` routed (token, expert) rows over ``experts`` local
    experts: the larger tile once the rows average more than the small tile holds per expert.
    Depends on the batch only (not on the routing), so a captured CUDA graph keeps its tile."""
    t = table_for(capability)
    launch = t.moe_large if pairs > t.moe.block_m * experts else t.moe
    return Choice(MOE_BLOCKS, triton_unit(launch, capability), launch)


def moe_decode_choice(
    tokens: int, capability: tuple[int, int]
) -> Choice[MoEDecode | MoEFused] | None:
    """The decode step's launches for ``tokens`` tokens on ``capability`` (GEMVs on the FMA
    units), or None where the routed blocks serve (:func:`moe_blocks_choice`): more tokens
    than the table's last decode row. Depends on the batch only, so a captured CUDA graph
    keeps its launches."""
    row = next((row for most, row in table_for(capability).moe_decode if 1 <= tokens <= most), None)
    if row is None:
        return None
    return Choice(MOE_DECODE_ONE if isinstance(row, MoEFused) else MOE_DECODE, Unit.FMA, row)


@dataclass(frozen=True)
class ExpertShape:
    """One expert's sizes and the layer's weight scheme: what the tensor-core choice prices."""

    hidden: int
    inter: int
    scheme: WeightScheme


def moe_mma_launches(capability: tuple[int, int]) -> tuple[Launch, ...]:
    """The routed experts' tensor-core launches on ``capability``: every row of
    :data:`~volta_ct_wna16.tables.SM70_MOE_MMA` on a V100, none elsewhere."""
    return tuple(row for _, row in SM70_MOE_MMA) if capability == MMA_CAPABILITY else ()


def moe_mma_launch(pairs: int, experts: int) -> Launch:
    """The routed experts' tensor-core tile for ``pairs`` routed rows over ``experts`` local
    experts: the row of :data:`~volta_ct_wna16.tables.SM70_MOE_MMA` for the rows an expert gets
    on average. Depends on the batch only, so a captured CUDA graph keeps its tile."""
    return next(row for most, row in SM70_MOE_MMA if most is None or pairs <= most * experts)


@functools.lru_cache(maxsize=4096)
def expert_choice(
    tokens: int,
    top_k: int,
    experts: int,
    capability: tuple[int, int],
    shape: ExpertShape | None = None,
) -> Choice[ExpertLaunch]:
    """The experts' kernel for ``tokens`` tokens of ``top_k`` experts each over ``experts``:
    the decode step where it serves, else the routed blocks. On a V100, for a layer of known
    ``shape``, the routed blocks go to the tensor cores (:func:`moe_mma_launch`, needing NVRTC
    and carrying the Triton routed blocks as their fallback) where their cost
    (:func:`expert_launch_cost`) at :data:`~volta_core.kernel_api.V100_RATES` is no more than
    the Triton kernel's; a tie (both bound by the experts' bytes) goes to the tensor cores. The
    decode step (the table's decode rows) is never replaced. The launcher asks once per step
    of a layer, so answers are kept, as :func:`linear_choice`'s."""
    decode = moe_decode_choice(tokens, capability)
    if decode is not None:
        return Choice(decode.kernel, decode.unit, decode.launch)
    pairs = tokens * top_k
    blocks = moe_blocks_choice(pairs, experts, capability)
    triton: Choice[ExpertLaunch] = Choice(blocks.kernel, blocks.unit, blocks.launch)
    if shape is None or capability != MMA_CAPABILITY:
        return triton
    mma: Choice[ExpertLaunch] = Choice(
        MOE_MMA, Unit.TENSOR_CORES, moe_mma_launch(pairs, experts), fallback=triton
    )
    costs = [
        expert_launch_cost(tokens, shape, experts, top_k, choice).seconds(V100_RATES)
        for choice in (mma, triton)
    ]
    return mma if costs[0] <= costs[1] else triton


# -- costs ------------------------------------------------------------------------------------


def packed_bytes(n: int, k: int, scheme: WeightScheme) -> int:
    """Bytes the kernels read for an ``n x k`` layer's weights: packed values, fp16 scales and,
    for an asymmetric scheme, fp16 zero points (one per group and output), as
    :meth:`volta_ct_wna16.layout.PackedWeights.nbytes` counts them."""
    groups = -(-k // scheme.group_for(k))
    per_group = 2 if scheme.symmetric else 4
    return n * (-(-k // scheme.pack_factor)) * 4 + groups * n * per_group


def mma_flops(m: int, n: int, k: int, launch: Launch, bits: int) -> int:
    """The floating-point operations the tensor-core GEMM's blocks run, padding included:
    ``2 x rows x cols x inputs`` with the tokens padded to ``block_m``, the outputs to
    ``block_n`` and the inputs to the k-tile (:func:`volta_ct_wna16.launch.mma_k_tile`)."""
    tile = mma_k_tile(bits)
    rows = -(-m // launch.block_m) * launch.block_m
    cols = -(-n // launch.block_n) * launch.block_n
    return 2 * rows * cols * (-(-k // tile) * tile)


def linear_cost(
    m: int,
    n: int,
    k: int,
    launch: Launch,
    bits: int,
    weight_bytes: int,
    capability: tuple[int, int],
) -> KernelCost:
    """What ``launch`` costs at ``m`` tokens on an ``n x k`` layer whose weights take
    ``weight_bytes`` (:func:`packed_bytes`), activations and outputs fp16.

    * The tensor-core GEMM: one launch reading ``weight_bytes + 2mk``, writing ``2mn``, its
      padded product (:func:`mma_flops`) on the tensor cores. Split-K atomics are not counted
      (at most a few percent of the bytes).
    * Dequantize-then-cuBLAS: two launches, one after the other. The dequantization reads
      ``weight_bytes`` and writes ``dequant(W).T`` (``2nk``), no arithmetic counted; cuBLAS
      reads it back with the activations (``2nk + 2mk``), writes ``2mn`` and runs ``2mnk``
      FLOPs on the tensor cores.
    * A Triton launch (split-K, GEMM): one launch reading ``weight_bytes + 2mk``, writing
      ``2mn``, ``2mnk`` FLOPs on :func:`triton_unit`'s unit.

    Each launch's time is the larger of its bytes at the bandwidth and its FLOPs at its unit's
    rate (:meth:`volta_core.kernel_api.LaunchCost.seconds`).
    """
    name = KERNEL_NAMES[launch.path]
    if launch.path == MMA:
        flops = mma_flops(m, n, k, launch, bits)
        return KernelCost(
            name, (LaunchCost(weight_bytes + 2 * m * k, 2 * m * n, flops, Unit.TENSOR_CORES),)
        )
    if launch.path == DEQUANT_MATMUL:
        dense = 2 * n * k
        return KernelCost(
            name,
            (
                LaunchCost(weight_bytes, dense, 0, Unit.FMA),
                LaunchCost(dense + 2 * m * k, 2 * m * n, 2 * m * n * k, Unit.TENSOR_CORES),
            ),
        )
    unit = triton_unit(launch, capability)
    return KernelCost(name, (LaunchCost(weight_bytes + 2 * m * k, 2 * m * n, 2 * m * n * k, unit),))


def expert_cost(
    m: int,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    scheme: WeightScheme,
    capability: tuple[int, int],
) -> KernelCost:
    """What ``m`` tokens cost on fused experts (``experts`` of them, ``top_k`` a token, each
    ``hidden`` in and out and ``inter`` intermediate rows), by the kernel :func:`expert_choice`
    picks for the layer (:func:`expert_launch_cost`)."""
    shape = ExpertShape(hidden, inter, scheme)
    chosen = expert_choice(m, top_k, experts, capability, shape)
    return expert_launch_cost(m, shape, experts, top_k, chosen)


def expert_launch_cost(
    m: int, shape: ExpertShape, experts: int, top_k: int, chosen: Choice[ExpertLaunch]
) -> KernelCost:
    """What ``m`` tokens cost on ``chosen``'s kernel, as one launch on its unit (the FMA units
    for the Triton kernels on SM70):

    * bytes read: the experts some token touches, ``experts x (1 - (1 - top_k / experts) ** m)``
      (rounded), times one expert's packed gate/up (``2 inter x hidden``) and down
      (``hidden x inter``) weights (:func:`packed_bytes`), plus the fp16 activations
      (``2 m hidden``); bytes written: the fp16 output (``2 m hidden``);
    * FLOPs: ``2 x rows x 3 x hidden x inter`` (gate, up and down), ``rows`` the
      ``m x top_k`` routed pairs; on the tensor cores (:data:`MOE_MMA`) padded as its blocks run
      them: each touched expert's last block of ``block_m`` rows half empty on average, so
      ``touched x block_m / 2`` rows more (rounded).
    """
    hidden, inter, scheme = shape.hidden, shape.inter, shape.scheme
    touched = experts * (1 - (1 - top_k / experts) ** m)
    per_expert = packed_bytes(2 * inter, hidden, scheme) + packed_bytes(hidden, inter, scheme)
    rows = m * top_k
    if chosen.kernel == MOE_MMA and isinstance(chosen.launch, Launch):
        rows += round(touched * chosen.launch.block_m / 2)
    launch = LaunchCost(
        round(touched * per_expert) + 2 * m * hidden,
        2 * m * hidden,
        2 * rows * 3 * hidden * inter,
        chosen.unit,
    )
    return KernelCost(chosen.kernel, (launch,))


# -- the plan's kernel paths and the estimate's costs -----------------------------------------


@functools.cache
def _linear_stages(
    n: int, k: int, scheme: WeightScheme, capability: tuple[int, int]
) -> tuple[tuple[int, int | None, Choice[Launch]], ...]:
    """:func:`linear_choice` walked over every token count until it no longer changes, in runs
    of the same kernels (:func:`volta_core.kernel_api.stage_ranges`)."""
    table = table_for(capability)
    # Past every threshold of the tables the choice no longer depends on the token count.
    last = max(MMA_MAX_M, table.decode_max_m, table.dequant_from or 0) + 1
    weight_bytes = packed_bytes(n, k, scheme)

    def choose(m: int) -> Choice[Launch]:
        return linear_choice(m, n, k, scheme.num_bits, weight_bytes, capability)

    return tuple(stage_ranges(range(1, last + 1), choose, open_ended=True))


@functools.cache
def _expert_stages(
    capability: tuple[int, int], layer: tuple[int, int, ExpertShape] | None = None
) -> tuple[tuple[int, int | None, Choice[ExpertLaunch]], ...]:
    """The experts' kernels by token count: the decode step up to the table's last decode row,
    in runs of the same kernels, and the routed blocks above it. Without the layer
    (``(experts, top_k, shape)``) the Triton routed blocks, whose kernel and unit do not depend
    on the tile, so one expert of one slot stands for any layer. With it on a V100 the
    tensor-core choice, walked until the experts' blocks take the last tile
    (:data:`~volta_ct_wna16.tables.SM70_MOE_MMA`); past it the tensor cores' padding is a
    fixed number of rows while both kernels' work grows with the tokens."""
    last = max((most for most, _ in table_for(capability).moe_decode), default=0)
    if layer is None:
        return tuple(
            stage_ranges(
                range(1, last + 2), lambda t: expert_choice(t, 1, 1, capability), open_ended=True
            )
        )
    experts, top_k, shape = layer
    rows = max((most or 0) for most, _ in SM70_MOE_MMA)
    last = max(last, -(-rows * experts // top_k))

    def choose(tokens: int) -> Choice[ExpertLaunch]:
        return expert_choice(tokens, top_k, experts, capability, shape)

    return tuple(stage_ranges(range(1, last + 2), choose, open_ended=True))


def linear_paths(
    n: int, k: int, scheme: WeightScheme, capability: tuple[int, int]
) -> list[KernelPath]:
    """One :class:`~volta_core.KernelPath` per range of token counts with the same kernels
    (:func:`linear_choice`), for an ``n`` outputs by ``k`` inputs layer: the tensor-core
    ranges need NVRTC, and name the table's launch that serves without it."""
    return kernel_paths(_linear_stages(n, k, scheme, capability), token_stage)


def expert_layer(layer: QuantLayer, scheme: WeightScheme) -> tuple[int, int, ExpertShape] | None:
    """Fused experts' ``(experts, top_k, shape)`` (``output_size`` one expert's intermediate
    size on the rank, ``input_size`` the hidden size), None where the expert count or top-k is
    not known."""
    if not 0 < layer.top_k <= layer.experts or not (layer.output_size and layer.input_size):
        return None
    return layer.experts, layer.top_k, ExpertShape(layer.input_size, layer.output_size, scheme)


def expert_paths(
    capability: tuple[int, int], layer: tuple[int, int, ExpertShape] | None = None
) -> list[KernelPath]:
    """The experts' kernels by token count (:func:`expert_choice`): the decode step, one
    launch or two, up to the table's last decode row, the routed blocks above it: on a V100,
    for a layer of known ``(experts, top_k, shape)``, on the tensor cores where their cost
    wins (needing NVRTC, the Triton routed blocks their fallback)."""
    return kernel_paths(_expert_stages(capability, layer), token_stage)


def stage_cost(
    layer: QuantLayer, scheme: WeightScheme, capability: tuple[int, int], work: Workload
) -> StageCost | None:
    """What ``work`` (``m = work.tokens`` tokens) costs on ``layer`` with ``scheme`` on
    ``capability``: for a linear layer (``input_size`` and ``output_size`` the rank's shape)
    the :func:`linear_paths` stage holding ``m``, the cost (:func:`linear_cost`) of the launch
    :func:`linear_choice` takes there and, where it needs NVRTC, of its fallback; for fused
    experts (``output_size`` one expert's intermediate size on the rank) the
    :func:`expert_paths` stage and :func:`expert_cost`. None where the layer's shape, expert
    count or top-k is not known."""
    m = work.tokens
    n, k = layer.output_size, layer.input_size
    if not (n and k):
        return None
    if layer.kind is LayerKind.FUSED_MOE:
        known = expert_layer(layer, scheme)
        if known is None:
            return None
        experts, top_k, shape = known
        stages = _expert_stages(capability, known)
        first, last, _ = stages[stage_of(m, stages)]
        chosen = expert_choice(m, top_k, experts, capability, shape)
        cost = expert_launch_cost(m, shape, experts, top_k, chosen)
        fallback = None
        if chosen.fallback is not None:
            fallback = expert_launch_cost(m, shape, experts, top_k, chosen.fallback)
        return StageCost(token_stage(first, last), cost, fallback)
    if layer.kind is not LayerKind.LINEAR:
        return None
    linear = _linear_stages(n, k, scheme, capability)
    first, last, _ = linear[stage_of(m, linear)]
    bits, weight_bytes = scheme.num_bits, packed_bytes(n, k, scheme)
    chosen = linear_choice(m, n, k, bits, weight_bytes, capability)
    cost = linear_cost(m, n, k, chosen.launch, bits, weight_bytes, capability)
    fallback = None
    if chosen.fallback is not None:
        fallback = linear_cost(m, n, k, chosen.fallback.launch, bits, weight_bytes, capability)
    return StageCost(token_stage(first, last), cost, fallback)


# -- every build the plugin ships -------------------------------------------------------------


@dataclass(frozen=True)
class SplitKBuild:
    """A split-K kernel build: ``zp8`` zero points as uint8 (``Launch.byte_zeros``), ``atomic``
    splits added atomically (``Launch.atomic``), ``whole`` every tile inside the layer
    (:func:`volta_ct_wna16.launch.whole_tiles`)."""

    launch: Launch
    bits: int
    zp: bool
    bias: bool
    use_ws: bool
    group_tile: bool
    zp8: bool = False
    atomic: bool = False
    whole: bool = False


@dataclass(frozen=True)
class GemmBuild:
    """A GEMM kernel build."""

    launch: Launch
    bits: int
    zp: bool
    bias: bool


@dataclass(frozen=True)
class DequantBuild:
    """A dequantize kernel build (the first launch of dequantize-then-cuBLAS)."""

    launch: Launch
    bits: int
    zp: bool


@dataclass(frozen=True)
class MoEBuild:
    """A routed blocks' kernel build: fp16 rows stored, or (``atomic``) fp32 tiles added into
    zeroed rows, times the router weights with ``mul_router``."""

    launch: Launch
    bits: int
    zp: bool
    mul_router: bool
    group_tile: bool
    atomic: bool


@dataclass(frozen=True)
class DecodeBuild:
    """A decode GEMV build, gate/up or ``down``: with or without an expert map, the router
    weight on the input (gate/up) or output (down) with ``mul``."""

    launch: Launch
    bits: int
    zp: bool
    has_map: bool
    mul: bool
    down: bool


@dataclass(frozen=True)
class FusedBuild:
    """A one-launch decode step build: with or without an expert map, the router weight on
    the input (``mul``) or the output, every tile inside the layer (``whole``) or masked."""

    fused: MoEFused
    bits: int
    zp: bool
    has_map: bool
    mul: bool
    whole: bool


@dataclass(frozen=True)
class RouteCountBuild:
    """The routing's first launch, on ``ids`` (``"i32"`` or ``"i64"``) router ids."""

    ids: str
    has_map: bool
    block: int = ROUTE_COUNT_BLOCK


@dataclass(frozen=True)
class RoutePlaceBuild:
    """The routing's second launch for blocks of ``block_m`` rows
    (:func:`volta_ct_wna16.launch.route_place_tile`)."""

    block_m: int
    e_pow2: int
    block: int


@dataclass(frozen=True)
class SiluBuild:
    """The SiLU product on ``gate_up`` rows (``"fp16"`` or ``"fp32"``)."""

    gate_up: str
    block: int = SILU_BLOCK


@dataclass(frozen=True)
class TopKBuild:
    """The router's top-k for ``e_pow2`` experts' ``logits`` (``"fp16"``, ``"bf16"``,
    ``"fp32"``)."""

    e_pow2: int
    logits: str
    top_k_pow2: int = MAX_SELECT_TOP_K


@dataclass(frozen=True)
class MmaBuild:
    """A tensor-core GEMM build (NVRTC options); bias and splits are launch arguments."""

    launch: Launch
    bits: int
    zp: bool


@dataclass(frozen=True)
class MoeMmaBuild:
    """A routed experts' tensor-core GEMM build (NVRTC options, those of the dense GEMM's
    :class:`MmaBuild`); the output kind and router weights are launch arguments."""

    launch: Launch
    bits: int
    zp: bool


#: One Triton kernel build the plugin ships.
Build = (
    SplitKBuild
    | GemmBuild
    | DequantBuild
    | MoEBuild
    | DecodeBuild
    | FusedBuild
    | RouteCountBuild
    | RoutePlaceBuild
    | SiluBuild
    | TopKBuild
)

#: ``(mul_router, atomic)`` of every launch a routed-blocks step makes with any tile: gate/up
#: stores fp16 rows, or adds fp32 partials when split; down adds each pair's fp32 tile into
#: its token's row, times the router weight or not (vLLM's ``apply_router_weight_on_input``
#: applies it to the input instead).
MOE_OUTPUTS = ((False, False), (False, True), (True, True))


def _linear_launches(table: Table) -> list[Launch]:
    """The table's compile-distinct linear launches (``programs_per_sm`` sizes the grid only,
    so two launches that differ in it alone are one kernel build)."""
    seen: list[Launch] = []
    for launch in (
        table.gemv,
        table.wide_gemv[1] if table.wide_gemv else None,
        table.short_gemv[1] if table.short_gemv else None,
        table.small,
        table.decode,
        table.gemm,
        table.dequant,
    ):
        if launch is None:
            continue
        if launch.path == GEMM and table.dequant_from is not None and table.dequant_from <= 17:
            continue
        if launch.path == DEQUANT_MATMUL and table.dequant_from is None:
            continue
        build = replace(launch, programs_per_sm=1)
        if build not in seen:
            seen.append(build)
    return seen


def _linear_builds(table: Table) -> Iterator[Build]:
    for base in _linear_launches(table):
        for bits in SUPPORTED_BITS:
            launch = base.scaled_for_bits(bits)
            for zp in (False, True):
                if launch.path == SPLITK:
                    # Split (fused reduction) or unsplit, each with and without bias; the dot
                    # tiles also with scales per tile (a layer whose groups hold whole tiles).
                    group_tiles = (False, True) if launch.use_dot else (False,)
                    # Zero points as uint8 where the launch takes them from a layer's
                    # ``zeros8``, and as fp16 where it has none (a bare ``PackedWeights``).
                    zp8s = (False, True) if zp and launch.byte_zeros else (False,)
                    # Masked, and unmasked where the launch has that build (whole tiles).
                    wholes = (False, True) if unmasked_build(launch, bits) else (False,)
                    for use_ws, bias, in_group, zp8, whole in itertools.product(
                        (True, False), (True, False), group_tiles, zp8s, wholes
                    ):
                        yield SplitKBuild(
                            launch, bits, zp, bias, use_ws, in_group, zp8, False, whole
                        )
                        if use_ws and launch.atomic:
                            yield SplitKBuild(
                                launch, bits, zp, bias, use_ws, in_group, zp8, True, whole
                            )
                elif launch.path == GEMM:
                    for bias in (False, True):
                        yield GemmBuild(launch, bits, zp, bias)
                else:
                    yield DequantBuild(launch, bits, zp)


def _moe_builds(table: Table) -> Iterator[Build]:
    """4 and 8 bits, both symmetries, scales per word row and (where the tile can take them,
    :func:`~volta_ct_wna16.launch.group_tile`) per tile, every output kind."""
    for launch in (table.moe, table.moe_large):
        tiles = (False, True) if group_tile(launch, launch.block_k) else (False,)
        for bits, zp, gt in itertools.product(SUPPORTED_BITS, (False, True), tiles):
            for mul_router, atomic in MOE_OUTPUTS:
                yield MoEBuild(launch, bits, zp, mul_router, gt, atomic)


def _routing_builds(table: Table) -> Iterator[Build]:
    """The routing's two launches (every expert count's tile, for each routed-blocks tile) and
    the SiLU product between the routed blocks' launches."""
    for ids, has_map in itertools.product(("i32", "i64"), (False, True)):
        yield RouteCountBuild(ids, has_map)
    experts = 1
    while experts <= MAX_ROUTED_EXPERTS:
        e_pow2, block = route_place_tile(experts)
        for block_m in sorted({table.moe.block_m, table.moe_large.block_m}):
            yield RoutePlaceBuild(block_m, e_pow2, block)
        experts = e_pow2 + 1
    for gate_up in ("fp16", "fp32"):
        yield SiluBuild(gate_up)


def decode_builds(
    launches: MoEDecode | MoEFused, bits: int, zp: bool, has_map: bool, mul: bool
) -> list[DecodeBuild | FusedBuild]:
    """The builds of one decode row: its one launch (every tile inside the layer, and
    masked), or gate/up and down."""
    if isinstance(launches, MoEFused):
        return [FusedBuild(launches, bits, zp, has_map, mul, whole) for whole in (True, False)]
    return [
        DecodeBuild(launches.gate_up, bits, zp, has_map, mul, down=False),
        DecodeBuild(launches.down, bits, zp, has_map, mul, down=True),
    ]


def _decode_builds(table: Table) -> Iterator[Build]:
    """Each decode row's kernels for 4 and 8 bits, both symmetries, with and without an
    expert map and router weights (each kernel's variants together); the router's top-k for
    every expert count's vector and logit dtype."""
    seen: set[Build] = set()
    for _, launches in table.moe_decode:
        per_variant = [
            decode_builds(launches, *variant)
            for variant in itertools.product(
                SUPPORTED_BITS, (False, True), (False, True), (False, True)
            )
        ]
        for build in itertools.chain.from_iterable(zip(*per_variant, strict=True)):
            if build not in seen:
                seen.add(build)
                yield build
    e_pow2 = 16
    while e_pow2 <= MAX_ROUTED_EXPERTS:
        for logits in ("fp16", "bf16", "fp32"):
            yield TopKBuild(e_pow2, logits)
        e_pow2 *= 2


def triton_builds(capability: tuple[int, int]) -> list[Build]:
    """Every Triton kernel build the launcher can run on ``capability``: the linear layers'
    launches of its family's table, the routed blocks', the routing's and the SiLU
    product's, the decode step's and the router's top-k, in the compile gates' order."""
    table = table_for(capability)
    return [
        *_linear_builds(table),
        *_moe_builds(table),
        *_routing_builds(table),
        *_decode_builds(table),
    ]


def tensor_core_builds(capability: tuple[int, int]) -> list[MmaBuild]:
    """Every build of the tensor-core GEMM the launcher can run on ``capability``: each of
    :func:`mma_launches` for 4 and 8 bits, symmetric and asymmetric (none off a V100)."""
    return [
        MmaBuild(launch, bits, zp)
        for launch in mma_launches(capability)
        for bits in SUPPORTED_BITS
        for zp in (False, True)
    ]


def moe_tensor_core_builds(capability: tuple[int, int]) -> list[MoeMmaBuild]:
    """Every build of the routed experts' tensor-core GEMM the launcher can run on
    ``capability``: each of :func:`moe_mma_launches` for 4 and 8 bits, symmetric and
    asymmetric (none off a V100)."""
    return [
        MoeMmaBuild(launch, bits, zp)
        for launch in moe_mma_launches(capability)
        for bits in SUPPORTED_BITS
        for zp in (False, True)
    ]
