"""What follows from a launch (:class:`volta_fp8w.tables.Launch`) for a layer: the input tile
fitted to the layer's scale blocks, the split count, the grids and the ``tl.constexpr``
arguments each kernel compiles with.

Torch- and triton-free: the launcher (:mod:`volta_fp8w.ops`) and the builds the compile gate
checks (:func:`volta_fp8w.dispatch.triton_builds`) both derive a launch's kernel arguments
here, so the gate compiles what runs. Reads :mod:`volta_fp8w.tables`, never the reverse; which
launch a call gets is :mod:`volta_fp8w.dispatch`'s.
"""

from __future__ import annotations

import math
from dataclasses import replace

from volta_fp8w.tables import GEMV_VECTOR, SPLITK, Launch

#: The input tiles a launch may take (:class:`~volta_fp8w.tables.Launch` refuses others).
TILE_KS = (32, 64, 128)

#: Triton's JIT compiles an integer argument that is a multiple of this as one (its
#: divisibility specialization), and only then loads a row's codes 16 bytes at a time.
ALIGNED = 16


def fitted(launch: Launch, block_k: int, row_stride: int) -> Launch:
    """``launch`` with its input tile cut to fit a layer whose scale blocks span ``block_k``
    inputs (a multiple of 32) and whose weight rows are ``row_stride`` bytes apart.

    The tile is ``gcd(launch.block_k, block_k)``, so every tile lies inside one scale block and
    takes one scale per row: a 128-input tile on 32-input blocks becomes a 32-input tile, on
    96-input blocks too, on 192-input blocks a 64-input one. The 1-token GEMV on rows whose
    stride is not a multiple of :data:`ALIGNED` takes 32 inputs: its codes are then loaded byte
    by byte, each with its own address, and a wider tile spills at sm_70.
    """
    tile = math.gcd(launch.block_k, block_k)
    if launch.path == SPLITK and launch.block_m == 1 and row_stride % ALIGNED:
        tile = TILE_KS[0]
    return launch if tile == launch.block_k else replace(launch, block_k=tile)


def fitted_tiles(launch: Launch) -> tuple[int, ...]:
    """Every input tile :func:`fitted` can give ``launch`` on some layer: the tiles of
    :data:`TILE_KS` that divide its own."""
    return tuple(tile for tile in TILE_KS if launch.block_k % tile == 0)


