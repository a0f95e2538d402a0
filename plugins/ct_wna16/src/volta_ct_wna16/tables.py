"""The launch parameters of each device family, as data: the dataclasses of a launch
(:class:`Launch`, and the fused-MoE decode step's :class:`MoEDecode` and :class:`MoEFused`) and
one :class:`Table` of them per family, with the tensor-core GEMM's rows (:data:`SM70_MMA`) and
the routing's and SiLU product's fixed tiles.

Two families. On SM70 ``tl.dot`` runs on the FMA units (docs/kernels.md#sm70-facts), so decode
tiles are modest and one to four tokens take the plain-FMA GEMV rather than a dot padded to 16
rows; above 32 tokens the weights are dequantized once and the product goes to cuBLAS, which
still has the V100's tensor cores (125 TFLOP/s against Triton's 15.7). On SM80 and newer (the
H100 the kernels are measured on) ``tl.dot`` uses tensor cores, so decode tiles are wider.

Which entry a call gets (and when a V100 takes the tensor-core GEMM instead) is
:mod:`volta_ct_wna16.dispatch`'s; what follows from an entry (split counts, constexprs) is
:mod:`volta_ct_wna16.launch`'s. Torch- and triton-free, and imports nothing of the plugin; the
history of every entry is docs/perf/ct_wna16/PERFORMANCE_HISTORY.md.
"""

from __future__ import annotations

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
    where every tile lies inside the layer (:func:`~volta_ct_wna16.launch.whole_tiles`).
    ``split_cost``: where set, the split count is the one the SMs finish soonest by
    :func:`~volta_ct_wna16.launch.balanced_splits`, which counts a program's fixed cost as this
    many input steps and takes ``programs_per_sm`` as the programs an SM runs at once; where None,
    :func:`~volta_ct_wna16.launch.split_count` aims at ``programs_per_sm`` programs per SM.
    ``swap``: a fused-MoE dot tile of more than :data:`MOE_SPLIT_MAX_ROWS` rows (one that
    never splits the input) computed transposed, the dequantized weights as the dot's first
    operand (the kernel's ``SWAP``, :func:`volta_ct_wna16.kernels.moe.wna16_moe_kernel`); it
    dequantizes into input order for one dot (no :func:`~volta_ct_wna16.launch.slot_dots`) and
    loads scales per word row (no :func:`~volta_ct_wna16.launch.group_tile`).

    The tensor-core GEMM (``MMA``): ``block_m`` tokens (a multiple of 8) by ``block_n``
    outputs (``num_warps`` warps of 32 outputs per word a lane loads,
    :func:`~volta_ct_wna16.launch.mma_words`) per block, splits of ``block_k``
    (:data:`MMA_BLOCK_K`) input steps, balanced by ``split_cost``.
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


#: The most tokens a table's decode (split-K) tile takes unless the table says otherwise.
DECODE_MAX_M = 16

#: The most tokens the fused-MoE decode kernels take (more take the routed blocks' kernel).
MOE_DECODE_MAX_M = 16


@dataclass(frozen=True)
class MoEDecode:
    """The fused-MoE decode kernels' launches (:mod:`volta_ct_wna16.kernels.moe_decode`): one
    row a program on the GEMV sub-tile, the input split as :func:`volta_ct_wna16.launch.split_count`
    says and the splits summed by a tree of fan-in ``reduce_unroll``."""

    gate_up: Launch
    down: Launch

    def __post_init__(self) -> None:
        for launch in (self.gate_up, self.down):
            if launch.path != MOE or launch.block_m != 1 or launch.use_dot or launch.block_k % 32:
                raise ValueError(
                    f"a decode launch is a fused-MoE one of one row, no dot, on whole 32-input "
                    f"sub-tiles: {launch}"
                )


@dataclass(frozen=True)
class Table:
    """The launches of one device family, by number of tokens."""

    gemv: Launch
    """1 token (below the ``wide_gemv`` threshold, if any)."""
    small: Launch
    """2 to 4 tokens."""
    decode: Launch
    """5 to ``decode_max_m`` tokens."""
    gemm: Launch
    """From ``decode_max_m + 1`` up to ``dequant_from`` tokens: the GEMM kernel, or a split-K
    tile of many rows."""
    dequant_from: int | None
    """From this many tokens on, dequantize and call cuBLAS (None: never)."""
    dequant: Launch
    moe: Launch
    """Fused MoE while experts get few routed rows each."""
    moe_large: Launch
    """Fused MoE once the routed rows average more than ``moe.block_m`` per expert."""
    wide_gemv: tuple[int, Launch] | None = None
    """1 token from this many outputs on: ``(outputs, launch)``."""
    short_gemv: tuple[int, Launch] | None = None
    """1 token below ``wide_gemv``'s outputs, with at most this many inputs: ``(inputs,
    launch)``."""
    decode_max_m: int = DECODE_MAX_M
    """The most tokens the decode tile takes (a tile of 16 rows runs one program per 16)."""
    moe_decode: tuple[tuple[int, MoEDecode | MoEFused], ...] = ()
    """Fused MoE at few tokens, read straight from the router's ids: ``(most tokens,
    launches)`` rows in token order (:func:`volta_ct_wna16.dispatch.moe_decode_choice`),
    two launches or one."""


SM70 = Table(
    # uint8 zero points because the GEMV is bandwidth-bound, more so on a V100 than on the H100
    # where they gained (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run15; not measured on SM70).
    gemv=Launch(
        SPLITK,
        block_m=1,
        block_n=256,
        block_k=32,
        programs_per_sm=4,
        reduce_unroll=4,
        byte_zeros=True,
    ),
    # 8 warps because on 4 the 8-bit tile spills at sm_70 once the JIT specializes model shapes
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm70_small_warps).
    small=Launch(SPLITK, block_m=4, block_n=64, block_k=32, num_warps=8, programs_per_sm=4),
    decode=Launch(SPLITK, block_m=16, block_n=32, block_k=64, use_dot=True, programs_per_sm=4),
    gemm=Launch(GEMM, block_m=32, block_n=64, block_k=32, num_warps=4),
    dequant_from=33,
    dequant=Launch(DEQUANT_MATMUL, block_n=256, block_k=32),
    moe=Launch(MOE, block_m=16, block_n=64, block_k=32, use_dot=True),
    moe_large=Launch(MOE, block_m=32, block_n=64, block_k=32, use_dot=True),
    # Decode MoE: this table's 1-token GEMV tile, split and summed by the tree; estimated,
    # not measured (no V100). Two launches at every size: the one launch walks the whole input
    # per program, and Triton does not pipeline loops on SM70.
    moe_decode=(
        (
            MOE_DECODE_MAX_M,
            MoEDecode(
                Launch(MOE, block_n=256, block_k=32, reduce_unroll=4),
                Launch(MOE, block_n=256, block_k=32, reduce_unroll=4),
            ),
        ),
    ),
)

