"""What follows from one CUDA launch: for the dense GEMM (``fp8_mma.cu``) its output groups per
warp, its NVRTC options, its grid and split count for a layer, and the SM70 gate's configuration
of its build; for the routed experts' GEMM (``fp8_moe_mma.cu``) its groups, columns, options and
gate configuration, gate/up and down; for the one-token GEMV (``fp8_gemv.cu``) its rows a warp,
options, grid and gate configuration.

The launcher (:mod:`.mma`) and the compile gate both derive a launch's build here, so the gate
compiles what runs. Torch-free: reads :mod:`volta_fp8w.tables` and the kernel source.
"""

from __future__ import annotations

import functools

from volta_core import CudaKernelConfig
from volta_core.kernel_api import with_prelude
from volta_fp8w.cuda import GEMV_KERNEL, GEMV_SOURCE, KERNEL, MOE_KERNEL, MOE_SOURCE, SOURCE
from volta_fp8w.tables import CUDA_GEMV, MMA, MMA_ROWS, Launch

#: Outputs one warp covers per group: its four quad pairs of 8 (PTX ISA, "Matrix Fragments for
#: mma.m8n8k4"), a lane one row of the weights.
MMA_WARP_OUTPUTS = 32

#: The k-tiles ``fp8_mma.cu`` builds (``BK``): whole 16-byte loads of a lane's weight row.
MMA_TILE_KS = (32, 64, 128)


def check_mma_launch(launch: Launch) -> None:
    """Refuse a launch ``fp8_mma.cu`` has no build for.

    :raises ValueError: not the tensor-core path, rows not a multiple of 8, outputs not whole
        groups of 32 per warp, a k-tile other than 32, 64 or 128, or no split cost.
    """
    if launch.path != MMA:
        raise ValueError(f"not a tensor-core launch: {launch}")
    if (
        launch.block_m % MMA_ROWS
        or launch.num_warps < 1
        or launch.block_n % (MMA_WARP_OUTPUTS * launch.num_warps)
        or launch.block_k not in MMA_TILE_KS
        or launch.programs_per_sm < 1
        or launch.split_cost is None
    ):
        raise ValueError(
            f"a tensor-core launch has rows a multiple of {MMA_ROWS}, {MMA_WARP_OUTPUTS} outputs "
            f"per warp and group, a k-tile of {' / '.join(map(str, MMA_TILE_KS))} inputs, at "
            f"least one program per SM and a split cost: {launch}"
        )


def mma_groups(launch: Launch) -> int:
    """Output groups of 32 a warp covers (the kernel's ``J``): a lane loads one weight row per
    group, 32 rows apart."""
    check_mma_launch(launch)
    return launch.block_n // (MMA_WARP_OUTPUTS * launch.num_warps)


@functools.cache
def mma_options(launch: Launch) -> tuple[str, ...]:
    """The NVRTC options of ``launch``'s build (``fp8_mma.cu``'s macros): the launcher and the
    gate both build them here."""
    return (
        f"-DBM={launch.block_m}",
        f"-DWARPS={launch.num_warps}",
        f"-DJ={mma_groups(launch)}",
        f"-DBK={launch.block_k}",
        f"-DMIN_BLOCKS={launch.programs_per_sm}",
    )


def mma_config(launch: Launch) -> CudaKernelConfig:
    """The SM70 compile gate's configuration of ``launch``'s build: the source behind the
    host's prelude, as the launcher compiles it."""
    tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}w{launch.num_warps}"
    return CudaKernelConfig(
        name=f"fp8w_mma_{tile}",
        source=with_prelude(SOURCE),
        kernel=KERNEL,
        block_threads=launch.num_warps * 32,
        options=mma_options(launch),
        claims_tensor_cores=True,
    )


