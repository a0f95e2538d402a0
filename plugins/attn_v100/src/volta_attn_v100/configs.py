"""Tile configurations per device, and the declared limits the kernels are tested for.

Pure Python (no torch, no triton): the plugin module reads the declared limits at discovery,
and ``volta_kernel_configs`` lists every launch configuration without compiling anything.

SM70 and SM80+ get separate tiles. On SM70 ``tl.dot`` runs on the FMA units and the register
file is the limit (docs/kernels.md#sm70-facts): small key tiles (16..32 keys), 4 warps, one
stage since ``num_stages`` does nothing there. On SM80+ (the H100 used for measurements)
``tl.dot`` runs on tensor cores: larger tiles and two stages of software pipelining.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from volta_core import KernelConfig

#: Head sizes the kernels are tested for. 512 is Gemma-4's global layers: on SM70 its tiles fit
#: the register file only with aligned strides (:func:`aligned_strides_required`).
HEAD_SIZES: tuple[int, ...] = (64, 80, 96, 128, 256, 512)

#: Query rows per decode program: 16 serves one token per sequence with up to 16 query heads
#: per KV head; 32 serves speculative verification (up to 8 tokens per sequence; larger head
#: groups are split over several programs).
DECODE_BLOCK_MS: tuple[int, ...] = (16, 32)

#: Most query tokens per sequence on the split-KV decode path (speculative verification).
MAX_DECODE_QUERY_LEN = 8

#: Most KV partitions per sequence: bounds the partial buffers (``num_splits`` floats per head
#: pad and query row) and the combining program's serial walk over them.
MAX_SPLITS = 64

#: KV storage of each declared KV dtype as Triton pointer types (fp8 is stored as bytes).
KV_POINTER_TYPES: dict[str, str] = {"float16": "*fp16", "fp8_e5m2": "*u8", "fp8_e4m3": "*u8"}

#: The lowest compute capability that converts fp8 e4m3 in hardware: Triton's ``fp8e4nv`` does
#: not compile below SM89 (docs/kernels.md#sm70-facts), and the fp8kv plugin refuses e4m3
#: caches there, so an e4m3 cache is declared, launched and compiled from SM89 on only.
E4M3_MIN_CAPABILITY = (8, 9)

#: Declared KV dtypes that need more than the plugin's minimum capability.
KV_DTYPE_MIN_CAPABILITY: dict[str, tuple[int, int]] = {"fp8_e4m3": E4M3_MIN_CAPABILITY}

#: The cache-write kernel's ``KV_FORMAT`` per KV dtype: the ``FMT`` of the host's fp8 codec
#: (:mod:`volta_core.kernel_api`: 1 is e5m2, 2 is e4m3), 0 for an fp16 copy.
KV_FORMAT_CODES: dict[str, int] = {"float16": 0, "fp8_e5m2": 1, "fp8_e4m3": 2}

#: How the attention kernels read fp8 codes as fp16 (their ``FP8_DECODE``); every way is
#: exact, since e5m2 and e4m3 values are all fp16 values. e5m2 is the high byte of an fp16
#: (``byte << 8``, SM70 and the interpreter) or converted in hardware (SM89+); e4m3 is
#: converted in hardware (SM89+) or, under the interpreter, decoded in integer arithmetic by
#: the host's codec (the interpreter's own fp8 conversions are wrong: docs/kernels.md#sm70-facts).
FP8_E5M2_SHIFT = 0
FP8_E5M2_NATIVE = 1
FP8_E4M3_NATIVE = 2
FP8_E4M3_INTEGER = 3

KERNEL_MODULE = "volta_attn_v100.kernels"

#: Warps of the cache-write kernel (one token x KV head per program: a few hundred bytes).
CACHE_WRITE_WARPS = 4


@dataclass(frozen=True)
class Tiles:
    """One launch shape: rows per program, keys per tile, warps and pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class SplitPolicy:
    """How many partitions a decode sequence's context is cut into (split-KV).

    Few sequences leave most SMs idle, so each sequence's keys are split until the grid fills
    the ``programs_per_sm`` decode programs each SM holds at once, but no partition gets fewer
    than ``min_keys_per_split`` keys (a short partition costs its program's fixed work and one
    more partial to combine for little reading), and never more than ``max_splits`` (at most
    :data:`MAX_SPLITS`). Of the two counts around a full wave (the most that fit in one, and
    one more), the one whose last wave is fuller wins, ties going to more partitions: a grid a
    little larger than what the SMs hold runs its last programs nearly alone (fp8 decode, which
    holds 2 programs per SM at sm_90, took 83.9 us at 8 x 8K with 5 partitions, 320 programs,
    and 61.8 us with 4). A batch whose programs already fill the SMs is not split (64 x 4K
    fp16: 360.4 us unsplit, 364.6 in 2). The count depends only on the batch size and the
    length bound, so vLLM's builder can fix it for a CUDA graph. Data, so the benchmark sweep
    can measure other policies.
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

    def num_splits(self, num_programs: int, max_seq_len: int, num_sms: int) -> int:
        """Partitions per sequence for ``num_programs`` (sequences x KV programs) programs."""
        slots = self.programs_per_sm * num_sms
        programs = max(1, num_programs)
        if programs >= slots:
            return 1
        by_length = -(-max_seq_len // self.min_keys_per_split)
        limit = max(1, min(self.max_splits, by_length))
        fewer = min(limit, max(1, slots // programs))
        more = min(limit, fewer + 1)
        if last_wave_fill(programs * more, slots) >= last_wave_fill(programs * fewer, slots):
            return more
        return fewer


def last_wave_fill(programs: int, slots: int) -> float:
    """How full the waves of ``programs`` are on ``slots`` resident places, the last one
    included: 1.0 when the count is a whole number of waves."""
    return programs / (-(-programs // slots) * slots)


#: The shipped split policy of fp16 decode on SM80+: its sm_90 programs take 116-150
#: registers a thread (4 warps), 3-4 per SM; filling whole waves of them made 2-8 x 8K 2-3%
#: faster on the H100 than the previous policy's counts
#: (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#splits).
DEFAULT_SPLIT_POLICY = SplitPolicy()

#: fp8 decode on SM80+ (255 registers a thread at sm_90: 2 programs per SM), and every dtype on
#: SM70 (its FMA tiles take 160-250 registers on 4-8 warps; not measured on a V100). H100,
#: 32/8 heads, fp8: 16 x 8K 114.2 us with 2 partitions against 140.5 with 3, 16 x 16K 218.7
#: against 268.6, 4 x 8K 35.6 (8) against 36.8 (9).
TWO_PER_SM_SPLIT_POLICY = SplitPolicy(programs_per_sm=2)


def split_policy_for(kv_fp8: bool, capability: tuple[int, int]) -> SplitPolicy:
    """The shipped split policy of a decode launch: what the device's decode program holds."""
    if kv_fp8 or is_sm70_class(capability):
        return TWO_PER_SM_SPLIT_POLICY
    return DEFAULT_SPLIT_POLICY


