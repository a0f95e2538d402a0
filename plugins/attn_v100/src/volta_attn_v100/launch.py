"""Every launch choice, read from a device family's table (:mod:`volta_attn_v100.tables`).

Pure Python (no torch, no triton): the launchers (:mod:`volta_attn_v100.ops`) ask
:func:`decode_launch` and :func:`prefill_launch` for each call, and the gate's configurations
(:mod:`volta_attn_v100.gate_configs`) are made of the same :class:`DecodeBuild` and
:class:`PrefillBuild` through the helpers below, so the gate compiles what the launchers run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from volta_attn_v100.limits import fp8_decode, head_pad
from volta_attn_v100.tables import KVPolicy, LaunchTable, Pairing, Tiles, last_wave_fill

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
    """One build of the decode kernel: the shared arguments and the combine's, scores ahead,
    KV heads per program and the masked tiles' loop."""

    partials_f16: bool = False
    combine_m: int = 4
    split_chunk: int = 1
    ahead: bool = False
    kv_per_prog: int = 1
    one_stage_tail: bool = False

    def constexprs(self) -> dict[str, int | bool]:
        return {
            **super().constexprs(),
            "PARTIALS_F16": self.partials_f16,
            "COMBINE_M": self.combine_m,
            "SPLIT_CHUNK": self.split_chunk,
            "AHEAD": self.ahead,
            "KV_PER_PROG": self.kv_per_prog,
            "ONE_STAGE_TAIL": self.one_stage_tail,
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
    """The decode tile of a head size, row count and KV dtype."""
    return table.decode_tiles[(head_pad(head_size), block_m)].tiles(block_m, kv_fp8)


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
    return policy.split.num_splits(num_seqs * num_kv_programs, max_seq_len, num_sms)


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
    tiles = table.prefill_tiles[head_pad(head_size)].for_query(max_query_len)
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
