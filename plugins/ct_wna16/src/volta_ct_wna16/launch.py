"""What follows from a launch (:class:`volta_ct_wna16.tables.Launch`) for a layer: the split
count, which builds it runs (unmasked, scales per tile, one dot per word slot), the constexprs
(or, for the CUDA tensor-core GEMM, the NVRTC options) it compiles with, and the routing's tile
for a count of experts.

Torch- and triton-free: the launcher (:mod:`volta_ct_wna16.ops`) and the gate configurations
(:mod:`volta_ct_wna16.gate_configs`) both derive a launch's kernel arguments here, so the SM70
gate compiles exactly what runs. Reads :mod:`volta_ct_wna16.tables`, never the reverse; which
launch a call gets is :mod:`volta_ct_wna16.dispatch`'s.
"""

from __future__ import annotations

import functools

from volta_ct_wna16.limits import MAX_ROUTED_EXPERTS
from volta_ct_wna16.tables import (
    MMA_WARP_OUTPUTS,
    MMA_WORD_ROWS,
    MOE,
    MOE_SPLIT_MAX_ROWS,
    ROUTE_PLACE_ELEMENTS,
    SPLITK,
    Launch,
    MoEFused,
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
    Only a swapped tile gains from them
    (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#swap_scales).
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
    """Inputs of one k-tile of the tensor-core GEMM:
    :data:`~volta_ct_wna16.tables.MMA_WORD_ROWS` words."""
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


def pow2_at_least(n: int, least: int) -> int:
    """The smallest power of two that is at least ``n`` and ``least`` (a vector length)."""
    return max(least, 1 << (n - 1).bit_length())


def route_place_tile(experts: int) -> tuple[int, int]:
    """``(E_POW2, BLOCK)`` of the routing's second launch for ``experts`` local experts: the
    counts padded to a power of two (at least 16), and as many pairs per program as keep the
    pairs-by-experts comparisons at :data:`~volta_ct_wna16.tables.ROUTE_PLACE_ELEMENTS`
    (16 to 128)."""
    if not 1 <= experts <= MAX_ROUTED_EXPERTS:
        raise ValueError(
            f"{experts} local experts: the fused routing takes 1 to {MAX_ROUTED_EXPERTS}"
        )
    e_pow2 = max(16, 1 << (experts - 1).bit_length())
    return e_pow2, max(16, min(128, ROUTE_PLACE_ELEMENTS // e_pow2))