def head_halves(kv_fp8: bool, capability: tuple[int, int]) -> bool:
    """Whether the kernels take the head dimension in two halves (``HALVES``): fp8 KV on SM80+,
    where the converted e5m2 tiles feed ``tl.dot`` from registers and whole ones spilled (H100:
    fp8 decode 0.70-0.76x the fp16 time whole, 0.61-0.63x in halves). fp16 tiles go from
    shared memory straight to the tensor cores, and on SM70 the dot is FMA: whole there. Head
    pad 512 too: its 16-row fp8 decode on the H100 (32/16 heads) took 992 us at 16 x 8K in
    halves against 1107 whole with the same tile (:func:`decode_tiles`;
    docs/perf/attn_v100/PERFORMANCE_HISTORY.md#head512)."""
    return kv_fp8 and not is_sm70_class(capability)


def head_pad(head_size: int) -> int:
    """The power of two a head is padded to inside the kernels."""
    return 1 << (head_size - 1).bit_length()


def aligned_strides_required(head_size: int, capability: tuple[int, int]) -> bool:
    """Whether the launchers refuse strides that are not multiples of 16 (the integer
    arguments the JIT specializes, :data:`ATTENTION_DIVISIBLE`): head pad 512 on SM70. There
    the specialized builds take 246-255 registers with no spill, and the unspecialized ones
    (scalar loads, one 64-bit address per element) spilled 4-160 B (sm_70 gate, 8 warps; 16
    warps spilled in both). Real 512-dim layers always have such strides: the cache rows are
    1024 elements, query and output rows whole heads, blocks multiples of 16."""
    return is_sm70_class(capability) and head_pad(head_size) >= 512


def is_sm70_class(capability: tuple[int, int]) -> bool:
    """Whether ``tl.dot`` runs on FMA units (below SM80 with Triton 3.3+)."""
    return capability < (8, 0)


#: Keys a decode partition must hold (at the longest sequence) for its whole tiles' scores to
#: be taken one iteration ahead (:func:`scores_ahead`).
AHEAD_MIN_KEYS = 4096


def scores_ahead(kv_fp8: bool, capability: tuple[int, int], keys_per_partition: int) -> bool:
    """Whether decode takes each whole tile's scores one iteration ahead (``AHEAD``,
    :func:`volta_attn_v100.kernels.common.attend_tiles`): where the tiles are taken in halves
    (:func:`head_halves`, fp8 on SM80+) and a partition holds at least
    :data:`AHEAD_MIN_KEYS` keys.

    The fp8 loop's pace is set by each iteration's dependent chain at two programs per SM;
    with the next tile's Q.K beside this tile's softmax and P.V, fp8 decode on the H100 took
    1-2% less time where a partition holds 4K keys or more (64 x 8K 0.610 -> 0.597 of fp16's
    time). The first tile's keys are then loaded before the loop, outside its software
    pipeline, which costs short partitions more than the loop gains (1 x 8K, 256 keys a
    partition: 0.862 -> 0.885). fp16 gained nothing (up to 9% slower) and keeps its loop
    (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#fp8_ahead)."""
    return head_halves(kv_fp8, capability) and keys_per_partition >= AHEAD_MIN_KEYS


#: Keys a decode partition may hold at most (at the longest sequence) for its masked tiles to
#: run on one stage (:func:`one_stage_tail`).
ONE_STAGE_TAIL_MAX_KEYS = 4096


#: Fewest rows a decode program combines for its split partials to be stored in fp16.
FP16_PARTIAL_MIN_ROWS = 8


def fp16_partials(capability: tuple[int, int], combine_rows: int) -> bool:
    """Whether a split decode launch stores each partition's partial output normalised by its
    own sum, in fp16 (``PARTIALS_F16``; the running max and sum stay fp32), rather than
    unnormalised in fp32: on SM80+, where the combining program covers at least
    :data:`FP16_PARTIAL_MIN_ROWS` rows (``COMBINE_M``), so that its serial read of every
    partition's rows is half the bytes. A normalised partial is a weighted mean of V rows, so
    fp16 holds its range; the combine weighs it back by its sum in fp32.

    On the H100 this made 8-row combines (64/8 heads) 0-9% faster (fp8 1 x 8K 17.18 -> 15.69
    us) and 4-row ones up to 23% slower, so those keep fp32; SM70 was not measured and keeps
    fp32 (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#fp16_partials)."""
    return not is_sm70_class(capability) and combine_rows >= FP16_PARTIAL_MIN_ROWS