def mma_grid(m: int, n: int, launch: Launch, splits: int) -> tuple[int, int, int]:
    """``(row blocks, output blocks, splits)``: row blocks first, so the blocks reading one
    weight tile for different tokens run side by side and share it in L2."""
    return -(-m // launch.block_m), -(-n // launch.block_n), splits


def mma_splits(n: int, k: int, launch: Launch, sm_count: int, m: int) -> tuple[int, int]:
    """How many input splits the tensor-core GEMM makes for ``m`` tokens of an ``n x k``
    layer, and the input length of each (a multiple of ``launch.block_k``, so every split
    starts on a tile and a tile never crosses a scale block): the count
    :func:`balanced_splits` finds for the launch's output tiles. ``(splits, per_split)`` with
    ``splits = ceil(k / per_split)``, every split at least one tile."""
    check_mma_launch(launch)
    tiles = -(-m // launch.block_m) * -(-n // launch.block_n)
    k_tiles = max(1, -(-k // launch.block_k))
    steps = balanced_splits(
        tiles, k_tiles, launch.programs_per_sm, float(launch.split_cost or 0.0), sm_count
    )
    per_split = steps * launch.block_k
    return max(1, -(-k // per_split)), per_split


@functools.cache
def balanced_splits(tiles: int, k_tiles: int, resident: int, cost: float, sm_count: int) -> int:
    """The k-tiles per split that let the SMs finish ``tiles`` output tiles soonest.

    Cutting each tile's ``k_tiles`` into ``s`` splits makes ``tiles * s`` blocks of
    ``ceil(k_tiles / s)`` k-tiles. An SM runs about ``ceil(blocks / sm_count)`` of them,
    ``resident`` at a time, each paying a fixed cost of ``cost`` k-tiles (its start, and the
    atomic sums after its last tile), and one with fewer than ``resident`` blocks gains nothing
    from it (a lone block waits on its own loads). So the time is taken as
    ``max(ceil(blocks / sm_count), resident) * (steps + cost)``; ties go to fewer splits (the
    model ct_wna16's tensor-core GEMM splits by). Cached: the search walks every step count.
    """
    if min(tiles, k_tiles, resident, sm_count) < 1:
        raise ValueError(
            f"balanced_splits needs at least one tile, k-tile, resident block and SM, got "
            f"tiles={tiles}, k_tiles={k_tiles}, resident={resident}, sm_count={sm_count}"
        )
    best = (float("inf"), 0)
    for steps in range(1, k_tiles + 1):
        splits = -(-k_tiles // steps)
        if -(-k_tiles // splits) != steps:
            continue  # the same splits as fewer steps each
        time = max(-(-tiles * splits // sm_count), resident) * (steps + cost)
        if time < best[0] or (time == best[0] and steps > best[1]):
            best = (time, steps)
    return best[1]


# -- the routed experts' GEMM (fp8_moe_mma.cu) -----------------------------------------------------


def check_moe_mma_launch(launch: Launch) -> None:
    """Refuse a launch ``fp8_moe_mma.cu`` has no build for.

    :raises ValueError: not the tensor-core path, rows not a multiple of 8, weight rows not an
        even number of groups of 32 per warp (gate/up take half the groups each), a k-tile
        other than 32, 64 or 128, no program per SM, or a split cost (it never splits).
    """
    if launch.path != MMA:
        raise ValueError(f"not a tensor-core launch: {launch}")
    groups, left = divmod(launch.block_n, MMA_WARP_OUTPUTS * max(launch.num_warps, 1))
    if (
        launch.block_m % MMA_ROWS
        or launch.num_warps < 1
        or left
        or groups % 2
        or launch.block_k not in MMA_TILE_KS
        or launch.programs_per_sm < 1
        or launch.split_cost is not None
    ):
        raise ValueError(
            f"a routed tensor-core launch has rows a multiple of {MMA_ROWS}, an even number of "
            f"groups of {MMA_WARP_OUTPUTS} weight rows per warp, a k-tile of "
            f"{' / '.join(map(str, MMA_TILE_KS))} inputs, at least one program per SM and no "
            f"split cost: {launch}"
        )


def moe_mma_groups(launch: Launch) -> int:
    """Weight-row groups of 32 a warp of the routed GEMM covers (the kernel's ``J``): gate/up
    takes half of them from gate's rows and half from up's."""
    check_moe_mma_launch(launch)
    return launch.block_n // (MMA_WARP_OUTPUTS * launch.num_warps)


def moe_mma_columns(launch: Launch, gate_up: bool) -> int:
    """Output columns a block covers: ``block_n`` weight rows, which for gate/up are half as
    many intermediate columns (a gate row and an up row each)."""
    check_moe_mma_launch(launch)
    return launch.block_n // 2 if gate_up else launch.block_n


@functools.cache
def moe_mma_options(launch: Launch, gate_up: bool) -> tuple[str, ...]:
    """The NVRTC options of ``launch``'s gate/up (``gate_up``) or down build
    (``fp8_moe_mma.cu``'s macros): the launcher and the gate both build them here."""
    return (
        f"-DBM={launch.block_m}",
        f"-DWARPS={launch.num_warps}",
        f"-DJ={moe_mma_groups(launch)}",
        f"-DBK={launch.block_k}",
        f"-DMIN_BLOCKS={launch.programs_per_sm}",
        f"-DGATE_UP={int(gate_up)}",
    )


def moe_mma_config(launch: Launch, gate_up: bool) -> CudaKernelConfig:
    """The SM70 compile gate's configuration of ``launch``'s gate/up or down build: the source
    behind the host's prelude, as the launcher compiles it."""
    tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}w{launch.num_warps}"
    return CudaKernelConfig(
        name=f"fp8w_moe_mma_{'gate_up' if gate_up else 'down'}_{tile}",
        source=with_prelude(MOE_SOURCE),
        kernel=MOE_KERNEL,
        block_threads=launch.num_warps * 32,
        options=moe_mma_options(launch, gate_up),
        claims_tensor_cores=True,
    )


# -- the one-token GEMV (fp8_gemv.cu) ----------------------------------------------------------

#: The most threads a CUDA block has.
MAX_BLOCK_THREADS = 1024


def gemv_rows(launch: Launch) -> int:
    """Weight rows one warp of the GEMV reads side by side (the kernel's ``ROWS``).

    :raises ValueError: not a CUDA GEMV launch, or more than 1024 threads a block.
    """
    if launch.path != CUDA_GEMV or launch.num_warps * 32 > MAX_BLOCK_THREADS:
        raise ValueError(f"not a CUDA GEMV launch of at most {MAX_BLOCK_THREADS} threads: {launch}")
    return launch.block_n // launch.num_warps


@functools.cache
def gemv_options(launch: Launch) -> tuple[str, ...]:
    """The NVRTC options of ``launch``'s GEMV build (``fp8_gemv.cu``'s macros): the launcher
    and the gate both build them here."""
    return (
        f"-DWARPS={launch.num_warps}",
        f"-DROWS={gemv_rows(launch)}",
        f"-DLOADS={launch.loads}",
    )


def gemv_config(launch: Launch) -> CudaKernelConfig:
    """The SM70 compile gate's configuration of ``launch``'s GEMV build: the source behind the
    host's prelude, as the launcher compiles it."""
    return CudaKernelConfig(
        name=f"fp8w_gemv_r{gemv_rows(launch)}w{launch.num_warps}l{launch.loads}",
        source=with_prelude(GEMV_SOURCE),
        kernel=GEMV_KERNEL,
        block_threads=launch.num_warps * 32,
        options=gemv_options(launch),
    )


def gemv_grid(n: int, launch: Launch, splits: int) -> tuple[int, int, int]:
    """One block per ``block_n`` weight rows and input split."""
    return -(-n // launch.block_n), 1, splits
