"""What follows from a table's entries (:mod:`volta_attn_v100.tables`): builds, their constants
and NVRTC options, and the launches (grids, head groups, partitions) of a call.

Pure Python (no torch, no triton). :func:`decode_launch` and :func:`prefill_launch` make the
Triton launch a table gives a call, :func:`cuda_decode_launch` and :func:`cuda_prefill_launch`
the SM70 CUDA kernels' (``cuda/*.cu``, whose sources and options are here); which of them a call
gets on a device is :mod:`volta_attn_v100.dispatch`'s answer, and the gate's configurations are
made there of the same :class:`DecodeBuild` and :class:`AttentionBuild` through the helpers
below, so the gate compiles what the launchers run.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from importlib.resources import files

from volta_attn_v100.limits import fp8_decode, head_pad
from volta_attn_v100.tables import (
    CUDA_DECODE_ROWS,
    SM70_CUDA_DECODE,
    SM70_CUDA_PREFILL,
    CudaDecodeTile,
    CudaPrefillTile,
    KVPolicy,
    LaunchTable,
    Pairing,
    PrefillTiles,
    SplitPolicy,
    Tiles,
)
from volta_core.kernel_api import with_prelude

#: Heads of a group the decode rows are sized for: the fewest rows that hold every query token
#: of a sequence for this many heads (a larger group is split over programs).
GROUP_ROWS_HEADS = 16

#: The block size (KV page) the gate compiles the attention kernels for, which take it as a
#: constant (``PAGE_SIZE``): vLLM's default; a launch with another compiles its own build,
#: which differs only in the constant of a division.
GATE_PAGE_SIZE = 16

#: Integer arguments that are multiples of 16 at every launch with a declared head size and
#: block size; the JIT specializes them, and the gate compiles them so
#: (:class:`KernelConfig.divisible_by_16`).
ATTENTION_DIVISIBLE = (
    "stride_blk",
    "stride_kvh",
    "stride_slot",
    "stride_qt",
    "stride_qh",
    "stride_ot",
    "stride_oh",
)


def pow2_at_least(n: int) -> int:
    """The smallest power of two at least ``n`` (1 for ``n`` <= 1)."""
    return 1 << (max(n, 1) - 1).bit_length()


def last_wave_fill(programs: int, slots: int) -> float:
    """How full the waves of ``programs`` are on ``slots`` resident places, the last one
    included: 1.0 when the count is a whole number of waves."""
    return programs / (-(-programs // slots) * slots)


def policy_splits(policy: SplitPolicy, num_programs: int, max_seq_len: int, num_sms: int) -> int:
    """Partitions per sequence under ``policy`` for ``num_programs`` (sequences x KV programs)
    programs (:class:`~volta_attn_v100.tables.SplitPolicy` states the rule)."""
    slots = policy.programs_per_sm * num_sms
    programs = max(1, num_programs)
    if programs >= slots:
        return 1
    by_length = -(-max_seq_len // policy.min_keys_per_split)
    limit = max(1, min(policy.max_splits, by_length))
    fewer = min(limit, max(1, slots // programs))
    more = min(limit, fewer + 1)
    if last_wave_fill(programs * more, slots) >= last_wave_fill(programs * fewer, slots):
        return more
    return fewer


def prefill_tile_choices(entry: PrefillTiles) -> list[Tiles]:
    """Every tile a prefill of this entry's head pad may take."""
    return [entry.short] if entry.long in (None, entry.short) else [entry.short, entry.long]


def prefill_tiles(entry: PrefillTiles, max_query_len: int) -> Tiles:
    """The entry's tile for a step whose longest query has ``max_query_len`` tokens."""
    if entry.long is not None and max_query_len >= entry.long_query:
        return entry.long
    return entry.short


