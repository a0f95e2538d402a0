"""The launch parameters of each device family, as data: :class:`Launch` and one :class:`Table`
of them per family, with the V100's tensor-core rows.

Two families. On SM70 ``tl.dot`` runs on the FMA units (triton-lang/triton#5066), so the Triton
paths are GEMVs (1 to :data:`DECODE_MAX_M` tokens, memory-bound: one byte per weight) and, where
no NVRTC builds the tensor-core GEMM, an FMA GEMM or dequantize-then-cuBLAS (cuBLAS keeps the
V100's tensor cores, 125 TFLOP/s against Triton's 15.7). On SM80 and newer (the Hopper GPUs the
kernels are measured on) ``tl.dot`` uses tensor cores. The V100's tensor-core rows are
:data:`SM70_MMA` (linear layers) and :data:`SM70_MOE_MMA` (the routed experts).

The fused MoE experts' launches (:class:`MoELaunch`) are in the same tables: the decode GEMVs'
tile (up to ``moe_decode_max_m`` tokens) and the routed blocks' tiles by mean routed rows per
expert, with the routing's and the slot sum's block sizes (:data:`SUM_BLOCK`,
:data:`COUNT_BLOCK`, :data:`PLACE_ELEMENTS`).

Which entry a call gets, and when a V100 takes the tensor-core GEMM, is
:mod:`volta_fp8w.dispatch`'s answer; what follows from an entry (split counts) is
:mod:`volta_fp8w.launch`'s. Torch- and triton-free, and imports nothing of the plugin.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The launch paths: the split-K GEMV, the tiled GEMM, dequantize then cuBLAS, the CUDA GEMM on
#: Volta's tensor cores and the CUDA one-token GEMV (:mod:`volta_fp8w.cuda`).
SPLITK = "splitk"
GEMM = "gemm"
DEQUANT_MATMUL = "dequant_matmul"
MMA = "mma"
CUDA_GEMV = "cuda_gemv"

#: Bytes of one weight load of the CUDA GEMV (16 codes): the input count, the weights' row
#: stride and the weights' and activations' addresses are multiples of it where it runs.
GEMV_VECTOR = 16

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

    ``num_stages``: the software-pipelining stages a Triton launch passes (Triton's default,
    3, unless a table says otherwise), so that the compile gate builds what runs.

    ``dot_k``: the inputs one ``tl.dot`` of the multi-token split-K tile takes (at most
    ``block_k``; 32 by default: SM70's FMA dot holds each operand's inputs for its outputs in
    registers, and a 128-input dot of 8 tokens by 32 rows spills at sm_70); other paths ignore it.

    The CUDA one-token GEMV (``CUDA_GEMV``, :mod:`volta_fp8w.cuda.gemv`): ``block_n`` weight
    rows a block, ``num_warps`` warps of ``block_n / num_warps`` rows each, and ``loads``
    16-byte loads of each row a lane has in flight before it uses them; ``block_k`` (a lane's
    scale block holds its 16 inputs) and the other fields are not read.
    """

    path: str
    block_m: int = 1
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    programs_per_sm: int = 4
    group_m: int = 8
    split_cost: float | None = None
    dot_k: int = 32
    num_stages: int = 3
    loads: int = 1

    def __post_init__(self) -> None:
        if self.path not in (SPLITK, GEMM, DEQUANT_MATMUL, MMA, CUDA_GEMV):
            raise ValueError(f"unknown launch path {self.path!r}")
        if self.block_k not in (32, 64, 128) or self.dot_k not in (32, 64, 128):
            raise ValueError(f"input tiles and dots of 32, 64 or 128 elements: {self}")
        if self.path == MMA and self.block_m % MMA_ROWS:
            raise ValueError(f"a tensor-core launch has rows a multiple of {MMA_ROWS}: {self}")
        if self.split_cost is not None and (self.path != MMA or self.split_cost < 0):
            raise ValueError(f"split_cost is a tensor-core launch's cost in k-tiles, >= 0: {self}")
        if self.path == CUDA_GEMV and (
            self.block_m != 1 or self.num_warps < 1 or self.block_n % self.num_warps
        ):
            raise ValueError(f"a CUDA GEMV launch takes one token and whole rows a warp: {self}")
        if self.loads < 1 or (self.loads != 1 and self.path != CUDA_GEMV):
            raise ValueError(f"loads is the CUDA GEMV's loads in flight a row, >= 1: {self}")


