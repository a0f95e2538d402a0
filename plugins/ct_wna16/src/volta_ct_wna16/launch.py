"""One launch choice (:class:`Launch`) and what follows from it for a layer: the split count,
which builds it runs (unmasked, scales per tile, one dot per word slot) and the constexprs (or,
for the CUDA tensor-core GEMM, the NVRTC options) it compiles with.

Torch- and triton-free: the launcher (:mod:`volta_ct_wna16.ops`) and the gate configurations
(:mod:`volta_ct_wna16.gate_configs`) both derive a launch's kernel arguments here, so the SM70
gate compiles exactly what runs. Which launch a call gets is :mod:`volta_ct_wna16.tables`'.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

#: The launch paths: the split-K kernel, the GEMM kernel, dequantize then cuBLAS, fused MoE, and
#: the CUDA GEMM on Volta's tensor cores (:mod:`volta_ct_wna16.cuda`).
SPLITK = "splitk"
GEMM = "gemm"
DEQUANT_MATMUL = "dequant_matmul"
MOE = "moe"
MMA = "mma"

#: Word rows of one k-tile of the tensor-core GEMM (32 inputs of 4 bits, 16 of 8,
#: ``wna16_mma.cu``), and the input step its splits are counted in: a multiple of both tiles,
#: so every split starts at a tile, and a divisor of every group size, so a tile never crosses
#: a group.
MMA_WORD_ROWS = 4
MMA_BLOCK_K = 32

#: Rows of one ``mma.m8n8k4`` product and outputs one warp covers per word it loads (four quad
#: pairs of 8, PTX ISA "Matrix Fragments for mma.m8n8k4").
MMA_ROWS = 8
MMA_WARP_OUTPUTS = 32

#: Fused-MoE tiles of at most this many rows (decode's) may split the input.
MOE_SPLIT_MAX_ROWS = 16


@dataclass(frozen=True)
class Launch:
    """One launch choice: the path, its tile, and how many programs split-K aims for per SM.

    ``block_k`` counts input elements (packed words times the pack factor). ``num_stages`` is
    the software pipeline depth of the input loop (Triton pipelines on SM80+ only, so the SM70
    tables keep 1); the split-K loop asks for it explicitly (``tl.range``), because Triton
    does not pipeline a loop without a dot on its own. ``reduce_unroll`` is how many split
    partials the fused split-K reduction loads per round trip to L2. ``byte_zeros``: a 1-token
    GEMV that reads asymmetric layers' zero points as uint8 (``PackedWeights.zeros8``) where
    the layer has them: the GEMV loads them where it uses them, one per output and group, so
    their bytes count as the weights' do; the dot tiles copy fp16 rows ahead instead (a 1-byte
    row is below what ``cp.async`` copies).
    ``atomic``: a split-K launch whose splits add their partials atomically into one fp32 tile
    (the kernel's ``ATOMIC``, :func:`volta_ct_wna16.kernels.epilogue.accumulate_splits`)
    instead of summing them through the reduction tree.
    ``unmasked``: the launch also has a build without input and output masks, which it runs
    where every tile lies inside the layer (:func:`whole_tiles`).
    ``split_cost``: where set, the split count is the one the SMs finish soonest by
    :func:`balanced_splits`, which counts a program's fixed cost as this many input steps and
    takes ``programs_per_sm`` as the programs an SM runs at once; where None,
    :func:`split_count` aims at ``programs_per_sm`` programs per SM.
    ``swap``: a fused-MoE dot tile of more than :data:`MOE_SPLIT_MAX_ROWS` rows (one that
    never splits the input) computed transposed, the dequantized weights as the dot's first
    operand (the kernel's ``SWAP``, :func:`volta_ct_wna16.kernels.moe.wna16_moe_kernel`); it
    dequantizes into input order for one dot (no :func:`slot_dots`) and loads scales per word
    row (no :func:`group_tile`).

    The tensor-core GEMM (``MMA``): ``block_m`` tokens (a multiple of 8) by ``block_n``
    outputs (``num_warps`` warps of 32 outputs per word a lane loads, :func:`mma_words`) per
    block, splits of ``block_k`` (:data:`MMA_BLOCK_K`) input steps, balanced by
    ``split_cost``.
    """

    path: str
    block_m: int = 1
    block_n: int = 32
    block_k: int = 256
    use_dot: bool = False
    num_warps: int = 4
    programs_per_sm: int = 4
    group_m: int = 8
    num_stages: int = 1
    reduce_unroll: int = 2
    byte_zeros: bool = False
    atomic: bool = False
    unmasked: bool = False
    split_cost: float | None = None
    swap: bool = False

    def __post_init__(self) -> None:
        if self.byte_zeros and not (self.path == SPLITK and self.block_m == 1 and not self.use_dot):
            raise ValueError(f"only a 1-token GEMV reads uint8 zero points: {self}")
        if self.atomic and self.path != SPLITK:
            raise ValueError(f"only a split-K launch adds its splits atomically: {self}")
        if self.unmasked and self.path != SPLITK:
            raise ValueError(f"only a split-K launch has an unmasked build: {self}")
        if self.swap and not (
            self.path == MOE and self.use_dot and self.block_m > MOE_SPLIT_MAX_ROWS
        ):
            raise ValueError(
                f"only a fused-MoE dot tile of more than {MOE_SPLIT_MAX_ROWS} rows swaps: {self}"
            )
        if self.split_cost is not None and (self.path not in (SPLITK, MMA) or self.split_cost < 0):
            raise ValueError(
                f"split_cost is a split-K or tensor-core launch's cost in steps, >= 0: {self}"
            )
        if self.path == MMA and (
            self.block_m % MMA_ROWS
            or self.block_k != MMA_BLOCK_K
            or self.block_n % (MMA_WARP_OUTPUTS * self.num_warps)
            or self.split_cost is None
        ):
            raise ValueError(
                f"a tensor-core launch has rows a multiple of {MMA_ROWS}, {MMA_BLOCK_K} input "
                f"steps, {MMA_WARP_OUTPUTS} outputs per warp and word, and a split cost: {self}"
            )

    def scaled_for_bits(self, bits: int) -> Launch:
        """The multi-token FMA tiles in packed words: 8-bit weights get half the elements.

        The 1-token GEMV works in 32-element sub-tiles whatever the width, and dequantized-tile
        paths (``tl.dot``, GEMM, dequantize) keep their element tile.
        """
        if bits == 4 or self.path != SPLITK or self.use_dot or self.block_m == 1:
            return self
        return replace(self, block_k=self.block_k // 2)


@dataclass(frozen=True)
class MoEFused:
    """The fused-MoE decode step in one launch
    (:func:`volta_ct_wna16.kernels.moe_decode.moe_decode_fused_kernel`): a program per (pair,
    ``block_j`` intermediate rows), gate/up over the whole input in ``block_k``-input steps
    pipelined ``num_stages`` deep, down ``block_n`` outputs at a time (pipelined a tile ahead),
    on ``num_warps`` warps; the programs' partial outputs added atomically in fp32."""

    block_j: int = 32
    block_k: int = 256
    block_n: int = 1024
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        sizes = (self.block_j, self.block_k, self.block_n)
        if any(size < 32 or size & (size - 1) for size in sizes) or self.num_stages < 1:
            raise ValueError(
                f"a one-launch decode's rows, input step and outputs are powers of two of at "
                f"least 32 (whole GEMV sub-tiles), and it has a pipeline stage: {self}"
            )


def slot_dots(launch: Launch, bits: int) -> bool:
    """Whether ``launch`` runs the dot tile with one ``tl.dot`` per word slot (16 or more words
    per slot; the kernel's ``SLOT_DOTS``), which reads activations two slots at a time as
    32-bit words, so its activation rows must start 4-byte aligned
    (:func:`volta_ct_wna16.ops.wna16_linear` pads them where they do not). A swapped tile
    (``Launch.swap``) has no slot dots."""
    return (
        launch.path in (SPLITK, MOE)
        and launch.use_dot
        and not launch.swap
        and launch.block_k // (32 // bits) >= 16
    )


def split_count(n: int, k: int, launch: Launch, sm_count: int, m: int = 1) -> tuple[int, int]:
    """How many input splits, and the input length of each (a multiple of ``block_k``), for
    ``m`` tokens.

    With ``launch.split_cost``, the count :func:`balanced_splits` finds for the launch's
    ``[m, n]`` output tiles. Otherwise enough programs to keep every SM busy with
    ``programs_per_sm`` of them (output columns only), but never a split shorter than one
    tile.
    """
    n_blocks = -(-n // launch.block_n)
    k_blocks = -(-k // launch.block_k)
    if launch.split_cost is not None:
        tiles = n_blocks * -(-m // launch.block_m)
        resident = launch.programs_per_sm
        steps = balanced_splits(tiles, k_blocks, resident, launch.split_cost, sm_count)
    else:
        want = max(1, -(-(launch.programs_per_sm * sm_count) // n_blocks))
        steps = -(-k_blocks // min(want, k_blocks))
    per_split = steps * launch.block_k
    return -(-k // per_split), per_split


@functools.cache
def balanced_splits(tiles: int, k_blocks: int, resident: int, cost: float, sm_count: int) -> int:
    """The input steps per split that let the SMs finish ``tiles`` output tiles soonest.

    Cutting each tile's ``k_blocks`` steps into ``s`` splits makes ``tiles * s`` programs of
    ``ceil(k_blocks / s)`` steps. An SM runs about ``ceil(programs / sm_count)`` of them,
    ``resident`` at a time, each paying a fixed cost of ``cost`` steps (its start, and the
    atomic sum after its last step), and one with fewer than ``resident`` programs gains
    nothing from it (a lone program waits on its own loads). So the time is taken as
    ``max(ceil(programs / sm_count), resident) * (steps + cost)``; ties go to fewer splits.
    The model ranks split counts as a sweep of every count on the H100 did, and its answers are
    cached because the search walks every step count
    (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#split_counts).
    """
    if min(tiles, k_blocks, resident, sm_count) < 1:
        raise ValueError(
            f"balanced_splits needs at least one tile, input step, resident program and SM, "
            f"got tiles={tiles}, k_blocks={k_blocks}, resident={resident}, sm_count={sm_count}"
        )
    best = (float("inf"), 0)
    for steps in range(1, k_blocks + 1):
        splits = -(-k_blocks // steps)
        if -(-k_blocks // splits) != steps:
            continue  # the same splits as fewer steps each
        time = max(-(-tiles * splits // sm_count), resident) * (steps + cost)
        if time < best[0] or (time == best[0] and steps > best[1]):
            best = (time, steps)
    return best[1]


def unmasked_build(launch: Launch, bits: int) -> bool:
    """Whether ``launch`` has a build without input and output masks (the split-K kernel's
    ``WHOLE``): an ``unmasked`` launch of the 1-token GEMV, an FMA tile or a slot-dot tile;
    the interleaved dot tile (:func:`slot_dots` false) keeps its masks. The SM70 tables have
    none: not measured on a V100, and the 8-bit GEMV's unspecialized unmasked build spilled
    at sm_70 (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run16)."""
    return (
        launch.unmasked
        and launch.path == SPLITK
        and (not launch.use_dot or slot_dots(launch, bits))
    )


def whole_tiles(n: int, k: int, launch: Launch, bits: int) -> bool:
    """Whether ``launch`` runs its unmasked build on an ``n x k`` layer (the kernel's
    ``WHOLE``): it has one (:func:`unmasked_build`) and every tile lies inside the layer, the
    outputs a multiple of ``block_n`` and the inputs of ``block_k``. Splits start at multiples
    of ``block_k`` (:func:`split_count`), so each split's tiles are then whole too. Model
    layers are (every benchmark shape); a layer that is not runs masked."""
    return unmasked_build(launch, bits) and n % launch.block_n == 0 and k % launch.block_k == 0


def group_tile(launch: Launch, group: int) -> bool:
    """Whether every ``block_k`` tile of a layer with ``group`` inputs per scale lies inside one
    group, so a dot tile loads one row of scales and zero points instead of one per word row.

    Splits start at multiples of ``block_k`` (:func:`split_count`), so tiles are aligned.
    Only the dot paths use it: the 1-token GEMV already loads scales once per 32 inputs.
    A swapped tile (``Launch.swap``) loads them per word row whatever the group: one row per
    tile (``[BLOCK_N]`` fp16, 2 bytes a thread, below the 4 that ``cp.async`` copies) is a
    plain load waited for in every input step, while the ``[BLOCK_K / pack, BLOCK_N]`` tile of
    rows is copied ahead with the words by the software pipeline (Triton 3.6's sm_90 TTGIR).
    On the H100 the swapped 64x128x64 tile took 597 us with scales per word row against 623 per tile
    on the Qwen3.5 layer at 2048 tokens, 725 against 751 on Qwen3-30B's; the unswapped tile
    took 1032 us with them against 688 per tile on the first, so only a swapped tile takes
    them (docs/perf/ct_wna16/moe_prefill/call1).
    """
    return (
        launch.path in (SPLITK, MOE)
        and launch.use_dot
        and not launch.swap
        and group % launch.block_k == 0
    )


def moe_splits(launch: Launch) -> bool:
    """Whether ``launch`` may split the input: a decode tile, whose step routes few blocks."""
    return launch.block_m <= MOE_SPLIT_MAX_ROWS


def splitk_constexprs(
    launch: Launch,
    bits: int,
    zp: bool,
    bias: bool,
    use_ws: bool,
    group_tile: bool,
    atomic: bool = False,
    whole: bool = False,
) -> dict[str, int | bool]:
    """The ``tl.constexpr`` arguments of the split-K kernel for one launch: the launcher and the
    gate both build them here, so the gate compiles what runs."""
    return {
        "BITS": bits,
        "HAS_ZP": zp,
        "HAS_BIAS": bias,
        "USE_WS": use_ws,
        "USE_DOT": launch.use_dot,
        "BLOCK_M": launch.block_m,
        "BLOCK_N": launch.block_n,
        "BLOCK_K": launch.block_k,
        "NUM_STAGES": launch.num_stages,
        "REDUCE_UNROLL": launch.reduce_unroll,
        "GROUP_TILE": group_tile,
        "SLOT_DOTS": slot_dots(launch, bits),
        "ATOMIC": use_ws and atomic,
        "WHOLE": whole,
    }


def gemm_constexprs(launch: Launch, bits: int, zp: bool, bias: bool) -> dict[str, int | bool]:
    """The ``tl.constexpr`` arguments of the GEMM kernel (launcher and gate)."""
    return {
        "BITS": bits,
        "HAS_ZP": zp,
        "HAS_BIAS": bias,
        "BLOCK_M": launch.block_m,
        "BLOCK_N": launch.block_n,
        "BLOCK_K": launch.block_k,
        "GROUP_M": launch.group_m,
    }


def dequant_constexprs(launch: Launch, bits: int, zp: bool) -> dict[str, int | bool]:
    """The ``tl.constexpr`` arguments of the dequantize kernel (launcher and gate)."""
    return {"BITS": bits, "HAS_ZP": zp, "BLOCK_N": launch.block_n, "BLOCK_K": launch.block_k}


def mma_words(launch: Launch) -> int:
    """Words a lane of the tensor-core GEMM loads per word row (its outputs 32 apart)."""
    return launch.block_n // (MMA_WARP_OUTPUTS * launch.num_warps)


def mma_k_tile(bits: int) -> int:
    """Inputs of one k-tile of the tensor-core GEMM: :data:`MMA_WORD_ROWS` words."""
    return MMA_WORD_ROWS * (32 // bits)


def mma_options(launch: Launch, bits: int, zp: bool) -> tuple[str, ...]:
    """The NVRTC options of the tensor-core GEMM for one launch (``wna16_mma.cu``'s macros):
    the launcher and the gate both build them here."""
    return (
        f"-DBITS={bits}",
        f"-DHAS_ZP={int(zp)}",
        f"-DBM={launch.block_m}",
        f"-DWARPS={launch.num_warps}",
        f"-DJ={mma_words(launch)}",
    )


def moe_constexprs(
    launch: Launch, bits: int, zp: bool, mul_router: bool, group_tile: bool, atomic: bool
) -> dict[str, int | bool]:
    """The ``tl.constexpr`` arguments of the fused-MoE kernel (launcher and gate)."""
    return {
        "BITS": bits,
        "HAS_ZP": zp,
        "MUL_ROUTER": mul_router,
        "BLOCK_M": launch.block_m,
        "BLOCK_N": launch.block_n,
        "BLOCK_K": launch.block_k,
        "GROUP_TILE": group_tile,
        "SLOT_DOTS": slot_dots(launch, bits),
        "ATOMIC": atomic,
        "SWAP": launch.swap,
    }


def moe_decode_constexprs(
    launch: Launch, bits: int, zp: bool, has_map: bool, mul: bool, down: bool
) -> dict[str, int | bool]:
    """The ``tl.constexpr`` arguments of a fused-MoE decode kernel (launcher and gate): gate/up
    (``mul``: the router weight on the input) or down (``mul``: on the output), whose splits
    are summed by a tree of fan-in ``reduce_unroll``."""
    return {
        "BITS": bits,
        "HAS_ZP": zp,
        "HAS_MAP": has_map,
        "MUL_ROUTER" if down else "MUL_INPUT": mul,
        "BLOCK_N": launch.block_n,
        "BLOCK_K": launch.block_k,
        "NUM_STAGES": launch.num_stages,
        "FAN_IN": launch.reduce_unroll,
    }


def fused_whole(fused: MoEFused, hidden: int, inter: int) -> bool:
    """Whether every tile of ``fused`` lies inside a ``hidden``/``inter`` MoE layer (the
    kernel's ``WHOLE``: no load masked), as every benchmark shape's does."""
    return (
        hidden % fused.block_k == 0 and hidden % fused.block_n == 0 and inter % fused.block_j == 0
    )


def moe_fused_constexprs(
    fused: MoEFused,
    bits: int,
    zp: bool,
    has_map: bool,
    mul: bool,
    groups: tuple[int, int],
    whole: bool,
) -> dict[str, int | bool]:
    """The ``tl.constexpr`` arguments of the one-launch decode step (launcher and gate):
    ``mul``, the router weight on the input rather than the output; ``groups`` gate/up's and
    down's group sizes; ``whole`` from :func:`fused_whole`."""
    return {
        "GROUP13": groups[0],
        "GROUP2": groups[1],
        "WHOLE": whole,
        "BITS": bits,
        "HAS_ZP": zp,
        "HAS_MAP": has_map,
        "MUL_INPUT": mul,
        "BLOCK_J": fused.block_j,
        "BLOCK_K": fused.block_k,
        "BLOCK_N": fused.block_n,
        "NUM_STAGES": fused.num_stages,
    }