@dataclass(frozen=True)
class AttentionBuild:
    """The compile-time arguments both attention kernels take."""

    head_size: int
    tiles: Tiles
    kv_fp8: bool
    fp8_decode: int
    halves: bool
    offsets_32: bool = True
    page_size: int = GATE_PAGE_SIZE

    def constexprs(self) -> dict[str, int | bool]:
        return {
            "HEAD_SIZE": self.head_size,
            "HEAD_PAD": head_pad(self.head_size),
            "BLOCK_M": self.tiles.block_m,
            "BLOCK_N": self.tiles.block_n,
            "KV_FP8": self.kv_fp8,
            "FP8_DECODE": self.fp8_decode,
            "HALVES": self.halves,
            "PAGE_SIZE": self.page_size,
            "CACHE_OFFSETS_32": self.offsets_32,
        }


@dataclass(frozen=True)
class DecodeBuild(AttentionBuild):
    """One build of the decode kernel: the shared arguments, whether it splits the context
    and the combine's, scores ahead, KV heads per program and the masked tiles' loop."""

    partials_f16: bool = False
    combine_m: int = 4
    split_chunk: int = 1
    ahead: bool = False
    kv_per_prog: int = 1
    one_stage_tail: bool = False
    split: bool = True

    def unsplit(self) -> DecodeBuild:
        """This build for launches of one partition: no combine, so its constants take fixed
        values, and every unsplit launch of the same tiles is one build."""
        return replace(self, split=False, partials_f16=False, combine_m=4, split_chunk=1)

    def constexprs(self) -> dict[str, int | bool]:
        return {
            **super().constexprs(),
            "PARTIALS_F16": self.partials_f16,
            "COMBINE_M": self.combine_m,
            "SPLIT_CHUNK": self.split_chunk,
            "AHEAD": self.ahead,
            "KV_PER_PROG": self.kv_per_prog,
            "ONE_STAGE_TAIL": self.one_stage_tail,
            "SPLIT": self.split,
        }


@dataclass(frozen=True)
class DecodeLaunch:
    """A decode call: its build, grid ``(sequences, kv_programs, num_splits)`` and the head
    groups its programs take."""

    build: DecodeBuild
    kv_programs: int
    num_splits: int
    heads_per_prog: int
    head_chunks: int


@dataclass(frozen=True)
class PrefillLaunch:
    """A prefill call: its build, grid ``(query blocks, kv_programs)`` and head groups."""

    build: AttentionBuild
    grid: tuple[int, int]
    heads_per_prog: int
    head_chunks: int


def decode_rows(table: LaunchTable, head_size: int) -> tuple[int, ...]:
    """Row counts a decode launch of this head size may take (the table's, fewest first)."""
    pad = head_pad(head_size)
    return tuple(sorted(rows for p, rows in table.decode_tiles if p == pad))


def decode_block_m(table: LaunchTable, head_size: int, query_len_pad: int, group_pad: int) -> int:
    """Rows per decode program: the fewest that hold every query token of a sequence for up to
    :data:`GROUP_ROWS_HEADS` heads of its group, else the most (head groups are then split over
    programs)."""
    choices = decode_rows(table, head_size)
    wanted = query_len_pad * min(group_pad, GROUP_ROWS_HEADS)
    return next((m for m in choices if wanted <= m), choices[-1])


def decode_tiles(table: LaunchTable, head_size: int, block_m: int, kv_fp8: bool) -> Tiles:
    """The decode tile of a head size, row count and KV dtype (an fp8 cache takes the entry's
    ``fp8_block_n`` keys)."""
    entry = table.decode_tiles[(head_pad(head_size), block_m)]
    keys = entry.fp8_block_n if kv_fp8 else entry.block_n
    return Tiles(block_m, keys, entry.num_warps, entry.num_stages)


def ahead_tiles(table: LaunchTable, tiles: Tiles, head_size: int) -> Tiles:
    """The decode tile of a launch with scores ahead: the table's stages for the head pad."""
    stages = table.ahead_stages.get(head_pad(head_size))
    return tiles if stages is None else replace(tiles, num_stages=stages)


def takes_ahead(policy: KVPolicy, walked_keys: int) -> bool:
    """Whether a decode program walking ``walked_keys`` keys takes scores ahead."""
    return policy.ahead_min_keys is not None and walked_keys >= policy.ahead_min_keys