def one_stage_tail(capability: tuple[int, int], num_splits: int, keys_per_partition: int) -> bool:
    """Whether a decode launch runs its masked tiles in one loop of one stage, after the whole
    tiles' pipelined loop (``ONE_STAGE_TAIL``, :func:`volta_attn_v100.kernels.common.attend`):
    on SM80+, split launches whose partitions hold at most :data:`ONE_STAGE_TAIL_MAX_KEYS`
    keys (``keys_per_partition``: at the longest sequence, times the KV heads a program
    walks, as for :func:`scores_ahead`).

    A masked-tile loop on the software pipeline costs its prologue and drain after the whole
    tiles' even where it runs no tile (1.4 us of a 19.4 us 1 x 8K fp16 decode on the H100).
    One stage made every batch-1 split shape 1-11% faster; partitions of 8192 keys (32 x 16K
    fp16) were 14-15% slower with it, and unsplit launches, which fill the GPU with programs,
    need the registers more (118 -> 150 at sm_90, 15-18% slower), so both keep the pipelined
    loop. SM70 keeps the two loops: there every loop has one stage anyway, and the one-stage
    form of head size 64 spilled 4-8 B at sm_70
    (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#decode_generality, #constexpr_tail)."""
    return (
        not is_sm70_class(capability)
        and num_splits > 1
        and keys_per_partition <= ONE_STAGE_TAIL_MAX_KEYS
    )


#: Software-pipeline stages of a decode launch with scores ahead (:func:`ahead_tiles`).
AHEAD_STAGES = 3


def ahead_tiles(tiles: Tiles, head_size: int) -> Tiles:
    """The decode tiles of a launch with scores ahead (:func:`scores_ahead`): the same tile on
    :data:`AHEAD_STAGES` stages for heads up to 128 (padded).

    Without scores ahead, 3 stages made the 128-key fp8 tile 6-9% slower (2 stayed); with
    them, 3 stages took 4% off fp8 decode at head size 128 on the H100 (64 x 8K 0.594 ->
    0.568 of fp16's time; docs/perf/attn_v100/PERFORMANCE_HISTORY.md#ahead_stages). Heads of
    256 and 512 keep 2 stages: at sm_90 their 3-stage builds spilled 100-2108 B (2 stages
    with scores ahead: 60-2084 B), and they were not timed on 3.
    """
    if head_pad(head_size) > 128:
        return tiles
    return replace(tiles, num_stages=AHEAD_STAGES)


#: KV heads one fp8 decode program may walk, most first (:func:`kv_heads_per_program`).
KV_HEADS_PER_PROGRAM: tuple[int, ...] = (4, 2)

#: Least fill of the resident-program waves (:func:`last_wave_fill`) a grid of programs that
#: walk several KV heads must make, unsplit: 256 programs on the H100's 264 slots (0.97) ran
#: 128 x 2K fp8 in 0.576x of the fp16 time against 0.633x one head a program.
PAIRED_MIN_FILL = 0.9


def can_pair_kv_heads(kv_fp8: bool, capability: tuple[int, int], head_size: int) -> bool:
    """Whether a decode launch may walk several KV heads per program: fp8 in halves (SM80+,
    :func:`head_halves`) and heads up to 128 (padded)."""
    return head_halves(kv_fp8, capability) and head_pad(head_size) <= 128


