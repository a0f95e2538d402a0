"""The decode partition count: whole waves of what an SM holds, per KV dtype and device; and
the other decode choices the SM80 table makes (combine, scores ahead, KV heads per program).

The figures are the H100's (132 SMs): fp16 decode programs take 116-150 registers a thread at
sm_90 (3 per SM), fp8 ones 255 (2 per SM); the counts are the ones the split-count probe on
the H100 measured fastest (README, "Split policy").
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from volta_attn_v100.dispatch import table_for
from volta_attn_v100.launch import (
    ahead_tiles,
    decode_combine,
    decode_tiles,
    fp16_partials,
    kv_heads_per_program,
    last_wave_fill,
    policy_splits,
    takes_ahead,
    takes_one_stage_tail,
    takes_wide_combine,
)
from volta_attn_v100.ops import default_num_splits
from volta_attn_v100.tables import SM70, SM80, TWO_PER_SM, SplitPolicy

H100_SMS = 132
KV_HEADS = 8
DEFAULT_SPLIT_POLICY = SM80.fp16.split
TWO_PER_SM_SPLIT_POLICY = TWO_PER_SM
#: The wide combine's partial floats per step.
WIDE = 16384


def wide_combine(kv_fp8, capability, head_size, num_programs, num_sms, num_splits) -> bool:
    policy = table_for(capability).policy(kv_fp8)
    return takes_wide_combine(policy, head_size, num_programs, num_sms, num_splits)


@pytest.mark.parametrize(
    ("batch", "context", "fp16", "fp8"),
    [
        (1, 1024, 16, 16),  # at least 64 keys per partition
        (1, 8192, 32, 32),  # at most 32 partitions
        (2, 8192, 24, 16),
        (4, 8192, 12, 8),
        (8, 8192, 6, 4),
        (16, 8192, 3, 2),
        (16, 16384, 3, 2),
        (32, 16384, 2, 2),  # one full wave or two: the tie goes to more partitions
        (64, 8192, 1, 1),
    ],
)
def test_partitions_fill_whole_waves(batch, context, fp16, fp8) -> None:
    programs = batch * KV_HEADS
    assert policy_splits(DEFAULT_SPLIT_POLICY, programs, context, H100_SMS) == fp16
    assert policy_splits(TWO_PER_SM_SPLIT_POLICY, programs, context, H100_SMS) == fp8


def test_a_grid_just_over_one_wave_is_cut_back() -> None:
    """The previous policy rounded up: 8 x 8K fp8 got 5 partitions, 320 programs where the
    SMs hold 264, and its last 56 programs ran nearly alone (83.9 us against 61.8 with 4)."""
    slots = 2 * H100_SMS
    assert last_wave_fill(320, slots) < last_wave_fill(256, slots)
    assert policy_splits(TWO_PER_SM_SPLIT_POLICY, 8 * KV_HEADS, 8192, H100_SMS) == 4


def test_the_count_stays_within_the_policy_bounds() -> None:
    policy = SplitPolicy(programs_per_sm=4, min_keys_per_split=256, max_splits=8)
    for programs in (1, 3, 8, 50, 200, 1000):
        for context in (1, 100, 2048, 1 << 20):
            splits = policy_splits(policy, programs, context, H100_SMS)
            assert 1 <= splits <= min(8, max(1, -(-context // 256)))


def test_shipped_policy_follows_the_kv_dtype_and_device() -> None:
    assert SM80.fp16.split.programs_per_sm == 3
    assert table_for((9, 0)).fp8.split is TWO_PER_SM_SPLIT_POLICY
    assert table_for((7, 0)).fp16.split is table_for((7, 0)).fp8.split is TWO_PER_SM
    # The launcher and vLLM's builder both ask default_num_splits; off a GPU (the
    # interpreter) the device counts as a V100 (SM70, 80 SMs), so both dtypes take the
    # two-per-SM policy over 160 resident programs: 8 KV programs of one sequence, 20 each.
    for kv_dtype in ("float16", "fp8_e5m2"):
        assert default_num_splits(1, 8, 8192, "cpu", kv_dtype) == 20
    three = replace(SM70, fp16=replace(SM70.fp16, split=DEFAULT_SPLIT_POLICY))
    assert default_num_splits(1, 8, 8192, "cpu", table=three) == 30
    assert default_num_splits(1, 8, 8192, "cpu", "fp8_e5m2", table=three) == 20


def test_an_unknown_kv_dtype_is_refused() -> None:
    from volta_attn_v100.inputs import AttentionInputError

    with pytest.raises(AttentionInputError, match="KV-cache dtype must be one of"):
        default_num_splits(1, 2, 8192, "cpu", "int8_per_token_head")


def test_small_fp16_grids_combine_in_one_wide_step() -> None:
    """1 x 8K at 32/8 heads is 8 KV programs x 32 partitions, 256 programs where the SMs hold
    264 at two each: the combine loads all 32 partitions of its 4 rows in one step instead of
    four. A grid that needs three programs per SM and SM70 keep the narrow step."""
    h100 = (9, 0)
    assert SM80.fp16.wide_combine.floats == SM80.fp8.wide_combine.floats == WIDE
    assert wide_combine(False, h100, 128, 8 * 32, H100_SMS, 32)
    assert wide_combine(False, h100, 512, 8 * 4, H100_SMS, 4)
    assert decode_combine(SM80, 16, 1, 4, 128, WIDE) == (4, 32)
    assert decode_combine(SM80, 16, 1, 4, 128) == (4, 8)
    assert decode_combine(SM80, 16, 1, 8, 128, WIDE) == (8, 16)  # 64/8 heads
    assert not wide_combine(False, h100, 128, 16 * 24, H100_SMS, 24)  # 2 x 8K: 384 programs
    assert not wide_combine(False, (7, 0), 128, 8, H100_SMS, 1)


def test_fp8_takes_the_wide_step_only_at_the_most_partitions() -> None:
    """fp8 decode programs spill more with the wide combine, which paid on the H100 only where
    the narrow one takes the most steps: 32 partitions (a batch of one sequence), not 16 or
    fewer, nor heads over 128, nor grids over two programs an SM."""
    h100 = (9, 0)
    policy = SM80.fp8.split
    splits = policy_splits(policy, 8, 8192, H100_SMS)  # 1 x 8K, 8 KV heads
    assert splits == SM80.fp8.wide_combine.min_splits == 32
    assert wide_combine(True, h100, 128, 8 * splits, H100_SMS, splits)
    assert wide_combine(True, h100, 80, 8 * splits, H100_SMS, splits)
    two = policy_splits(policy, 16, 32768, H100_SMS)  # 2 x 32K: 16 partitions
    assert two == 16
    assert not wide_combine(True, h100, 128, 16 * two, H100_SMS, two)
    assert not wide_combine(True, h100, 256, 8 * splits, H100_SMS, splits)
    assert not wide_combine(True, h100, 128, 3 * H100_SMS, H100_SMS, splits)
    assert not wide_combine(True, (7, 0), 128, 8 * splits, H100_SMS, splits)


def test_a_partition_too_large_for_a_narrow_step_stays_alone() -> None:
    """32 rows of head size 256 (8 speculative tokens, a group of 4) hold 8192 floats a
    partition: two per step spilled at sm_90, so the wide combine keeps one."""
    assert decode_combine(SM80, 32, 8, 4, 256, WIDE) == decode_combine(SM80, 32, 8, 4, 256)
    assert decode_combine(SM80, 32, 8, 4, 256)[1] == 1


def test_scores_go_ahead_for_long_fp8_partitions_on_sm80_and_later() -> None:
    """Scores one tile ahead where fp8 tiles are taken in halves and a program walks at least
    4096 keys (at the longest sequence); the launcher asks with the step's longest sequence
    over its partitions."""
    assert SM80.fp8.halves
    assert takes_ahead(SM80.fp8, 4096)
    assert not takes_ahead(SM80.fp8, 4095)
    assert not takes_ahead(SM80.fp16, 1 << 20)  # fp16
    assert not takes_ahead(SM70.fp8, 1 << 20)  # SM70: whole tiles, FMA dots


def test_partials_are_fp16_where_a_program_combines_8_rows_or_more() -> None:
    """64/8 heads at one query token combine 8 rows (fp16 partials on SM80+); 32/8 combine 4
    (fp32: fp16 was slower there on the H100); SM70 keeps fp32."""
    assert fp16_partials(SM80, 8)
    assert fp16_partials(SM80, 16)
    assert not fp16_partials(SM80, 4)
    assert not fp16_partials(SM70, 16)
    rows_64_8, _ = decode_combine(SM80, 16, 1, 8, 128, WIDE)
    rows_32_8, _ = decode_combine(SM80, 16, 1, 4, 128, WIDE)
    assert fp16_partials(SM80, rows_64_8)
    assert not fp16_partials(SM80, rows_32_8)


def test_masked_tiles_run_on_one_stage_in_short_partitions_of_split_launches() -> None:
    """On SM80+, one stage for the masked tiles where a split launch's partitions hold at most
    4096 keys (1 x 8K: 32 partitions of 256; 16 x 8K: 3 of 2731); unsplit launches, long
    partitions (32 x 16K: 2 of 8192) and SM70 keep the two loops."""
    assert takes_one_stage_tail(SM80, 32, 256)
    assert takes_one_stage_tail(SM80, 3, 2731)
    assert takes_one_stage_tail(SM80, 2, 4096)
    assert not takes_one_stage_tail(SM80, 2, 4097)
    assert not takes_one_stage_tail(SM80, 2, 8192)
    assert not takes_one_stage_tail(SM80, 1, 64)
    assert not takes_one_stage_tail(SM70, 32, 256)


def test_scores_ahead_runs_three_stages_on_heads_up_to_128() -> None:
    """A launch with scores ahead takes its tile on 3 stages where heads pad to 128 or less
    (measured there); 256 and 512 keep the tile as it is."""
    for head_size in (64, 96, 128):
        tiles = decode_tiles(SM80, head_size, 16, kv_fp8=True)
        assert tiles.num_stages != 3
        assert ahead_tiles(SM80, tiles, head_size) == replace(tiles, num_stages=3)
    for head_size in (256, 512):
        tiles = decode_tiles(SM80, head_size, 16, kv_fp8=True)
        assert ahead_tiles(SM80, tiles, head_size) == tiles


def test_kv_heads_per_program_where_the_grid_still_fills_the_gpu_unsplit() -> None:
    """Four, else two KV heads per fp8 program (SM80+, heads up to 128) where they divide the
    KV heads, their rows fit the one-head launch's rows, the fewer programs still fill the
    waves of 2 per SM to 0.9, and partitions of at most 4096 keys reach scores ahead; one
    otherwise."""
    sms = 132

    def heads(kv_heads=8, rows=4, programs=1024, keys=2048, fp8=True, cap=(9, 0), head=128):
        pairing = table_for(cap).policy(fp8).pairing
        return kv_heads_per_program(pairing, head, kv_heads, rows, 16, programs, keys, sms)

    # 128 x 2K, 32/8 heads: 1024 one-head programs of 4 rows -> 256 programs of 16 rows.
    assert heads() == 4
    assert heads(rows=8) == 2  # 64/8 heads: four heads' 32 rows are not the launch's 16
    assert heads(keys=1024) == 4  # 128 x 1K: 4K keys a program reach scores ahead
    assert heads(keys=4096) == 4  # 128 x 4K
    assert heads(programs=2048, keys=1024) == 4  # 256 x 1K: 512 programs, two full waves
    assert heads(programs=512) == 2  # 64 x 2K: 128 programs of four would fill half a wave
    assert heads(kv_heads=2, programs=1024) == 2  # 2 KV heads: four do not divide them
    assert heads(rows=16) == 1
    assert heads(programs=768) == 1  # 96 sequences: 192 or 384 programs fill 0.73 of waves
    assert heads(rows=8, keys=1024) == 1  # two heads' 2K keys do not reach scores ahead
    assert heads(keys=8192) == 1  # beyond the measured range
    assert heads(fp8=False) == 1
    assert heads(cap=(7, 0)) == 1  # SM70: no halves
    assert heads(head=256) == 1
    assert heads(kv_heads=7) == 1
    assert heads(programs=3) == 1
