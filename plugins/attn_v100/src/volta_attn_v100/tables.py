"""Launch tables: the tiles and policies of each device family, and the SM70 CUDA kernels' tiles,
as data, with the dataclasses of their entries.

Pure Python (no torch, no triton) and no choosing: :mod:`volta_attn_v100.launch` says what
follows from an entry (builds, constants, grids) and :mod:`volta_attn_v100.dispatch` which table
and which kernel a call gets, and lists what the compile gates check, so the gates compile
exactly what runs. A benchmark or a test that wants another choice passes a changed copy of a
table (``dataclasses.replace``) to the launcher.

Two families: on SM70 ``tl.dot`` runs on the FMA units and the register file is the limit
(docs/kernels.md#sm70-facts), so tiles are small and every loop has one stage; from SM80 on it
runs on tensor cores (measured on the H100), so tiles are larger and software-pipelined. The
measurements behind each entry are in docs/perf/attn_v100/PERFORMANCE_HISTORY.md, under the
anchor each comment names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from volta_attn_v100.limits import MAX_SPLITS


@dataclass(frozen=True)
class Tiles:
    """One launch shape: rows per program, keys per tile, warps and pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class DecodeTile:
    """A decode tile of one head pad and row count: keys per tile for an fp16 and for an fp8
    cache, warps and stages."""

    block_n: int
    fp8_block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class PrefillTiles:
    """The prefill tile of one head pad: ``short`` below ``long_query`` query tokens (the
    step's longest), ``long`` from there on (None: ``short`` for every length)."""

    short: Tiles
    long: Tiles | None = None
    long_query: int = 1024