#: The SM90 tile of 2 to 32 tokens (the table's ``small`` and ``decode``).
_SM90_DOT = Launch(
    SPLITK,
    block_m=16,
    block_n=256,
    block_k=128,
    use_dot=True,
    programs_per_sm=2,
    num_stages=3,
    atomic=True,
    unmasked=True,
    split_cost=1.5,
)

#: The SM90 1-token GEMV (the table's ``gemv``); its wide and short tiles differ from it in
#: warps, programs per SM, fan-in and zero-point form only.
_SM90_GEMV = Launch(
    SPLITK,
    block_m=1,
    block_n=512,
    block_k=32,
    num_warps=2,
    programs_per_sm=4,
    num_stages=3,
    reduce_unroll=8,
    byte_zeros=True,
    atomic=True,
    unmasked=True,
)

#: The SM90 decode MoE's launch: the 1-token GEMV's warps, pipeline and fan-in
#: (:data:`_SM90_GEMV`) on 512 outputs; at one token on 256.
_SM90_ROW = Launch(MOE, block_n=512, block_k=32, num_warps=2, num_stages=3, reduce_unroll=8)

SM90 = Table(
    # 1 token: 512 outputs on 2 warps at 4 programs per SM, the best or close to it on every
    # layer swept (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_gemv).
    gemv=_SM90_GEMV,
    # From 8192 outputs: 4 warps at 5 programs per SM and a fan-in of 16, with fp16 zero points
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_gemv).
    wide_gemv=(
        8192,
        replace(_SM90_GEMV, num_warps=4, programs_per_sm=5, reduce_unroll=16, byte_zeros=False),
    ),
    # Up to 8192 inputs: 4 warps at 6 programs per SM, faster than the narrow tile on the layers
    # of 5120 inputs (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_gemv).
    short_gemv=(8192, replace(_SM90_GEMV, num_warps=4, programs_per_sm=6)),
    # 2-32 tokens: 256 outputs at 2 programs per SM with atomic splits, the best tile overall in
    # the sweeps at 4 and 16 tokens (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_dot).
    small=_SM90_DOT,
    decode=_SM90_DOT,
    # Up to 32 tokens on the decode tile: at 32 it beat the GEMM on every layer timed
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run9).
    decode_max_m=32,
    # 33-191 tokens: a 64x64x64 dequantized tile with split-K, because the GEMM kernel has no
    # split-K and ran a layer with few output tiles on few SMs
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_gemm).
    gemm=Launch(
        SPLITK,
        block_m=64,
        block_n=64,
        block_k=64,
        use_dot=True,
        num_warps=4,
        programs_per_sm=3,
        num_stages=3,
        unmasked=True,
        split_cost=3.0,
    ),
    # From 192 tokens dequantize-then-cuBLAS, which won everywhere at 256
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_gemm).
    dequant_from=192,
    dequant=Launch(DEQUANT_MATMUL, block_n=256, block_k=32),
    # Fused MoE: 16x128x128 while the routed rows per expert are few, 64x128x64 from 16 rows per
    # expert on average (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#sm90_moe).
    moe=Launch(MOE, block_m=16, block_n=128, block_k=128, use_dot=True, num_stages=3),
    # The large tile swapped (weights as the dot's first operand, scales per word row): the
    # least prefill time of the tiles swept on both MoE layers at 2048 tokens, while the small
    # tile stays unswapped (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#moe_large_swap).
    moe_large=Launch(
        MOE, block_m=64, block_n=128, block_k=64, use_dot=True, num_stages=3, swap=True
    ),
    # Decode MoE: 1-4 tokens in one launch of 32 intermediate rows a program on 4 warps, 5-16
    # tokens the 1-token GEMV's tile split and summed by the tree, each the faster there
    # (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#moe_decode_rows).
    moe_decode=(
        (4, MoEFused(block_j=32, block_k=256, block_n=1024, num_warps=4, num_stages=3)),
        (MOE_DECODE_MAX_M, MoEDecode(_SM90_ROW, _SM90_ROW)),
    ),
)


