"""Scales from the checkpoint or 1.0, validated once, sharded across tensor-parallel ranks."""

from __future__ import annotations

import math

import pytest
import torch

from volta_fp8kv.scales import (
    KVScaleError,
    TensorParallelError,
    kv_scales,
    kv_scales_from_checkpoint,
    shard_per_head,
    unit_scales,
)


def test_no_checkpoint_scales_means_unit_scales():
    scales = kv_scales_from_checkpoint(None, None, 8, tp_size=2, tp_rank=1)
    assert torch.equal(scales.k, torch.ones(1))
    assert torch.equal(scales.v, torch.ones(1))
    assert not scales.per_head
    assert torch.equal(unit_scales().k, torch.ones(1))


@pytest.mark.parametrize("value", [0.5, torch.tensor(0.5), torch.tensor([0.5])])
def test_per_tensor_scales_in_every_spelling(value):
    scales = kv_scales_from_checkpoint(value, 2.0, 8, tp_size=4, tp_rank=3)
    assert scales.k.tolist() == [0.5]
    assert scales.v.tolist() == [2.0]
    assert scales.k.dtype == torch.float32


def test_llm_compressor_per_head_scales_are_sharded_by_rank():
    k = torch.arange(1, 9, dtype=torch.float32).reshape(8, 1, 1)  # llm-compressor's shape
    v = torch.arange(1, 9, dtype=torch.float32) / 10
    shards = [kv_scales_from_checkpoint(k, v, 8, tp_size=4, tp_rank=r) for r in range(4)]
    assert [s.k.tolist() for s in shards] == [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert torch.allclose(torch.cat([s.v for s in shards]), v)
    assert all(s.per_head for s in shards)


def test_fewer_kv_heads_than_ranks_replicate_like_vllm():
    scale = torch.tensor([1.0, 2.0])
    assert [shard_per_head(scale, 2, 4, r).tolist() for r in range(4)] == [[1], [1], [2], [2]]


@pytest.mark.parametrize(("heads", "tp"), [(8, 3), (6, 4), (3, 2)])
def test_heads_not_dividing_across_ranks_is_a_clear_error(heads, tp):
    with pytest.raises(
        TensorParallelError, match=f"{heads} KV heads cannot be divided across {tp}"
    ):
        kv_scales_from_checkpoint(
            torch.ones(heads), torch.ones(heads), heads, tp_size=tp, tp_rank=0
        )


def test_bad_rank_is_refused():
    with pytest.raises(TensorParallelError, match="tp_rank 4"):
        shard_per_head(torch.ones(8), 8, 4, 4)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0.0, "finite and positive"),
        (-1.0, "finite and positive"),
        (math.nan, "finite and positive"),
        (math.inf, "finite and positive"),
        (torch.tensor([1.0, 0.0, 2.0, -3.0]), "2 of 4 are not: head 1: 0.0, head 3: -3.0"),
        (torch.ones(3), r"shape \(3,\): expected a scalar \(per-tensor\) or 4 values"),
        (torch.ones(2, 2), r"shape \(2, 2\)"),
    ],
)
def test_bad_scales_are_refused_by_name(value, message):
    with pytest.raises(KVScaleError, match=message):
        kv_scales(value, 1.0, 4)
    with pytest.raises(KVScaleError, match="v_scale"):
        kv_scales_from_checkpoint(1.0, value, 4)


def test_half_a_calibration_is_refused():
    with pytest.raises(KVScaleError, match="no v_scale"):
        kv_scales_from_checkpoint(torch.ones(4), None, 4)