def kv_heads_per_program(
    kv_fp8: bool,
    capability: tuple[int, int],
    head_size: int,
    num_kv_heads: int,
    rows_per_kv_head: int,
    block_m: int,
    unsplit_programs: int,
    keys_per_partition: int,
    num_sms: int,
) -> int:
    """KV heads per decode program: the most of :data:`KV_HEADS_PER_PROGRAM` whose grid still
    fills the GPU unsplit, else 1. A program walking ``P`` heads reads their tiles in turn on
    one software pipeline, every row masked to its own head's tiles, so the batch runs ``P``
    times fewer programs, each ``P`` times longer: fewer program starts and pipeline drains,
    which is what an fp8 cache read in halves is short of: on the H100, 32/8 heads 128 x 2K
    took 0.634, 0.600 and 0.574 of fp16's time with 1, 2 and 4 heads a program, and four heads
    lost where their grid filled half a wave (64 x 4K: 0.750)
    (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#kv_heads4).

    Taken where :func:`can_pair_kv_heads`; ``P`` divides the KV heads; the ``P`` heads' rows
    (``rows_per_kv_head``: query tokens x padded head group, the whole group in one program)
    fit the ``block_m`` rows of the one-head launch (64/8 heads in 32-row programs of four
    heads ran 128 x 2K in 0.75x of fp16); the ``unsplit_programs // P`` programs fill the
    :data:`TWO_PER_SM_SPLIT_POLICY` slots' waves to :data:`PAIRED_MIN_FILL` (the launcher then
    runs them unsplit: the split policy would split a grid of fewer programs than slots again,
    0.634x at 128 x 2K); partitions of at most :data:`AHEAD_MIN_KEYS` keys (the range
    measured) that reach scores ahead ``P`` times over (:func:`scores_ahead`).

    Like the split policy this reads the longest sequence only: a batch whose lengths are far
    apart runs its longest sequence's heads in ``num_kv_heads / P`` programs.
    """
    slots = TWO_PER_SM_SPLIT_POLICY.programs_per_sm * num_sms
    if not can_pair_kv_heads(kv_fp8, capability, head_size) or keys_per_partition > AHEAD_MIN_KEYS:
        return 1
    for kv_per_prog in KV_HEADS_PER_PROGRAM:
        if (
            num_kv_heads % kv_per_prog == 0
            and rows_per_kv_head * kv_per_prog <= block_m
            and last_wave_fill(max(1, unsplit_programs // kv_per_prog), slots) >= PAIRED_MIN_FILL
            and scores_ahead(kv_fp8, capability, keys_per_partition * kv_per_prog)
        ):
            return kv_per_prog
    return 1


def fp8_decode(kv_dtype: str, capability: tuple[int, int]) -> int:
    """The kernels' ``FP8_DECODE`` for a KV dtype on a device (:data:`FP8_E5M2_SHIFT` and
    the rest; 0 for fp16, which reads no codes). ``cvt`` from either fp8 format needs SM89;
    below it (SM70, and the interpreter, which runs SM70 tiles) e5m2 takes the shift and e4m3
    the integer decode, which only the interpreter reaches: the launcher refuses an e4m3
    cache on a GPU below SM89 (:func:`kv_dtype_refusal`)."""
    native = capability >= E4M3_MIN_CAPABILITY
    if kv_dtype == "fp8_e4m3":
        return FP8_E4M3_NATIVE if native else FP8_E4M3_INTEGER
    if kv_dtype == "fp8_e5m2" and native:
        return FP8_E5M2_NATIVE
    return FP8_E5M2_SHIFT


def kv_dtype_refusal(kv_dtype: str, capability: tuple[int, int]) -> str | None:
    """Why a GPU of this capability cannot run a cache of this KV dtype, or None if it can."""
    needed = KV_DTYPE_MIN_CAPABILITY.get(kv_dtype)
    if needed is None or capability >= needed:
        return None
    return (
        f"KV-cache dtype {kv_dtype!r} needs compute capability {needed[0]}.{needed[1]} or newer "
        f"(hardware e4m3 conversion; Triton's fp8e4nv does not compile below it), this device "
        f"has {capability[0]}.{capability[1]}; use fp8_e5m2"
    )


def decode_block_ms(head_size: int, capability: tuple[int, int]) -> tuple[int, ...]:
    """Row counts the decode launcher uses for a head size: :data:`DECODE_BLOCK_MS`, except
    16 only at head pad 256 on SM70 (32 rows spill there, see :func:`decode_tiles`; larger
    head groups are split over more programs instead)."""
    if is_sm70_class(capability) and head_pad(head_size) > 128:
        return DECODE_BLOCK_MS[:1]
    return DECODE_BLOCK_MS


def decode_block_m(
    head_size: int, query_len_pad: int, group_pad: int, capability: tuple[int, int]
) -> int:
    """Rows per decode program: the fewest of :func:`decode_block_ms` that hold every query
    token of a sequence for up to 16 heads of its group, else the most (head groups are then
    split over programs)."""
    choices = decode_block_ms(head_size, capability)
    wanted = query_len_pad * min(group_pad, 16)
    return next((m for m in choices if wanted <= m), choices[-1])


#: Fewest rows the partitions' combine is compiled for: 1 and 2 (MQA, one token) run as 4,
#: with the extra rows masked, rather than as two more builds of the decode kernel.
MIN_COMBINE_ROWS = 4

#: Partial-output floats the combining program loads per L2 round trip: 8 partitions of 4
#: rows x 128 (a 32/8-head decode), 2 of 16 rows x 128. At sm_90 the 16-row fp16 decode then
#: takes 112-116 registers (the unrolled per-partition combine it replaces: 118); 8192 took
#: 146 and spilled 16 B at 4 rows, and at sm_70 spilled 8-20 B at head sizes 80 and 96.
COMBINE_FLOATS = 4096

#: Partial floats per step of the wide combine (:func:`wide_combine`): all 32 partitions of
#: 4 rows x 128 in one L2 round trip, 16 of 8 rows. H100, 32/8 heads, fp16: 1 x 8K
#: 18.6-19.1 us against 20.0-20.4 with :data:`COMBINE_FLOATS`, 64/8 19.8-20.1 against
#: 22.0-23.1, 1 x 32K 52.2-54.2 against 53.9-55.0. The combine then takes 168-186 registers
#: at sm_90, so an SM holds 2 programs instead of 3-4: 32 x 16K (512 programs) took 806-828 us
#: with it against 689-714, and fp8 at 8 x 8K (255 registers either way, more spilled) 65.2
#: against 62.1 (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#wide_combine).
WIDE_COMBINE_FLOATS = 16384

#: Most decode programs per SM for which a launch takes the wide combine.
WIDE_COMBINE_PROGRAMS_PER_SM = 2

#: Most partitions per combine step (the default split policy's most partitions).
MAX_SPLIT_CHUNK = 32


#: Fewest partitions an fp8 decode launch combines for it to take the wide combine
#: (:func:`wide_combine`): the split policy's most, which it gives batches of one sequence.
WIDE_FP8_MIN_SPLITS = 32


def wide_combine(
    kv_fp8: bool,
    capability: tuple[int, int],
    head_size: int,
    num_programs: int,
    num_sms: int,
    num_splits: int,
) -> bool:
    """Whether a decode launch of ``num_programs`` programs, each sequence's keys cut into
    ``num_splits`` partitions, combines its partitions in the fewest steps
    (:data:`WIDE_COMBINE_FLOATS`): on SM80+, where the SMs hold the grid at
    :data:`WIDE_COMBINE_PROGRAMS_PER_SM` programs each, for an fp16 cache, and for an fp8
    cache from :data:`WIDE_FP8_MIN_SPLITS` partitions with heads up to 128 (padded). There
    the combine is the serial tail of a step that reads little (a batch of one or two
    sequences), and the registers its wider loads take cost no occupancy. SM70 spills at the
    narrow step already.

    fp8 decode programs take 255 registers either way and spill more with the wide combine,
    which lost up to 1.2% on the H100 where it saves little (4-16 partitions) and won 3-13%
    with 32 partitions, whose narrow combine takes 4 steps at 32/8 heads and 8 at 64/8 (1 x 8K
    at 64/8: 0.886 -> 0.773 of fp16's time; docs/perf/attn_v100/PERFORMANCE_HISTORY.md#fp8_wide).
    Larger fp8 heads, which spill 84-160 B at sm_90 already, were not timed with it and keep
    the narrow step."""
    if is_sm70_class(capability) or num_programs > WIDE_COMBINE_PROGRAMS_PER_SM * num_sms:
        return False
    if not kv_fp8:
        return True
    return head_pad(head_size) <= 128 and num_splits >= WIDE_FP8_MIN_SPLITS


def decode_combine(
    block_m: int,
    query_len_pad: int,
    group_pad: int,
    head_size: int,
    capability: tuple[int, int],
    wide: bool = False,
    floats: int = COMBINE_FLOATS,
    wide_floats: int = WIDE_COMBINE_FLOATS,
) -> tuple[int, int]:
    """``(COMBINE_M, SPLIT_CHUNK)`` of a decode launch: the rows the partitions' combine
    covers (every row the program owns: ``query_len_pad`` tokens times its share of the head
    group, a power of two) and how many partitions it loads per step, so that a step holds
    about ``floats`` floats, or ``wide_floats`` for a launch that takes the wide combine
    (:func:`wide_combine`), whatever the rows and head size (the sweep tries other sizes).
    A partition whose rows alone hold more than ``floats`` (32 rows of head size 256) keeps
    one partition per step even so: two spilled 68 B at sm_90."""
    rows = max(MIN_COMBINE_ROWS, min(block_m, query_len_pad * group_pad))
    if is_sm70_class(capability) and rows > MIN_COMBINE_ROWS:
        # 8 rows at head sizes 80 and 96 (4 warps, any-size build) spilled 12-28 B at sm_70
        # whatever the chunk; the whole block does not.
        rows = block_m
    partition = rows * head_pad(head_size)
    step = wide_floats if wide and partition <= floats else floats
    return rows, max(1, min(MAX_SPLIT_CHUNK, step // partition))


def decode_launches(
    head_size: int, capability: tuple[int, int], kv_fp8: bool = False, kv_per_prog: int = 1
) -> list[tuple[int, int, int]]:
    """Every ``(BLOCK_M, COMBINE_M, SPLIT_CHUNK)`` the decode launcher can pick for a head size
    and KV dtype (all query-length and head-group pads, wide combine or not), for the gate to
    compile; with ``kv_per_prog`` over 1, those of launches walking that many KV heads per
    program (:func:`kv_heads_per_program`: every head's rows in the one-head row count, the
    combine covering them)."""
    found: list[tuple[int, int, int]] = []
    q_pads = [1 << i for i in range(MAX_DECODE_QUERY_LEN.bit_length())]
    # The launcher's choice for the smallest grid split the most, and for one too large for
    # any GPU. Launches walking several KV heads fill the GPU unsplit (kv_heads_per_program),
    # more programs than the wide combine is taken for at any partition count.
    grids = ((1, MAX_SPLITS), (1 << 30, 1)) if kv_per_prog == 1 else ((1 << 30, 1),)
    wides = {wide_combine(kv_fp8, capability, head_size, n, 1, s) for n, s in grids}
    if kv_per_prog > 1 and not can_pair_kv_heads(kv_fp8, capability, head_size):
        return found
    for q_pad, wide in itertools.product(q_pads, sorted(wides)):
        for group_pad in (1 << i for i in range(8)):
            block_m = decode_block_m(head_size, q_pad, group_pad, capability)
            if q_pad * group_pad * kv_per_prog > block_m:
                continue
            rows = group_pad * kv_per_prog
            combine = decode_combine(block_m, q_pad, rows, head_size, capability, wide)
            if (block_m, *combine) not in found:
                found.append((block_m, *combine))
    return sorted(found)


def decode_tiles(
    head_size: int, block_m: int, capability: tuple[int, int], kv_fp8: bool = False
) -> Tiles:
    """Tiles of the split-KV decode kernel for a head size, a row count and the KV dtype.

    SM70: 16 keys per tile, one stage; the warps are what the compile gate passes with no
    spill for both builds the JIT makes (strides specialized as multiples of 16, and not),
    with the partitions' combine in the kernel:

    ============  ===========  ===========
    head pad      16 rows      32 rows
    ============  ===========  ===========
    64            8            16
    128           4            8
    256           8            (not used)
    ============  ===========  ===========

    Head pad 512 takes 8 warps and 16 rows, gated in its specialized build only
    (:func:`aligned_strides_required`). 16 warps (ptxas then caps a thread at 128 registers)
    spilled 36-112 B in the unspecialized
    build at head pad 128 with 32 rows and at 256 with 16 once the combine joined the kernel;
    8 warps take 160-240 registers there and do not spill. At head pad 256 no warp count
    keeps 32 rows from spilling (4: ~2 KB, 8: ~300 B, 16: 228 B), so 256-dim heads run 16 rows
    (:func:`decode_block_ms`). At head pad 64 with 32 rows, 8 warps spilled 20 B once the sink
    logits were loaded before the key loop (ptxas held the thread to 128 registers); 16 warps
    take 93-104 registers there. On SM80+ an fp8 cache takes twice the keys per tile of fp16, so
    one tile moves the same bytes in half the iterations. Head pad 512 takes 32 keys on 4 warps
    with 16 rows for both dtypes (H100, 32/16 heads: 16 x 8K fp16 1409 us, 101.9% of
    copy, against 1524 on 8 warps; fp8 992 against 1502; 64 keys on 8 warps within 1%), and 16
    keys on 8 warps with 32 rows (sm_90: no spill for fp16, 600 B for fp8 in halves; the 4-warp
    32-row tiles of smaller heads spilled 240 B and 2.9 KB there; not timed). History:
    docs/perf/attn_v100/PERFORMANCE_HISTORY.md#head512.
    """
    pad = head_pad(head_size)
    if is_sm70_class(capability):
        if pad <= 64:
            warps = 8 if block_m <= 16 else 16
        elif pad <= 128:
            warps = 4 if block_m <= 16 else 8
        else:
            warps = 8
        return Tiles(block_m, 16, warps, 1)
    if pad >= 512:
        return Tiles(16, 32, 4, 2) if block_m <= 16 else Tiles(block_m, 16, 8, 2)
    widen = 2 if kv_fp8 else 1
    if block_m <= 16:
        return Tiles(block_m, (64 if pad <= 128 else 32) * widen, 4, 2)
    return Tiles(block_m, (32 if pad <= 128 else 16) * widen, 4, 2)


#: Longest query (tokens of one sequence in the step) from which SM80+ prefill of heads up to
#: 128 takes 128 keys per tile instead of 64 (:func:`prefill_tiles`).
LONG_PREFILL_QUERY = 1024


def prefill_tiles(head_size: int, capability: tuple[int, int], max_query_len: int) -> Tiles:
    """Tiles of the prefill kernel for a head size and the step's longest query.

    On SM70 the FMA-unrolled dots fill the register file; the gate passes, with no spill in
    either build the JIT makes: 32 rows x 16 keys on 8 warps at head pad 64, 16 rows on 4 warps
    at 128 (32 rows spilled 24 B with specialized strides on 8 warps, 224 B unspecialized on 4),
    16 rows on 8 warps at 256 and 512 (512 gated in its specialized build only,
    :func:`aligned_strides_required`).

    On SM80+ (H100, 32/8 heads, 16K new tokens, both tiles with the one-loop kernel;
    docs/perf/attn_v100/PERFORMANCE_HISTORY.md#prefill_one_loop): 128 keys per tile won from
    1024-token queries on (1.82-1.84 ms against 2.06 at 4 x 4096, 1.02-1.05 against 1.08-1.11
    at 8 x 2048, 0.649-0.650 against 0.662-0.665 at 16 x 1024; fp8 KV at 8 x 2048 1.04-1.10
    against 1.24-1.27), 64 keys at 512 (0.424-0.428 against 0.437-0.440). The query length is
    known on the host for every prefill launch (vLLM runs attention outside its CUDA graphs
    when a step holds a prefill).
    """
    pad = head_pad(head_size)
    if is_sm70_class(capability):
        if pad <= 64:
            return Tiles(32, 16, 8, 1)
        return Tiles(16, 16, 4 if pad <= 128 else 8, 1)
    if pad <= 128:
        return Tiles(128, 128 if max_query_len >= LONG_PREFILL_QUERY else 64, 8, 2)
    if pad >= 512:
        # 64 x 32 on 4 warps needed 196 KB of shared memory and spilled 3 KB at sm_90.
        return Tiles(16, 32, 8, 2)
    return Tiles(64, 32, 4, 2)


def prefill_tile_choices(head_size: int, capability: tuple[int, int]) -> list[Tiles]:
    """Every tile :func:`prefill_tiles` picks for a head size, whatever the query length."""
    found: list[Tiles] = []
    for max_query_len in (1, LONG_PREFILL_QUERY):
        tiles = prefill_tiles(head_size, capability, max_query_len)
        if tiles not in found:
            found.append(tiles)
    return found


_DECODE_SIGNATURE_HEAD = {
    "q_ptr": "*fp16",
    "kv_ptr": "*fp16",
    "bt_ptr": "*i32",
    "seq_lens_ptr": "*i32",
    "q_start_ptr": "*i32",
    "k_scale_ptr": "*fp32",
    "v_scale_ptr": "*fp32",
}
_DECODE_SIGNATURE_TAIL = {
    "sinks_ptr": "*fp32",
    "out_ptr": "*fp16",
    "part_acc_ptr": "*fp32",
    "part_ml_ptr": "*fp32",
    "counter_ptr": "*i32",
    "sm_scale": "fp32",
    "softcap": "fp32",
    **{
        name: "i32"
        for name in [
            "window",
            "has_sinks",
            "group",
            "heads_per_prog",
            "head_chunks",
            "num_q_heads",
            "num_splits",
            "scale_stride",
            "stride_qt",
            "stride_qh",
            "stride_blk",
            "stride_kvh",
            "stride_slot",
            "stride_bt",
            "stride_ot",
            "stride_oh",
        ]
    },
}
_PREFILL_SIGNATURE_TAIL = {
    "sinks_ptr": "*fp32",
    "out_ptr": "*fp16",
    "sm_scale": "fp32",
    "softcap": "fp32",
    **{
        name: "i32"
        for name in [
            "window",
            "has_sinks",
            "group",
            "heads_per_prog",
            "head_chunks",
            "num_seqs",
            "scale_stride",
            "stride_qt",
            "stride_qh",
            "stride_blk",
            "stride_kvh",
            "stride_slot",
            "stride_bt",
            "stride_ot",
            "stride_oh",
        ]
    },
}
#: Integer arguments that are multiples of 16 at every launch with a declared head size and
#: block size (head sizes 64..256 and blocks of 16k make every stride one); the JIT
#: specializes them, and the gate compiles them so (:class:`KernelConfig.divisible_by_16`).
_KV_STRIDES = ("stride_blk", "stride_kvh", "stride_slot")
ATTENTION_DIVISIBLE = (*_KV_STRIDES, "stride_qt", "stride_qh", "stride_ot", "stride_oh")
_CACHE_WRITE_DIVISIBLE = (
    "page_size",
    *_KV_STRIDES,
    "stride_kt",
    "stride_kh",
    "stride_vt",
    "stride_vh",
)

#: The block size (KV page) the gate compiles the attention kernels for, which take it as a
#: constant (``PAGE_SIZE``): vLLM's default. Every multiple of 16 is declared; a launch with
#: another compiles its own build, which differs only in the constant of a division.
GATE_PAGE_SIZE = 16

#: Most elements a KV cache may span (its highest element offset plus one) for the attention
#: kernels to address its rows with 32-bit offsets (:func:`cache_offsets_32`).
OFFSETS_32_SPAN = 2**31


def cache_offsets_32(span: int) -> bool:
    """Whether the attention kernels address a KV cache of ``span`` elements (from its first
    to its last, through its strides) with 32-bit row offsets (``CACHE_OFFSETS_32``), else
    64-bit ones. Each partial sum of a row's offset is at most the cache's highest offset, so
    32 bits hold them wherever that one fits. vLLM sizes one cache per layer (or per group of
    layers sharing it), so only a cache of 2^31 elements or more, 4 GiB of fp16 or 2 GiB of
    e5m2, takes the 64-bit build. On the H100 32-bit offsets made every decode shape timed but
    one (0.7% slower) 0-2.5% faster and prefill 0-2.4%, with bit-identical outputs
    (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#offsets_32)."""
    return span <= OFFSETS_32_SPAN


def _attention_constexprs(
    head_size: int, tiles: Tiles, kv_dtype: str, capability: tuple[int, int], offsets_32: bool
) -> dict[str, int | bool]:
    """The compile-time arguments the decode and prefill kernels share, as the launchers pass
    them."""
    fp8 = kv_dtype != "float16"
    return {
        "HEAD_SIZE": head_size,
        "HEAD_PAD": head_pad(head_size),
        "BLOCK_M": tiles.block_m,
        "BLOCK_N": tiles.block_n,
        "KV_FP8": fp8,
        "FP8_DECODE": fp8_decode(kv_dtype, capability),
        "HALVES": head_halves(fp8, capability),
        "PAGE_SIZE": GATE_PAGE_SIZE,
        "CACHE_OFFSETS_32": offsets_32,
    }


def decode_kernel_config(
    name: str,
    head_size: int,
    kv_dtype: str,
    tiles: Tiles,
    capability: tuple[int, int],
    combine: tuple[int, int],
    ahead: bool = False,
    kv_per_prog: int = 1,
    tail: bool = False,
    offsets_32: bool = True,
) -> KernelConfig:
    """The decode kernel's launch configuration for these tiles, ``(COMBINE_M,
    SPLIT_CHUNK)`` (with the partials' dtype, :func:`fp16_partials`), ``AHEAD``,
    ``KV_PER_PROG``, ``ONE_STAGE_TAIL`` and ``CACHE_OFFSETS_32`` (shipped ones, or the
    benchmark sweep's variants, which are compiled for sm_90 in the tests before a GPU runs
    them)."""
    partials_f16 = fp16_partials(capability, combine[0])
    return KernelConfig(
        name=name,
        kernel=f"{KERNEL_MODULE}:paged_decode_kernel",
        signature={
            **_DECODE_SIGNATURE_HEAD,
            "kv_ptr": KV_POINTER_TYPES[kv_dtype],
            **_DECODE_SIGNATURE_TAIL,
            "part_acc_ptr": "*fp16" if partials_f16 else "*fp32",
        },
        constexprs={
            **_attention_constexprs(head_size, tiles, kv_dtype, capability, offsets_32),
            "PARTIALS_F16": partials_f16,
            "COMBINE_M": combine[0],
            "SPLIT_CHUNK": combine[1],
            "AHEAD": ahead,
            "KV_PER_PROG": kv_per_prog,
            "ONE_STAGE_TAIL": tail,
        },
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        divisible_by_16=ATTENTION_DIVISIBLE,
        divisibility_enforced=aligned_strides_required(head_size, capability),
    )


def _offsets_64(config: KernelConfig) -> KernelConfig:
    """An attention configuration's build for a cache too large for 32-bit row offsets
    (:func:`cache_offsets_32`), named with ``_offsets64``."""
    constexprs = {**config.constexprs, "CACHE_OFFSETS_32": False}
    return replace(config, name=f"{config.name}_offsets64", constexprs=constexprs)


def kernel_configs(capability: tuple[int, int]) -> list[KernelConfig]:
    """Every configuration the launchers would use on a device of this capability: each
    attention build with 32-bit cache offsets, then, on SM70 (what the gate must see
    exactly), each again with 64-bit ones (:func:`cache_offsets_32`). On SM80+ the 64-bit
    builds are left out of the list, whose use there is CI's sm_90 compile check: they differ
    from the listed builds only in one integer's width, listing them doubled that check's
    time, and the GPU tests compile and run them on the H100 (the 64-bit build forced, and a
    real cache past 2^31 elements). From SM89 on, e4m3 builds join the list
    (:func:`_e4m3_builds`)."""
    configs: list[KernelConfig] = []
    kv_dtypes = ("float16", "fp8_e5m2")
    for head_size in HEAD_SIZES:
        pad = head_pad(head_size)
        for kv_dtype in kv_dtypes:
            kv_sig = dict(_DECODE_SIGNATURE_HEAD, kv_ptr=KV_POINTER_TYPES[kv_dtype])
            fp8 = kv_dtype != "float16"
            # The launcher's choice for the shortest partition and for the longest.
            aheads = sorted({scores_ahead(fp8, capability, k) for k in (1, 1 << 30)})
            # The masked-tile loop's forms: unsplit, and split in short partitions.
            tails = sorted({one_stage_tail(capability, s, 1) for s in (1, 2)})
            for (block_m, rows, chunk), ahead, tail in itertools.product(
                decode_launches(head_size, capability, fp8), aheads, tails
            ):
                tiles = decode_tiles(head_size, block_m, capability, fp8)
                configs.append(
                    decode_kernel_config(
                        f"decode_d{head_size}_m{block_m}_c{rows}x{chunk}_{kv_dtype}"
                        f"{'_ahead' if ahead else ''}{'_tail1' if tail else ''}",
                        head_size,
                        kv_dtype,
                        ahead_tiles(tiles, head_size) if ahead else tiles,
                        capability,
                        (rows, chunk),
                        ahead,
                        tail=tail,
                    )
                )
            for kv_per_prog, tail in itertools.product(KV_HEADS_PER_PROGRAM, tails):
                launches = decode_launches(head_size, capability, fp8, kv_per_prog)
                for block_m, rows, chunk in launches:
                    tiles = decode_tiles(head_size, block_m, capability, fp8)
                    configs.append(
                        decode_kernel_config(
                            f"decode_d{head_size}_m{block_m}_c{rows}x{chunk}_{kv_dtype}"
                            f"_kv{kv_per_prog}{'_tail1' if tail else ''}",
                            head_size,
                            kv_dtype,
                            ahead_tiles(tiles, head_size),
                            capability,
                            (rows, chunk),
                            True,
                            kv_per_prog,
                            tail,
                        )
                    )
            choices = prefill_tile_choices(head_size, capability)
            for tiles in choices:
                # Named by head size and dtype alone where one tile serves every query length.
                keys = f"_n{tiles.block_n}" if len(choices) > 1 else ""
                configs.append(
                    KernelConfig(
                        name=f"prefill_d{head_size}{keys}_{kv_dtype}",
                        kernel=f"{KERNEL_MODULE}:paged_prefill_kernel",
                        signature={**kv_sig, **_PREFILL_SIGNATURE_TAIL},
                        constexprs=_attention_constexprs(
                            head_size, tiles, kv_dtype, capability, True
                        ),
                        num_warps=tiles.num_warps,
                        num_stages=tiles.num_stages,
                        divisible_by_16=ATTENTION_DIVISIBLE,
                        divisibility_enforced=aligned_strides_required(head_size, capability),
                    )
                )
        for kv_dtype in kv_dtypes:
            configs.append(
                KernelConfig(
                    name=f"cache_write_d{head_size}_{kv_dtype}",
                    kernel=f"{KERNEL_MODULE}:cache_write_kernel",
                    signature={
                        "key_ptr": "*fp16",
                        "value_ptr": "*fp16",
                        "kv_ptr": KV_POINTER_TYPES[kv_dtype],
                        "slot_ptr": "*i64",
                        "k_inv_scale_ptr": "*fp32",
                        "v_inv_scale_ptr": "*fp32",
                        **{
                            name: "i32"
                            for name in (
                                "scale_stride",
                                "page_size",
                                "stride_kt",
                                "stride_kh",
                                "stride_vt",
                                "stride_vh",
                                "stride_blk",
                                "stride_kvh",
                                "stride_slot",
                            )
                        },
                    },
                    constexprs={
                        "HEAD_SIZE": head_size,
                        "HEAD_PAD": pad,
                        "KV_FORMAT": KV_FORMAT_CODES[kv_dtype],
                    },
                    num_warps=CACHE_WRITE_WARPS,
                    num_stages=1,
                    divisible_by_16=_CACHE_WRITE_DIVISIBLE,
                )
            )
    if capability >= E4M3_MIN_CAPABILITY:
        configs += _e4m3_builds(configs, capability)
    if not is_sm70_class(capability):
        return configs
    return [*configs, *(_offsets_64(c) for c in configs if c.constexprs.get("CACHE_OFFSETS_32"))]


def _e4m3_builds(configs: list[KernelConfig], capability: tuple[int, int]) -> list[KernelConfig]:
    """The e4m3 builds listed beside the e5m2 ones (SM89+): every prefill and cache-write
    build, and each head size's first decode build. The e4m3 twin of any attention build
    differs from it only in the instruction that converts a code (``FP8_DECODE``); listing
    every decode twin would add as many compiles as the fp8 decode builds already take in
    CI's sm_90 check (about 10 minutes), and the H100 GPU tests compile
    and run the e4m3 decode in every form the launcher picks (split and not, scores ahead,
    two and four KV heads a program, every head size and feature)."""
    twins: list[KernelConfig] = []
    decode_heads: set[int] = set()
    for config in configs:
        if "_fp8_e5m2" not in config.name:
            continue
        head_size = int(config.constexprs["HEAD_SIZE"])
        if config.name.startswith("decode"):
            if head_size in decode_heads:
                continue
            decode_heads.add(head_size)
        constexprs = dict(config.constexprs)
        if "KV_FORMAT" in constexprs:
            constexprs["KV_FORMAT"] = KV_FORMAT_CODES["fp8_e4m3"]
        else:
            constexprs["FP8_DECODE"] = fp8_decode("fp8_e4m3", capability)
        name = config.name.replace("_fp8_e5m2", "_fp8_e4m3")
        twins.append(replace(config, name=name, constexprs=constexprs))
    return twins