def table_for(capability: tuple[int, int]) -> Table:
    """SM70 tiles on Volta (and Turing), SM90 tiles on anything with tensor-core ``tl.dot``."""
    return SM70 if capability < (8, 0) else SM90


#: The fewest and the most tokens the tensor-core GEMM takes: from 8, one ``m8n8k4`` product's
#: rows (fewer tokens stay on the FMA GEMV and decode tiles, which are bound by the weights'
#: bytes there); up to 256, beyond which the dequantize-then-cuBLAS path serves.
MMA_MIN_M = 8
MMA_MAX_M = 256


def _mma(block_m: int, programs_per_sm: int) -> Launch:
    return Launch(
        MMA,
        block_m=block_m,
        block_n=256,
        block_k=32,
        num_warps=4,
        programs_per_sm=programs_per_sm,
        split_cost=2.0,
    )


#: The tensor-core GEMM on a V100, one row per token class: ``(most tokens, launch)``. Four
#: warps of 64 outputs (two words a lane per word row, so each activation fragment serves two
#: products); 16, 32 or 64 tokens a block (more tokens take several row blocks, which read the
#: same weights from L2). ``programs_per_sm`` is what the sm_70 build's registers let an SM hold
#: (4, 3 and 2 blocks of 128 threads at up to 111, 154 and 238 registers); the split count
#: balances them with a fixed cost of 2 k-tiles per block (its start and its atomic sums).
#: Estimated, not measured (no V100; docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#mma_sm70).
SM70_MMA: tuple[tuple[int, Launch], ...] = (
    (16, _mma(16, 4)),
    (32, _mma(32, 3)),
    (MMA_MAX_M, _mma(64, 2)),
)


#: The routed experts' tensor-core GEMM on a V100 (``wna16_moe_mma.cu``), one row per class of
#: routed rows per expert on average: ``(most rows per expert, launch)``, the last row open. A
#: block takes ``block_m`` rows of one expert, so the tile grows with the rows an expert gets
#: (a block of 64 when experts average more than 32, each expert's weights read once per block);
#: the dense GEMM's tiles, whose sm_70 builds the gate holds to the same register and shared
#: memory bounds. No split-K (``split_cost`` is unused): prefill routes blocks enough to fill
#: the GPU. Estimated, not measured (no V100;
#: docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#moe_mma).
SM70_MOE_MMA: tuple[tuple[int | None, Launch], ...] = (
    (16, _mma(16, 4)),
    (32, _mma(32, 3)),
    (None, _mma(64, 2)),
)

#: The most experts per token :func:`volta_ct_wna16.routing.select_experts` picks (its
#: kernel's vector of them, ``TOPK_POW2``).
MAX_SELECT_TOP_K = 32


#: Pairs per program of the routing's first launch.
ROUTE_COUNT_BLOCK = 256

#: Count-by-pair elements one program of the routing's second launch compares at once
#: (:func:`volta_ct_wna16.launch.route_place_tile`).
ROUTE_PLACE_ELEMENTS = 8192


#: Columns per program of the SiLU product between the fused-MoE launches.
SILU_BLOCK = 512