def split_count(n: int, k: int, launch: Launch, sm_count: int, m: int = 1) -> tuple[int, int]:
    """How many input splits the split-K GEMV makes for ``m`` tokens of an ``n x k`` layer,
    and the input length of each (a multiple of ``launch.block_k``, so every split starts on a
    tile): enough programs for ``programs_per_sm`` on each of ``sm_count`` SMs over the
    ``ceil(m / block_m) * ceil(n / block_n)`` output tiles, never a split shorter than one
    tile. ``(splits, per_split)`` with ``splits = ceil(k / per_split)``."""
    tiles = -(-m // launch.block_m) * -(-n // launch.block_n)
    k_tiles = -(-k // launch.block_k)
    want = max(1, -(-(launch.programs_per_sm * sm_count) // max(tiles, 1)))
    per_split = -(-k_tiles // min(want, k_tiles)) * launch.block_k
    return -(-k // per_split), per_split


#: Inputs one warp step of the CUDA GEMV reads of a row: 32 lanes of one 16-byte load each.
GEMV_WARP_INPUTS = 32 * GEMV_VECTOR


def gemv_splits(n: int, k: int, launch: Launch, sm_count: int) -> tuple[int, int]:
    """How many input splits the one-token CUDA GEMV makes of an ``n x k`` layer, and the input
    length of each (a multiple of 16, so every lane's loads stay 16-byte aligned): enough that
    the grid has ``launch.programs_per_sm`` blocks an SM, each split at least one warp step of
    ``launch.loads`` loads. ``(splits, per_split)``, ``splits = ceil(k / per_split)``."""
    blocks = -(-n // launch.block_n)
    steps = max(1, -(-k // (GEMV_WARP_INPUTS * launch.loads)))
    wanted = min(steps, max(1, -(-sm_count * launch.programs_per_sm // blocks)))
    per_split = -(-k // wanted // GEMV_VECTOR) * GEMV_VECTOR if wanted > 1 else k
    return -(-k // per_split), per_split


def splitk_grid(m: int, n: int, launch: Launch, splits: int) -> tuple[int, int, int]:
    """``(row blocks, output blocks, splits)``: row blocks first, so the programs reading one
    weight tile for different rows run side by side and share it in L2."""
    return -(-m // launch.block_m), -(-n // launch.block_n), splits


def gemm_grid(m: int, n: int, launch: Launch) -> tuple[int]:
    """One program per ``[block_m, block_n]`` output tile (the kernel orders them in groups)."""
    return (-(-m // launch.block_m) * -(-n // launch.block_n),)


def dequant_grid(n: int, k: int, launch: Launch) -> tuple[int, int]:
    """One program per ``[block_n, block_k]`` weight tile: ``(output blocks, input blocks)``."""
    return -(-n // launch.block_n), -(-k // launch.block_k)


def aligned_args(launch: Launch) -> tuple[str, ...]:
    """The integer arguments of ``launch``'s kernel that are multiples of :data:`ALIGNED` at
    every launch: a scale block's input length (``SCALE_K``, a multiple of 32) and a split's
    (``K_PER_SPLIT``, whole tiles); for the 1-token GEMV's tiles above 32 inputs, the weights'
    row stride too (:func:`fitted`)."""
    if launch.path != SPLITK:
        return ("SCALE_K",)
    if launch.block_m == 1 and launch.block_k > TILE_KS[0]:
        return ("SCALE_K", "K_PER_SPLIT", "stride_wn")
    return ("SCALE_K", "K_PER_SPLIT")


def splitk_constexprs(
    launch: Launch,
    bias: bool,
    split: bool,
    words: bool = True,
    *,
    dot_k: int | None = None,
    swap_ab: bool = False,
) -> dict[str, int | bool]:
    """The split-K kernel's ``tl.constexpr`` arguments: ``split``, more than one split (summed
    atomically in the launch), ``bias``, a bias added, ``words``, the tile reading its codes as
    int32 words (default: as on a layer's own contiguous codes; the launcher passes False where
    the codes' base, row stride or input count is not a multiple of 4); for more than one
    token, ``dot_k`` inputs a ``tl.dot`` (at most the tile's; default: the launch's own) and
    ``swap_ab``, the weights as the dot's first operand (tiles of 16 tokens or more).

    :raises ValueError: a dot width other than 32, 64 or 128, or ``swap_ab`` on a tile of fewer
        than 16 tokens."""
    dot_k = launch.dot_k if dot_k is None else dot_k
    if dot_k not in TILE_KS:
        raise ValueError(f"a dot of 32, 64 or 128 inputs, got {dot_k}")
    if swap_ab and launch.block_m < 16:
        raise ValueError(
            f"the weights as the dot's first operand need tiles of 16 tokens or more (tl.dot's "
            f"least side): {launch}"
        )
    return {
        "BLOCK_M": launch.block_m,
        "BLOCK_N": launch.block_n,
        "BLOCK_K": launch.block_k,
        "HAS_BIAS": bias,
        "SPLIT": split,
        "WORDS": words,
        "DOT_K": min(dot_k, launch.block_k),
        "SWAP_AB": swap_ab,
    }


def gemm_constexprs(launch: Launch, bias: bool, words: bool = True) -> dict[str, int | bool]:
    """The tiled GEMM's ``tl.constexpr`` arguments (``words`` as :func:`splitk_constexprs`')."""
    return {
        "BLOCK_M": launch.block_m,
        "BLOCK_N": launch.block_n,
        "BLOCK_K": launch.block_k,
        "GROUP_M": launch.group_m,
        "HAS_BIAS": bias,
        "WORDS": words,
    }


def dequant_constexprs(launch: Launch) -> dict[str, int | bool]:
    """The dequantize kernel's ``tl.constexpr`` arguments."""
    return {"BLOCK_N": launch.block_n, "BLOCK_K": launch.block_k}