@dataclass(frozen=True)
class SplitPolicy:
    """How many partitions a decode sequence's keys are cut into (split-KV), by
    :func:`volta_attn_v100.launch.policy_splits`.

    Enough partitions to fill the ``programs_per_sm`` decode programs each SM holds, none
    shorter than ``min_keys_per_split`` keys and at most ``max_splits``; of the counts just
    below and above a full wave, the one whose last wave is fuller, ties to more
    (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#splits). It reads only the batch size and the
    length bound, so vLLM's builder can fix it for a CUDA graph.
    """

    programs_per_sm: int = 3
    min_keys_per_split: int = 64
    max_splits: int = 32

    def __post_init__(self) -> None:
        for name in ("programs_per_sm", "min_keys_per_split", "max_splits"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SplitPolicy.{name} must be a positive integer, got {value!r}")
        if self.max_splits > MAX_SPLITS:
            raise ValueError(
                f"SplitPolicy.max_splits must be at most {MAX_SPLITS}, got {self.max_splits}"
            )


#: Two decode programs per SM: fp8 decode from SM80 (255 registers a thread at sm_90) and
#: every SM70 decode (160-250 registers; not measured on a V100)
#: (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#splits).
TWO_PER_SM = SplitPolicy(programs_per_sm=2)


@dataclass(frozen=True)
class Pairing:
    """When one decode program walks several KV heads (``KV_PER_PROG``): the most of
    ``kv_heads`` that divides the KV heads, whose rows fit the one-head launch's, whose grid
    still fills the ``programs_per_sm`` waves to ``min_fill`` unsplit, for partitions of at
    most ``max_keys`` keys that add up to at least ``min_walked_keys`` over the program's heads
    (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#kv_heads4)."""

    kv_heads: tuple[int, ...] = (4, 2)
    max_pad: int = 128
    max_keys: int = 4096
    min_walked_keys: int = 4096
    min_fill: float = 0.9
    programs_per_sm: int = 2


@dataclass(frozen=True)
class WideCombine:
    """When a split decode combines its partitions in the fewest steps (``floats`` partial
    floats per step): grids the SMs hold at ``max_programs_per_sm`` programs each, heads up to
    ``max_pad`` (None: any) and at least ``min_splits`` partitions."""

    max_programs_per_sm: int = 2
    max_pad: int | None = None
    min_splits: int = 1
    floats: int = 16384


@dataclass(frozen=True)
class Combine:
    """How a split decode program combines the partitions' partials: at least ``min_rows`` rows
    (the rows it owns, or its whole block where ``whole_block``), about ``floats`` partial
    floats per L2 round trip, at most ``max_chunk`` partitions a step."""

    floats: int = 4096
    min_rows: int = 4
    max_chunk: int = 32
    whole_block: bool = False


@dataclass(frozen=True)
class OneStageTail:
    """Which decode launches run their masked tiles in one loop of one stage
    (``ONE_STAGE_TAIL``): at least ``min_splits`` partitions of at most ``max_keys`` keys."""

    min_splits: int = 2
    max_keys: int = 4096


@dataclass(frozen=True)
class KVPolicy:
    """The choices that differ between an fp16 and an fp8 cache on one device family."""

    split: SplitPolicy
    halves: bool = False
    """Q.K and P.V in two halves of the head dimension (``HALVES``), both kernels."""
    ahead_min_keys: int | None = None
    """Decode takes each whole tile's scores one iteration ahead (``AHEAD``) where a program
    walks at least this many keys (None: never)."""
    pairing: Pairing | None = None
    wide_combine: WideCombine | None = None


@dataclass(frozen=True)
class LaunchTable:
    """Every launch choice of one device family."""

    decode_tiles: Mapping[tuple[int, int], DecodeTile]
    """By (head pad, rows per program); the row counts listed for a head pad are the ones its
    decode launches may take."""
    prefill_tiles: Mapping[int, PrefillTiles]
    """By head pad."""
    fp16: KVPolicy
    fp8: KVPolicy
    combine: Combine = field(default_factory=Combine)
    ahead_stages: Mapping[int, int] = field(default_factory=dict)
    """Pipeline stages of a decode tile with scores ahead, by head pad (others keep theirs)."""
    fp16_partials_min_rows: int | None = None
    """A split decode combining at least this many rows stores its partials normalised, in
    fp16 (``PARTIALS_F16``; None: fp32 always)."""
    one_stage_tail: OneStageTail | None = None
    aligned_strides_min_pad: int | None = None
    """From this head pad on, the launchers refuse strides that are not multiples of 16 and the
    gate compiles the specialized build only (None: never)."""
    offsets_32_max_span: int = 2**31
    """A cache spanning at most this many elements is addressed with 32-bit row offsets
    (``CACHE_OFFSETS_32``), a larger one with 64-bit ones."""
    gate_64_bit_offsets: bool = False
    """The gate's list also holds every attention build with 64-bit offsets."""

    def policy(self, kv_fp8: bool) -> KVPolicy:
        """The policy of an fp8 or an fp16 cache."""
        return self.fp8 if kv_fp8 else self.fp16


#: SM70: 16 keys a tile and one stage (``num_stages`` does nothing there); rows and warps are
#: what the sm_70 compile gate passes with no spill in both builds the JIT makes, so head pads
#: 256 and 512 take 16 rows only and 512 needs aligned strides
#: (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#launch_tables). Nothing here was timed on a
#: V100: the split policy holds two programs per SM, the combine covers a program's whole block
#: once it owns more than 4 rows (8 rows spilled at head sizes 80 and 96), partials stay fp32
#: and the masked tiles keep their own loop.
SM70 = LaunchTable(
    decode_tiles={
        (64, 16): DecodeTile(16, 16, 8, 1),
        (64, 32): DecodeTile(16, 16, 16, 1),
        (128, 16): DecodeTile(16, 16, 4, 1),
        (128, 32): DecodeTile(16, 16, 8, 1),
        (256, 16): DecodeTile(16, 16, 8, 1),
        (512, 16): DecodeTile(16, 16, 8, 1),
    },
    prefill_tiles={
        64: PrefillTiles(Tiles(32, 16, 8, 1)),
        128: PrefillTiles(Tiles(16, 16, 4, 1)),
        256: PrefillTiles(Tiles(16, 16, 8, 1)),
        512: PrefillTiles(Tiles(16, 16, 8, 1)),
    },
    fp16=KVPolicy(split=TWO_PER_SM),
    fp8=KVPolicy(split=TWO_PER_SM),
    combine=Combine(whole_block=True),
    aligned_strides_min_pad=512,
    gate_64_bit_offsets=True,
)

#: SM80 and later, measured on the H100 (docs/perf/attn_v100/PERFORMANCE_HISTORY.md, anchors
#: below); each entry is the rule its anchor measured:
#:
#: * decode tiles: an fp8 cache takes twice the keys of fp16 (the same bytes a tile); head pad
#:   512 takes 32 keys on 4 warps at 16 rows (#head512).
#: * prefill tiles: 128 keys from 1024-token queries at heads up to 128, 64 below
#:   (#prefill_one_loop).
#: * fp16: three programs per SM (#splits) and the wide combine for grids of at most two a SM
#:   (#wide_combine).
#: * fp8: halves (#head512), scores ahead from 4096 keys a program (#fp8_ahead) on 3 stages at
#:   heads up to 128 (#ahead_stages), up to four KV heads a program (#kv_heads4), two programs
#:   per SM (#splits), the wide combine at 32 partitions (#fp8_wide).
#: * fp16 partials from 8 combined rows (#fp16_partials); one-stage masked tiles in split
#:   partitions of at most 4096 keys (#decode_generality, #constexpr_tail).
SM80 = LaunchTable(
    decode_tiles={
        (64, 16): DecodeTile(64, 128, 4, 2),
        (64, 32): DecodeTile(32, 64, 4, 2),
        (128, 16): DecodeTile(64, 128, 4, 2),
        (128, 32): DecodeTile(32, 64, 4, 2),
        (256, 16): DecodeTile(32, 64, 4, 2),
        (256, 32): DecodeTile(16, 32, 4, 2),
        (512, 16): DecodeTile(32, 32, 4, 2),
        (512, 32): DecodeTile(16, 16, 8, 2),
    },
    prefill_tiles={
        64: PrefillTiles(Tiles(128, 64, 8, 2), Tiles(128, 128, 8, 2)),
        128: PrefillTiles(Tiles(128, 64, 8, 2), Tiles(128, 128, 8, 2)),
        256: PrefillTiles(Tiles(64, 32, 4, 2)),
        512: PrefillTiles(Tiles(16, 32, 8, 2)),
    },
    fp16=KVPolicy(split=SplitPolicy(), wide_combine=WideCombine()),
    fp8=KVPolicy(
        split=TWO_PER_SM,
        halves=True,
        ahead_min_keys=4096,
        pairing=Pairing(),
        wide_combine=WideCombine(max_pad=128, min_splits=32),
    ),
    ahead_stages={64: 3, 128: 3},
    fp16_partials_min_rows=8,
    one_stage_tail=OneStageTail(),
)


# -- the tensor-core prefill on SM70 (CUDA C++, volta_attn_v100/cuda/prefill.cu) ---------------


@dataclass(frozen=True)
class CudaPrefillTile:
    """A launch shape of the CUDA prefill: keys per tile and warps, each warp 8 query rows."""

    block_n: int
    num_warps: int

    @property
    def block_m(self) -> int:
        """Rows (query token x head of the group) a block owns."""
        return 8 * self.num_warps


#: The compute capability the CUDA prefill is chosen on: ``mma.m8n8k4`` "is optimized for target
#: architecture sm_70 and may have substantially reduced performance on other target
#: architectures" (PTX ISA, mma), and from SM80 on ``tl.dot`` runs on the tensor cores itself.
CUDA_PREFILL_CAPABILITY = (7, 0)

#: KV dtypes the CUDA prefill reads: fp16, and e5m2 widened exactly to fp16 (its byte is the high
#: byte of the fp16). A V100 has no e4m3 cache (:data:`volta_attn_v100.limits.E4M3_MIN_CAPABILITY`).
CUDA_PREFILL_KV_DTYPES = ("float16", "fp8_e5m2")

#: SM70 CUDA prefill tiles by head size: 64 rows on 8 warps (one block per SM: 144-224
#: registers a thread), 64 keys a tile, 32 at head size 256 so Q, K, V^T and the warps' P fit
#: 76 KB of shared memory (36-62 KB below). Every build passes the sm_70 gate
#: (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#cuda_prefill). Head size 512 stays on Triton: its
#: Q and V^T tiles alone pass 96 KB at 64 rows.
SM70_CUDA_PREFILL: Mapping[int, CudaPrefillTile] = {
    64: CudaPrefillTile(64, 8),
    80: CudaPrefillTile(64, 8),
    96: CudaPrefillTile(64, 8),
    128: CudaPrefillTile(64, 8),
    256: CudaPrefillTile(32, 8),
}


# -- the tensor-core decode on SM70 (CUDA C++, volta_attn_v100/cuda/decode.cu) ----------------


@dataclass(frozen=True)
class CudaDecodeTile:
    """A build shape of the CUDA decode: warps per block (each walks its own 8-key tiles of the
    block's partition) and the blocks per SM its registers are bounded for
    (``__launch_bounds__``)."""

    num_warps: int
    min_blocks: int


#: The compute capability the CUDA decode is chosen on: ``mma.m8n8k4`` is Volta's shape ("optimized
#: for target architecture sm_70", PTX ISA, mma), and from SM80 on ``tl.dot`` runs on the tensor
#: cores itself.
CUDA_DECODE_CAPABILITY = (7, 0)

#: KV dtypes the CUDA decode reads: fp16, and e5m2 widened exactly to fp16 (a V100 has no e4m3
#: cache, :data:`volta_attn_v100.limits.E4M3_MIN_CAPABILITY`).
CUDA_DECODE_KV_DTYPES = ("float16", "fp8_e5m2")

#: Rows a CUDA decode block owns (m8n8k4's M) and the most row chunks of 8 a sequence's query
#: tokens x head group may take: each chunk reads the KV head's bytes again (from L2 when the
#: chunks run side by side), so past two chunks the model no longer favours it over the Triton
#: kernel's 16- and 32-row tiles.
CUDA_DECODE_ROWS = 8
CUDA_DECODE_MAX_ROW_CHUNKS = 2

#: SM70 CUDA decode builds by head size: 4 warps, 3 blocks per SM at head size 128 (132-149
#: registers a thread; bounded for 4, the fp16 build spilled 8 B) and 2 at 256 (200-241), 0
#: spills; each warp keeps a tile of K and V in flight
#: (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#cuda_decode).
SM70_CUDA_DECODE: Mapping[int, CudaDecodeTile] = {
    128: CudaDecodeTile(4, 3),
    256: CudaDecodeTile(4, 2),
}
