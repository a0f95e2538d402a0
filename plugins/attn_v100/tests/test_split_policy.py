"""The decode partition count: whole waves of what an SM holds, per KV dtype and device.

The figures are the H100's (132 SMs): fp16 decode programs take 116-150 registers a thread at
sm_90 (3 per SM), fp8 ones 255 (2 per SM); the counts are the ones the split-count probe on
the H100 measured fastest (README, "Split policy").
"""

from __future__ import annotations

import pytest

from volta_attn_v100.configs import (
    DEFAULT_SPLIT_POLICY,
    TWO_PER_SM_SPLIT_POLICY,
    SplitPolicy,
    last_wave_fill,
    split_policy_for,
)
from volta_attn_v100.ops import default_num_splits

H100_SMS = 132
KV_HEADS = 8


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
    assert DEFAULT_SPLIT_POLICY.num_splits(programs, context, H100_SMS) == fp16
    assert TWO_PER_SM_SPLIT_POLICY.num_splits(programs, context, H100_SMS) == fp8


def test_a_grid_just_over_one_wave_is_cut_back() -> None:
    """The previous policy rounded up: 8 x 8K fp8 got 5 partitions, 320 programs where the
    SMs hold 264, and its last 56 programs ran nearly alone (83.9 us against 61.8 with 4)."""
    slots = 2 * H100_SMS
    assert last_wave_fill(320, slots) < last_wave_fill(256, slots)
    assert TWO_PER_SM_SPLIT_POLICY.num_splits(8 * KV_HEADS, 8192, H100_SMS) == 4


def test_the_count_stays_within_the_policy_bounds() -> None:
    policy = SplitPolicy(programs_per_sm=4, min_keys_per_split=256, max_splits=8)
    for programs in (1, 3, 8, 50, 200, 1000):
        for context in (1, 100, 2048, 1 << 20):
            splits = policy.num_splits(programs, context, H100_SMS)
            assert 1 <= splits <= min(8, max(1, -(-context // 256)))


def test_shipped_policy_follows_the_kv_dtype_and_device() -> None:
    assert split_policy_for(False, (9, 0)) is DEFAULT_SPLIT_POLICY
    assert split_policy_for(True, (9, 0)) is TWO_PER_SM_SPLIT_POLICY
    assert split_policy_for(False, (7, 0)) is TWO_PER_SM_SPLIT_POLICY
    # The launcher and vLLM's builder both ask default_num_splits; off a GPU (the
    # interpreter) the device counts as SM70, so both dtypes take the two-per-SM policy.
    for kv_dtype in ("float16", "fp8_e5m2"):
        assert default_num_splits(1, 2, 8192, "cpu", kv_dtype) == default_num_splits(
            1, 2, 8192, "cpu", "float16", TWO_PER_SM_SPLIT_POLICY
        )
    assert default_num_splits(1, 2, 8192, "cpu", policy=SplitPolicy(programs_per_sm=1)) != (
        default_num_splits(1, 2, 8192, "cpu", "fp8_e5m2")
    )


def test_an_unknown_kv_dtype_is_refused() -> None:
    from volta_attn_v100.ops import AttentionInputError

    with pytest.raises(AttentionInputError, match="KV-cache dtype must be one of"):
        default_num_splits(1, 2, 8192, "cpu", "fp8_e4m3")
