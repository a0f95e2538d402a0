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
    """

    path: str
    block_m: int = 1
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    programs_per_sm: int = 4
    group_m: int = 8

    def __post_init__(self) -> None:
        if self.path not in (SPLITK, GEMM, DEQUANT_MATMUL, MMA):
            raise ValueError(f"unknown launch path {self.path!r}")
        if self.block_k not in (32, 64, 128):
            raise ValueError(f"an input tile of 32, 64 or 128 elements: {self}")
        if self.path == MMA and self.block_m % MMA_ROWS:
            raise ValueError(f"a tensor-core launch has rows a multiple of {MMA_ROWS}: {self}")


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

#: The tensor-core GEMM's launches on a V100, ``(most tokens, launch)`` in token order
#: (:mod:`volta_fp8w.cuda`).
SM70_MMA: tuple[tuple[int, Launch], ...] = ()


def table_for(capability: tuple[int, int]) -> Table:
    """The table of a device family: SM80 and newer take :data:`SM90`'s dot tiles."""
    return SM90 if capability >= (8, 0) else SM70
