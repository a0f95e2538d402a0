"""The launch parameters of each device family, as data: :class:`Launch` and one :class:`Table`
of them per family, with the tensor-core GEMM's rows (:data:`SM70_MMA`).

Two families. On SM70 ``tl.dot`` runs on the FMA units (triton-lang/triton#5066), so the Triton
paths are GEMVs (1 to :data:`DECODE_MAX_M` tokens, memory-bound: one byte per weight) and, where
no NVRTC builds the tensor-core GEMM, an FMA GEMM or dequantize-then-cuBLAS (cuBLAS keeps the
V100's tensor cores, 125 TFLOP/s against Triton's 15.7). On SM80 and newer (the Hopper GPUs the
kernels are measured on) ``tl.dot`` uses tensor cores.

Which entry a call gets, and when a V100 takes the tensor-core GEMM, is
:mod:`volta_fp8w.dispatch`'s answer; what follows from an entry (split counts) is
:mod:`volta_fp8w.launch`'s. Torch- and triton-free, and imports nothing of the plugin.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The launch paths: the split-K GEMV, the tiled GEMM, dequantize then cuBLAS, and the CUDA
#: GEMM on Volta's tensor cores (:mod:`volta_fp8w.cuda`).
SPLITK = "splitk"
GEMM = "gemm"
DEQUANT_MATMUL = "dequant_matmul"
MMA = "mma"

#: The most tokens the GEMV path takes (decode, and MTP's verification steps).
DECODE_MAX_M = 8

#: Rows of one ``mma.m8n8k4`` product (PTX ISA "Matrix Fragments for mma.m8n8k4").
MMA_ROWS = 8


@dataclass(frozen=True)
class Launch:
    """One launch choice: the path, its tile, and how many programs split-K aims for per SM.

    ``block_k`` counts input elements and divides every scale block's input length the layer
    may have (a multiple of :data:`volta_fp8w.limits.BLOCK_K_QUANTUM`), so one scale serves a
    tile. ``programs_per_sm``: split-K cuts the input until the grid has about this many
    programs per SM.

    The tensor-core GEMM (``MMA``, :mod:`volta_fp8w.cuda`): ``block_m`` tokens by ``block_n``
    outputs (``num_warps`` warps of 32 outputs per group,
    :func:`volta_fp8w.cuda.launch_args.mma_groups`), k-tiles of ``block_k`` inputs;
    ``programs_per_sm`` is the blocks an SM holds at once (the build's ``__launch_bounds__``),
    and ``split_cost`` a block's fixed cost in k-tiles (its start, and its atomic sums after
    the last tile), by which :func:`volta_fp8w.cuda.launch_args.mma_splits` balances the
    split count. None on every other path.
    """

    path: str
    block_m: int = 1
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    programs_per_sm: int = 4
    group_m: int = 8
    split_cost: float | None = None

    def __post_init__(self) -> None:
        if self.path not in (SPLITK, GEMM, DEQUANT_MATMUL, MMA):
            raise ValueError(f"unknown launch path {self.path!r}")
        if self.block_k not in (32, 64, 128):
            raise ValueError(f"an input tile of 32, 64 or 128 elements: {self}")
        if self.path == MMA and self.block_m % MMA_ROWS:
            raise ValueError(f"a tensor-core launch has rows a multiple of {MMA_ROWS}: {self}")
        if self.split_cost is not None and (self.path != MMA or self.split_cost < 0):
            raise ValueError(f"split_cost is a tensor-core launch's cost in k-tiles, >= 0: {self}")


@dataclass(frozen=True)
class Table:
    """The Triton launches of one device family, by number of tokens."""

    gemv: Launch
    """1 token."""
    small: Launch
    """2 to :data:`DECODE_MAX_M` tokens."""
    gemm: Launch
    """Above :data:`DECODE_MAX_M` tokens, below ``dequant_from``."""
    dequant_from: int | None
    """From this many tokens on, dequantize and call cuBLAS (None: never)."""
    dequant: Launch


SM70 = Table(
    gemv=Launch(SPLITK, block_m=1, block_n=64, block_k=128, num_warps=4, programs_per_sm=4),
    small=Launch(SPLITK, block_m=8, block_n=32, block_k=128, num_warps=4, programs_per_sm=4),
    gemm=Launch(GEMM, block_m=32, block_n=64, block_k=32, num_warps=4),
    dequant_from=33,
    dequant=Launch(DEQUANT_MATMUL, block_n=64, block_k=128),
)

SM90 = Table(
    gemv=Launch(SPLITK, block_m=1, block_n=64, block_k=128, num_warps=4, programs_per_sm=4),
    small=Launch(SPLITK, block_m=8, block_n=32, block_k=128, num_warps=4, programs_per_sm=4),
    gemm=Launch(GEMM, block_m=64, block_n=128, block_k=64, num_warps=8),
    dequant_from=512,
    dequant=Launch(DEQUANT_MATMUL, block_n=64, block_k=128),
)


def _mma(block_m: int, block_n: int, programs_per_sm: int) -> Launch:
    return Launch(
        MMA,
        block_m=block_m,
        block_n=block_n,
        block_k=32,
        num_warps=4,
        programs_per_sm=programs_per_sm,
        split_cost=2.0,
    )


#: The tensor-core GEMM's launches on a V100, ``(most tokens, launch)`` in token order
#: (:mod:`volta_fp8w.cuda`). Four warps; k-tiles of 32 inputs (a lane loads 32 bytes of its
#: weight row, one whole sector, and 32 divides every scale block a layer may have). Up to 16
#: tokens two output groups a warp (256 outputs a block, each activation fragment serving two
#: products), above that one (128 outputs), 32 or 64 tokens a block (more tokens take several
#: row blocks, which read the same weights from L2). ``programs_per_sm`` is the build's
#: ``__launch_bounds__`` minimum, which the sm_70 builds meet without spilling (168, 148 and
#: 238 registers: 3, 3 and 2 blocks of 128 threads); the split count balances them with a fixed
#: cost of 2 k-tiles a block (its start and its atomic sums), as ct_wna16's rows do. Estimated,
#: not measured on a V100.
SM70_MMA: tuple[tuple[int, Launch], ...] = (
    (16, _mma(16, 256, 3)),
    (32, _mma(32, 128, 3)),
    (256, _mma(64, 128, 2)),
)


def table_for(capability: tuple[int, int]) -> Table:
    """The table of a device family: SM80 and newer take :data:`SM90`'s dot tiles."""
    return SM90 if capability >= (8, 0) else SM70