@dataclass(frozen=True)
class MoELaunch:
    """One fused-MoE path's tile: ``block_m`` routed rows a block (the routed blocks; 1 for the
    GEMVs), ``block_n`` outputs (gate/up: intermediate columns, each with its gate and up row) a
    program, ``block_k`` inputs a step (lowered to divide the scale blocks' ``block_k``), and
    Triton's warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        if self.block_k not in (32, 64, 128) or self.block_n < 1 or self.block_m < 1:
            raise ValueError(f"a MoE tile of 32, 64 or 128 inputs a step: {self}")


#: The most tokens the MoE decode GEMVs take; more go through the routed blocks.
MOE_DECODE_MAX_M = 16

#: The fewest rows a routed blocks' tile has: ``tl.dot`` needs 16 rows at least.
MOE_MIN_BLOCK_M = 16

#: The decode step's slot sum: outputs a program.
SUM_BLOCK = 1024

#: Routing launches: pairs a counting program takes.
COUNT_BLOCK = 256

#: The routing's and the slot sum's warps and pipeline stages (Triton's defaults).
AUX_NUM_WARPS = 4
AUX_NUM_STAGES = 3

#: Routing's placing launch: a program compares each of its pairs with every expert (the
#: experts' count rounded up to a power of two, at least 16), at most this many comparisons, and
#: takes 16 to 1024 pairs (:func:`volta_fp8w.dispatch.route_place_tile`).
PLACE_ELEMENTS = 16384
PLACE_MIN_BLOCK = 16
PLACE_MAX_BLOCK = 1024

#: The decode GEMVs' tile. On an H200 with Qwen3-30B-A3B's experts (CUDA graph replays,
#: 128 x 128 blocks) the three launches took 35 us at 1 token, 67 us at 4 and 200 us at 16;
#: 16, 32 columns and 2, 4 warps were within 10% at 1 token, 32 and 2 warps best above.
MOE_DECODE_LAUNCH = MoELaunch(block_m=1, block_n=32, block_k=128, num_warps=2, num_stages=3)


@dataclass(frozen=True)
class Table:
    """The Triton launches of one device family, by number of tokens."""

    gemv: Launch
    """1 token: the Triton split-K GEMV, and the CUDA GEMV's fallback."""
    small: Launch
    """2 to ``small_max_m`` tokens."""
    gemm: Launch
    """Above ``small_max_m`` tokens, below ``dequant_from``."""
    dequant_from: int | None
    """From this many tokens on, dequantize and call cuBLAS (None: never)."""
    dequant: Launch
    moe_decode: MoELaunch
    """The fused experts' decode GEMVs, 1 to ``moe_decode_max_m`` tokens."""
    moe_blocks: tuple[MoELaunch, ...]
    """The routed blocks' tiles above ``moe_decode_max_m`` tokens, by ``block_m`` (rising): the
    first whose ``block_m`` is at least the mean routed rows of an expert, the last above."""
    small_max_m: int = DECODE_MAX_M
    """The most tokens the multi-token split-K tile takes."""
    moe_decode_max_m: int = MOE_DECODE_MAX_M
    """The most tokens the fused experts' decode GEMVs take."""
    cuda_gemv: tuple[tuple[int | None, Launch], ...] = ()
    """1 token, where NVRTC builds it (:mod:`volta_fp8w.cuda.gemv`): the CUDA GEMV's launch by
    the layer's input length, ``(most inputs, launch)`` rising, the last for any length
    (None), with ``gemv`` its fallback (empty: ``gemv`` alone), on layers of at least
    ``cuda_gemv_min_n`` outputs (it does not split the input, so fewer rows leave SMs idle)."""
    cuda_gemv_min_n: int = 2048

    def __post_init__(self) -> None:
        rows = [launch.block_m for launch in self.moe_blocks]
        if not rows or rows != sorted(set(rows)) or rows[0] < MOE_MIN_BLOCK_M:
            raise ValueError(
                f"routed blocks' tiles of distinct rows, rising, at least {MOE_MIN_BLOCK_M}: "
                f"{self.moe_blocks}"
            )
        if self.moe_decode.block_m != 1 or self.moe_decode_max_m < 1:
            raise ValueError(f"the decode GEMVs take one row a program: {self.moe_decode}")
        lengths = [most for most, _ in self.cuda_gemv[:-1] if most is not None]
        if self.cuda_gemv and (
            any(launch.path != CUDA_GEMV for _, launch in self.cuda_gemv)
            or self.cuda_gemv[-1][0] is not None
            or lengths != sorted(set(lengths))
            or len(lengths) != len(self.cuda_gemv) - 1
        ):
            raise ValueError(
                f"the CUDA GEMV's rows are {CUDA_GEMV} launches by rising input length, the "
                f"last for any (None): {self.cuda_gemv}"
            )