def takes_one_stage_tail(table: LaunchTable, num_splits: int, keys_per_partition: int) -> bool:
    """Whether a decode launch runs its masked tiles in one loop of one stage."""
    tail = table.one_stage_tail
    if tail is None:
        return False
    return num_splits >= tail.min_splits and keys_per_partition <= tail.max_keys


def takes_wide_combine(
    policy: KVPolicy, head_size: int, num_programs: int, num_sms: int, num_splits: int
) -> bool:
    """Whether a split decode of ``num_programs`` programs combines in the wide steps."""
    wide = policy.wide_combine
    return (
        wide is not None
        and num_programs <= wide.max_programs_per_sm * num_sms
        and (wide.max_pad is None or head_pad(head_size) <= wide.max_pad)
        and num_splits >= wide.min_splits
    )


def decode_combine(
    table: LaunchTable,
    block_m: int,
    query_len_pad: int,
    group_pad: int,
    head_size: int,
    wide_floats: int | None = None,
) -> tuple[int, int]:
    """``(COMBINE_M, SPLIT_CHUNK)``: the rows the combine covers and the partitions it loads a
    step, about the table's floats a step (``wide_floats`` for a wide combine, unless one
    partition's rows alone hold more than the narrow step)."""
    combine = table.combine
    rows = max(combine.min_rows, min(block_m, query_len_pad * group_pad))
    if combine.whole_block and rows > combine.min_rows:
        rows = block_m
    partition = rows * head_pad(head_size)
    step = combine.floats
    if wide_floats is not None and partition <= combine.floats:
        step = wide_floats
    return rows, max(1, min(combine.max_chunk, step // partition))


def fp16_partials(table: LaunchTable, combine_m: int) -> bool:
    """Whether a split decode combining ``combine_m`` rows stores fp16 partials."""
    return table.fp16_partials_min_rows is not None and combine_m >= table.fp16_partials_min_rows


def kv_heads_per_program(
    pairing: Pairing | None,
    head_size: int,
    num_kv_heads: int,
    rows_per_kv_head: int,
    block_m: int,
    unsplit_programs: int,
    keys_per_partition: int,
    num_sms: int,
) -> int:
    """KV heads per decode program under ``pairing`` (:class:`~volta_attn_v100.tables.Pairing`),
    1 where it allows none. It reads the longest sequence only, as the split policy does."""
    if (
        pairing is None
        or head_pad(head_size) > pairing.max_pad
        or keys_per_partition > pairing.max_keys
    ):
        return 1
    slots = pairing.programs_per_sm * num_sms
    for kv_per_prog in pairing.kv_heads:
        if (
            num_kv_heads % kv_per_prog == 0
            and rows_per_kv_head * kv_per_prog <= block_m
            and last_wave_fill(max(1, unsplit_programs // kv_per_prog), slots) >= pairing.min_fill
            and keys_per_partition * kv_per_prog >= pairing.min_walked_keys
        ):
            return kv_per_prog
    return 1


def cache_offsets_32(table: LaunchTable, span: int) -> bool:
    """Whether a cache of ``span`` elements (first to last through its strides) is addressed
    with 32-bit row offsets: every partial sum of an offset is at most its highest one
    (docs/perf/attn_v100/PERFORMANCE_HISTORY.md#offsets_32)."""
    return span <= table.offsets_32_max_span


def aligned_strides_required(table: LaunchTable, head_size: int) -> bool:
    """Whether launches of this head size need strides that are multiples of 16."""
    minimum = table.aligned_strides_min_pad
    return minimum is not None and head_pad(head_size) >= minimum


def split_count(
    table: LaunchTable,
    kv_fp8: bool,
    num_seqs: int,
    num_kv_programs: int,
    max_seq_len: int,
    num_sms: int,
) -> int:
    """Decode partitions per sequence under the table's split policy for the KV dtype."""
    policy = table.policy(kv_fp8)
    return policy_splits(policy.split, num_seqs * num_kv_programs, max_seq_len, num_sms)


def decode_launch(
    table: LaunchTable,
    capability: tuple[int, int],
    num_sms: int,
    *,
    kv_dtype: str,
    head_size: int,
    num_heads: int,
    num_kv_heads: int,
    num_seqs: int,
    max_query_len: int,
    max_seq_len: int,
    num_splits: int | None = None,
    cache_span: int = 0,
    page_size: int = GATE_PAGE_SIZE,
) -> DecodeLaunch:
    """The decode launch for a batch: rows and tile, KV heads per program, partitions (the
    policy's unless ``num_splits`` is given), combine, scores ahead and masked-tile loop."""
    fp8 = kv_dtype != "float16"
    policy = table.policy(fp8)
    group = num_heads // num_kv_heads
    group_pad = pow2_at_least(group)
    q_pad = pow2_at_least(max_query_len)
    block_m = decode_block_m(table, head_size, q_pad, group_pad)
    tiles = decode_tiles(table, head_size, block_m, fp8)
    heads_per_prog = min(group_pad, tiles.block_m // q_pad)
    head_chunks = math.ceil(group / heads_per_prog)
    kv_programs = num_kv_heads * head_chunks
    kv_per_prog = 1
    if head_chunks == 1:
        kv_per_prog = kv_heads_per_program(
            policy.pairing,
            head_size,
            num_kv_heads,
            q_pad * group_pad,
            tiles.block_m,
            num_seqs * kv_programs,
            max_seq_len if num_splits is None else -(-max_seq_len // num_splits),
            num_sms,
        )
        heads_per_prog *= kv_per_prog
        kv_programs //= kv_per_prog
        if kv_per_prog > 1 and num_splits is None:
            # The pairing chose heads per program whose grid fills the GPU unsplit.
            num_splits = 1
    if num_splits is None:
        num_splits = split_count(table, fp8, num_seqs, kv_programs, max_seq_len, num_sms)
    num_programs = num_seqs * kv_programs * num_splits
    wide = takes_wide_combine(policy, head_size, num_programs, num_sms, num_splits)
    # Keys one program walks: its partition of the longest sequence, for each of its KV heads.
    walked = kv_per_prog * -(-max_seq_len // num_splits)
    ahead = takes_ahead(policy, walked)
    if ahead:
        tiles = ahead_tiles(table, tiles, head_size)
    wide_floats = policy.wide_combine.floats if wide and policy.wide_combine else None
    combine_m, split_chunk = decode_combine(
        table, tiles.block_m, q_pad, group_pad * kv_per_prog, head_size, wide_floats
    )
    build = DecodeBuild(
        head_size=head_size,
        tiles=tiles,
        kv_fp8=fp8,
        fp8_decode=fp8_decode(kv_dtype, capability),
        halves=policy.halves,
        offsets_32=cache_offsets_32(table, cache_span),
        page_size=page_size,
        partials_f16=fp16_partials(table, combine_m),
        combine_m=combine_m,
        split_chunk=split_chunk,
        ahead=ahead,
        kv_per_prog=kv_per_prog,
        one_stage_tail=takes_one_stage_tail(table, num_splits, walked),
    )
    if num_splits == 1:
        build = build.unsplit()
    return DecodeLaunch(build, kv_programs, num_splits, heads_per_prog, head_chunks)


def prefill_build(
    table: LaunchTable,
    capability: tuple[int, int],
    kv_dtype: str,
    head_size: int,
    tiles: Tiles,
    offsets_32: bool = True,
    page_size: int = GATE_PAGE_SIZE,
) -> AttentionBuild:
    """The prefill kernel's build for a tile."""
    fp8 = kv_dtype != "float16"
    return AttentionBuild(
        head_size=head_size,
        tiles=tiles,
        kv_fp8=fp8,
        fp8_decode=fp8_decode(kv_dtype, capability),
        halves=table.policy(fp8).halves,
        offsets_32=offsets_32,
        page_size=page_size,
    )


def prefill_launch(
    table: LaunchTable,
    capability: tuple[int, int],
    *,
    kv_dtype: str,
    head_size: int,
    num_heads: int,
    num_kv_heads: int,
    num_seqs: int,
    num_tokens: int,
    max_query_len: int,
    cache_span: int = 0,
    page_size: int = GATE_PAGE_SIZE,
) -> PrefillLaunch:
    """The prefill launch for a batch: the tile for its longest query, one program per block of
    query tokens (plus one per sequence for its ragged end) and head chunk."""
    tiles = prefill_tiles(table.prefill_tiles[head_pad(head_size)], max_query_len)
    group = num_heads // num_kv_heads
    heads_per_prog = min(pow2_at_least(group), tiles.block_m)
    head_chunks = math.ceil(group / heads_per_prog)
    block_q = tiles.block_m // heads_per_prog
    build = prefill_build(
        table,
        capability,
        kv_dtype,
        head_size,
        tiles,
        cache_offsets_32(table, cache_span),
        page_size,
    )
    grid = (num_tokens // block_q + num_seqs, num_kv_heads * head_chunks)
    return PrefillLaunch(build, grid, heads_per_prog, head_chunks)


# -- the SM70 CUDA kernels (volta_attn_v100/cuda/*.cu) --------------------------------------------

#: The prefill's and the decode's symbols (``extern "C"``) in ``cuda/prefill.cu`` and
#: ``cuda/decode.cu``.
PREFILL_KERNEL = "volta_prefill_mma"
DECODE_KERNEL = "volta_decode_mma"

_CUDA_FILES = {PREFILL_KERNEL: "prefill.cu", DECODE_KERNEL: "decode.cu"}


@functools.cache
def cuda_source(kernel: str) -> str:
    """The CUDA C++ source of ``kernel`` (:data:`PREFILL_KERNEL` or :data:`DECODE_KERNEL`),
    package data read once, when first asked for, behind the core's SM70 prelude
    (:func:`volta_core.kernel_api.with_prelude`: the launchers and the gate compile this text)."""
    return with_prelude(files("volta_attn_v100").joinpath("cuda", _CUDA_FILES[kernel]).read_text())


def prefill_options(head_size: int, kv_fp8: bool, tile: CudaPrefillTile) -> tuple[str, ...]:
    """The NVRTC options of one prefill build (``prefill.cu``'s ``-D`` list)."""
    return (
        f"-DHEAD={head_size}",
        f"-DBLOCK_N={tile.block_n}",
        f"-DWARPS={tile.num_warps}",
        f"-DKV_FP8={int(kv_fp8)}",
    )


def prefill_shared_bytes(head_size: int, tile: CudaPrefillTile) -> int:
    """Dynamic shared memory one prefill block takes (``prefill.cu``'s ``SMEM_BYTES``, which the
    kernel checks against what it was given): Q, K and V^T tiles and each warp's P, every row
    padded by 8 halves, V^T's head rows to whole 32-column products."""
    pad = 8
    value_rows = -(-head_size // 32) * 32
    halves = (
        tile.block_m * (head_size + pad)
        + tile.block_n * (head_size + pad)
        + value_rows * (tile.block_n + pad)
        + tile.block_m * (tile.block_n + pad)
    )
    return 2 * halves


def decode_options(
    head_size: int, kv_fp8: bool, num_warps: int, min_blocks: int
) -> tuple[str, ...]:
    """The NVRTC options of one decode build (``decode.cu``'s ``-D`` list): head size, KV dtype,
    warps per block and the blocks per SM its registers are bounded for."""
    return (
        f"-DHEAD={head_size}",
        f"-DKV_FP8={int(kv_fp8)}",
        f"-DWARPS={num_warps}",
        f"-DMIN_BLOCKS={min_blocks}",
    )


@functools.cache
def cuda_prefill_options(head_size: int, kv_dtype: str) -> tuple[str, ...]:
    """The options of the prefill build :data:`~volta_attn_v100.tables.SM70_CUDA_PREFILL` lists
    for a head size and KV dtype (fp16 or e5m2)."""
    return prefill_options(head_size, kv_dtype != "float16", SM70_CUDA_PREFILL[head_size])


@functools.cache
def cuda_decode_options(head_size: int, kv_dtype: str) -> tuple[str, ...]:
    """The options of the decode build :data:`~volta_attn_v100.tables.SM70_CUDA_DECODE` lists
    for a head size and KV dtype (fp16 or e5m2)."""
    tile = SM70_CUDA_DECODE[head_size]
    return decode_options(head_size, kv_dtype != "float16", tile.num_warps, tile.min_blocks)


@dataclass(frozen=True)
class CudaDecodeLaunch:
    """A CUDA decode call: its build (head size, KV dtype, tile), partitions, row chunks of
    :data:`~volta_attn_v100.tables.CUDA_DECODE_ROWS` and grid ``(row_chunks x num_splits, KV
    heads, sequences)``: everything :func:`volta_attn_v100.cuda.decode.launch` needs."""

    head_size: int
    kv_dtype: str
    tile: CudaDecodeTile
    group: int
    max_query_len: int
    num_splits: int
    row_chunks: int
    grid: tuple[int, int, int]

    @property
    def options(self) -> tuple[str, ...]:
        return cuda_decode_options(self.head_size, self.kv_dtype)

    @property
    def block_threads(self) -> int:
        return self.tile.num_warps * 32


@dataclass(frozen=True)
class CudaPrefillLaunch:
    """A CUDA prefill call: its build (head size, KV dtype, tile), grid ``(query blocks, KV
    programs)`` and head groups: everything :func:`volta_attn_v100.cuda.prefill.launch` needs."""

    head_size: int
    kv_dtype: str
    tile: CudaPrefillTile
    group: int
    grid: tuple[int, int]
    heads_per_prog: int
    head_chunks: int

    @property
    def options(self) -> tuple[str, ...]:
        return cuda_prefill_options(self.head_size, self.kv_dtype)

    @property
    def shared_bytes(self) -> int:
        return prefill_shared_bytes(self.head_size, self.tile)

    @property
    def block_threads(self) -> int:
        return self.tile.num_warps * 32


#: Every launch object a call may get: the Triton kernels' and the CUDA kernels'.
Launch = DecodeLaunch | PrefillLaunch | CudaDecodeLaunch | CudaPrefillLaunch


def cuda_row_chunks(max_query_len: int, group: int) -> int:
    """Blocks of 8 rows (query token x head of the group) one KV head's rows take."""
    return -(-max(max_query_len, 1) * group // CUDA_DECODE_ROWS)


def cuda_decode_launch(
    *,
    kv_dtype: str,
    head_size: int,
    num_heads: int,
    num_kv_heads: int,
    num_seqs: int,
    max_query_len: int,
    num_splits: int,
) -> CudaDecodeLaunch:
    """The CUDA decode's launch for a batch (a head size the table lists, fp16 or e5m2 KV), with
    ``num_splits`` partitions a sequence."""
    group = num_heads // num_kv_heads
    chunks = cuda_row_chunks(max_query_len, group)
    return CudaDecodeLaunch(
        head_size=head_size,
        kv_dtype=kv_dtype,
        tile=SM70_CUDA_DECODE[head_size],
        group=group,
        max_query_len=max_query_len,
        num_splits=num_splits,
        row_chunks=chunks,
        grid=(chunks * num_splits, num_kv_heads, num_seqs),
    )


def cuda_prefill_launch(
    *,
    kv_dtype: str,
    head_size: int,
    num_heads: int,
    num_kv_heads: int,
    num_seqs: int,
    num_tokens: int,
) -> CudaPrefillLaunch:
    """The CUDA prefill's launch for a batch (a head size the table lists, fp16 or e5m2 KV): a
    program's rows hold the whole head group (up to its rows) for ``block_m // heads_per_prog``
    query tokens; programs are numbered as the Triton prefill numbers them (a sequence's blocks
    plus one for its ragged end)."""
    tile = SM70_CUDA_PREFILL[head_size]
    group = num_heads // num_kv_heads
    heads_per_prog = min(group, tile.block_m)
    head_chunks = -(-group // heads_per_prog)
    block_q = tile.block_m // heads_per_prog
    return CudaPrefillLaunch(
        head_size=head_size,
        kv_dtype=kv_dtype,
        tile=tile,
        group=group,
        grid=(num_tokens // block_q + num_seqs, num_kv_heads * head_chunks),
        heads_per_prog=heads_per_prog,
        head_chunks=head_chunks,
    )