SM70 = Table(
    gemv=Launch(SPLITK, block_m=1, block_n=64, block_k=128, num_warps=4, programs_per_sm=4),
    small=Launch(SPLITK, block_m=8, block_n=32, block_k=128, num_warps=4, programs_per_sm=4),
    gemm=Launch(GEMM, block_m=32, block_n=64, block_k=32, num_warps=4),
    dequant_from=33,
    dequant=Launch(DEQUANT_MATMUL, block_n=64, block_k=128),
    moe_decode=MOE_DECODE_LAUNCH,
    # The routed blocks' tiles by routed rows per expert (the first whose ``block_m`` is at
    # least the mean): SM70's ``tl.dot`` runs on the FMA units, so its tiles stay small (not
    # measured: no V100 was lent); ``tl.dot`` needs 16 rows at least. The 32-row tile takes 32
    # outputs, not 64: with 64 its gate/up build spills at sm_70 (255 registers, 196 B of spill
    # stores, four warps); 32 x 32 takes at most 206 registers for gate/up and 191 for down
    # (the SM70 compile gate, every build of volta_fp8w.dispatch.moe_builds).
    moe_blocks=(
        MoELaunch(block_m=16, block_n=64, block_k=32, num_warps=4, num_stages=2),
        MoELaunch(block_m=32, block_n=32, block_k=32, num_warps=4, num_stages=2),
    ),
    # The H200's CUDA GEMV launch and row floor (below), not measured on a V100: its 16-byte
    # loads and fp32 products are the same per weight there, where the FMA units have about
    # twice the instructions a byte of HBM that an H200's have.
    cuda_gemv=((None, Launch(CUDA_GEMV, block_n=8, num_warps=4, loads=2, programs_per_sm=8)),),
    cuda_gemv_min_n=1024,
)

#: From the H200 sweep of docs/perf/fp8w (``fp8w_bench.py --sweep``, 27648x5120, 5120x5120 and
#: 5120x27648 at 1, 4, 16 and 32 tokens): the fastest launch per token range there. One token:
#: 2 warps, the best of the second sweep, after the GEMV decoded its codes as words
#: (docs/perf/fp8w/PERFORMANCE_HISTORY.md#gemv_words).
SM90 = Table(
    gemv=Launch(SPLITK, block_m=1, block_n=64, block_k=128, num_warps=2, programs_per_sm=8),
    # One 128-input dot a tile: the fastest of the 16-token sweep on every layer shape
    # (docs/perf/fp8w/h200_2026-12-02_m16: 1.12-1.55x fp16 cuBLAS; 32-input dots 0.94-1.20x).
    small=Launch(
        SPLITK, block_m=16, block_n=128, block_k=128, num_warps=4, programs_per_sm=4, dot_k=128
    ),
    gemm=Launch(GEMM, block_m=32, block_n=128, block_k=128, num_warps=4),
    dequant_from=512,
    dequant=Launch(DEQUANT_MATMUL, block_n=64, block_k=128),
    moe_decode=MOE_DECODE_LAUNCH,
    # The routed blocks' tiles by routed rows per expert (the first whose ``block_m`` is at
    # least the mean). The SM80 rows were the best of eight tiles on an H200 at 64, 512 and
    # 4096 tokens of Qwen3-30B-A3B's experts (300 us, 420 us, 1.8 ms).
    moe_blocks=(
        MoELaunch(block_m=16, block_n=64, block_k=64, num_warps=4, num_stages=3),
        MoELaunch(block_m=32, block_n=64, block_k=64, num_warps=4, num_stages=3),
        MoELaunch(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=3),
    ),
    small_max_m=16,
    # Two rows a warp, four warps, two 16-byte loads a row in flight, the input split until the
    # grid has 8 blocks an SM: the fastest of 48 CUDA launches on 5120 x 27648 (40.8 us) and
    # within 1% of the fastest on 27648 x 5120, 5120 x 5120 within 3% in the first sweep.
    # Split, it beats the Triton split-K GEMV on 1024 x 8192 too (6.0 against 6.6 us); 512
    # rows not measured (docs/perf/fp8w/PERFORMANCE_HISTORY.md#cuda_gemv).
    cuda_gemv=((None, Launch(CUDA_GEMV, block_n=8, num_warps=4, loads=2, programs_per_sm=8)),),
    cuda_gemv_min_n=1024,
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


def _moe_mma(block_m: int, programs_per_sm: int) -> Launch:
    return Launch(
        MMA,
        block_m=block_m,
        block_n=256,
        block_k=32,
        num_warps=4,
        programs_per_sm=programs_per_sm,
    )


#: The routed experts' tensor-core GEMM on a V100 (``fp8_moe_mma.cu``), ``(most routed rows an
#: expert averages, launch)`` in order, the last for any more (None). Four warps of two groups
#: of 32 weight rows a lane (256 rows a block: gate/up 128 intermediate columns, each a gate and
#: an up row, so the SiLU product is the block's epilogue; down 256 outputs), k-tiles of 32
#: inputs as the dense rows. 16 rows a block while the experts average at most 16 (less
#: padding), 32 above; 64 rows would need 256 accumulators a lane and do not fit. The sm_70
#: builds take 162 and 240 registers without spilling (3 and 2 blocks of 128 threads an SM,
#: ``programs_per_sm``); no split-K: prefill routes enough blocks to fill the GPU. Estimated,
#: not measured on a V100.
SM70_MOE_MMA: tuple[tuple[int | None, Launch], ...] = (
    (16, _moe_mma(16, 3)),
    (None, _moe_mma(32, 2)),
)


def table_for(capability: tuple[int, int]) -> Table:
    """The table of a device family: SM80 and newer take :data:`SM90`'s dot tiles."""
    return SM90 if capability >= (8, 0) else SM70
