"""Bad input: one clear error naming what is wrong, raised before any kernel launch."""

from __future__ import annotations

import pytest
import torch

from volta_fp8kv import ops
from volta_fp8kv.kernels import cache_write, gather
from volta_fp8kv.ops import KVCacheInputError, gather_kv_cache, write_kv_cache
from volta_fp8kv.scales import KVScales, kv_scales


class NeverLaunched:
    """Stands in for a kernel: any launch fails the test."""

    def __getitem__(self, grid):
        raise AssertionError(f"a kernel was launched (grid {grid}) despite bad input")


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    monkeypatch.setattr(cache_write, "cache_write_kernel", NeverLaunched())
    monkeypatch.setattr(gather, "gather_kernel", NeverLaunched())


def good_write():
    key = torch.randn(10, 2, 64).half()
    return {
        "key": key,
        "value": key.clone(),
        "cache": torch.zeros(4, 2, 16, 128, dtype=torch.uint8),
        "slot_mapping": torch.arange(10),
        "kv_cache_dtype": "fp8_e5m2",
        "scales": kv_scales(torch.ones(2), 1.0, 2),
    }


WRITE_CASES = {
    "slot past the cache": (
        {"slot_mapping": torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 64])},
        "slot 64, past the cache's 64 slots",
    ),
    "slot count": ({"slot_mapping": torch.arange(9)}, "one slot per token"),
    "slot dtype": ({"slot_mapping": torch.arange(10.0)}, "int32/int64"),
    "cache dtype": (
        {"cache": torch.zeros(4, 2, 16, 128, dtype=torch.float16)},
        "fp8_e5m2 cache holds uint8 codes",
    ),
    "fp16 cache dtype": ({"kv_cache_dtype": "float16"}, "float16 cache holds float16 values"),
    "cache rank": ({"cache": torch.zeros(4, 2, 16 * 128, dtype=torch.uint8)}, "must be 4-D"),
    "cache heads": (
        {"cache": torch.zeros(4, 3, 16, 128, dtype=torch.uint8)},
        r"expected \[num_blocks, 2, block_size, 128\]",
    ),
    "cache entry": (
        {"cache": torch.zeros(4, 2, 16, 96, dtype=torch.uint8)},
        "head_size_k \\+ head_size_v = 128",
    ),
    "cache last dim strided": (
        {"cache": torch.zeros(4, 2, 128, 16, dtype=torch.uint8).transpose(2, 3)},
        "last dim must be contiguous",
    ),
    "unknown dtype": ({"kv_cache_dtype": "int8"}, "not one this plugin writes"),
    "key rank": ({"key": torch.randn(10, 128).half()}, "must be 3-D"),
    "key dtype": ({"key": torch.zeros(10, 2, 64, dtype=torch.int32)}, "key must be float16"),
    "value heads": ({"value": torch.randn(10, 3, 64).half()}, "disagree on tokens or heads"),
    "scale count": (
        {"scales": KVScales(torch.ones(3), torch.ones(1))},
        "k_scale has 3 values for 2 KV heads",
    ),
    "scale dtype": (
        {"scales": KVScales(torch.ones(2, dtype=torch.float64), torch.ones(1))},
        "1-D float32",
    ),
    "scale type": ({"scales": (1.0, 1.0)}, "must be a KVScales"),
}


@pytest.mark.parametrize("case", list(WRITE_CASES))
def test_cache_write_refuses(case):
    change, message = WRITE_CASES[case]
    args = {**good_write(), **change}
    before = args["cache"].clone()
    with pytest.raises(KVCacheInputError, match=message):
        write_kv_cache(**args)
    assert torch.equal(args["cache"], before)


def test_e4m3_is_refused_below_sm89_on_a_gpu(monkeypatch):
    """Outside the interpreter a tensor's device facts decide (a non-CUDA device reads as a
    V100); the interpreter runs the integer codec for e4m3 too, so CPU tests may write it."""
    monkeypatch.setattr(ops, "interpreting", lambda: False)
    args = {**good_write(), "kv_cache_dtype": "fp8"}
    with pytest.raises(KVCacheInputError, match=r"compute capability 8\.9 or newer.*use fp8_e5m2"):
        write_kv_cache(**args)


def test_good_write_reaches_the_launch():
    """The harness itself: valid input gets as far as the (replaced) kernel."""
    with pytest.raises(AssertionError, match="a kernel was launched"):
        write_kv_cache(**good_write())


def good_gather():
    return {
        "cache": torch.zeros(4, 2, 16, 128, dtype=torch.uint8),
        "block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        "seq_lens": torch.tensor([20, 32], dtype=torch.int32),
        "kv_cache_dtype": "fp8_e5m2",
        "head_size_k": 64,
    }


GATHER_CASES = {
    "block past the cache": (
        {"block_table": torch.tensor([[0, 4], [2, 3]], dtype=torch.int32)},
        "block 4, outside the cache's 4 blocks",
    ),
    "negative block": (
        {"block_table": torch.tensor([[0, -1], [2, 3]], dtype=torch.int32)},
        "block -1",
    ),
    "sequence longer than its table": (
        {"seq_lens": torch.tensor([20, 33], dtype=torch.int32)},
        "33 tokens needs 3 blocks",
    ),
    "negative length": ({"seq_lens": torch.tensor([-1, 3], dtype=torch.int32)}, "negative"),
    "table dtype": ({"block_table": torch.tensor([[0, 1], [2, 3]])}, "2-D int32"),
    "lens count": ({"seq_lens": torch.tensor([3], dtype=torch.int32)}, "one length per sequence"),
    "head split": ({"head_size_k": 128}, "does not split"),
    "cache dtype": ({"cache": torch.zeros(4, 2, 16, 128)}, "holds uint8 codes"),
    "max_seq_len": ({"max_seq_len": 31}, "below the longest sequence 32"),
    "out dtype": ({"out_dtype": torch.bfloat16}, "out_dtype must be float16"),
}


@pytest.mark.parametrize("case", list(GATHER_CASES))
def test_gather_refuses(case):
    change, message = GATHER_CASES[case]
    with pytest.raises(KVCacheInputError, match=message):
        gather_kv_cache(**{**good_gather(), **change})


def test_unused_table_entries_are_not_checked():
    """Columns past a sequence's length may hold anything (vLLM leaves them stale)."""
    args = good_gather()
    args["block_table"] = torch.tensor([[0, 99], [2, 3]], dtype=torch.int32)
    args["seq_lens"] = torch.tensor([16, 32], dtype=torch.int32)
    with pytest.raises(AssertionError, match="a kernel was launched"):
        gather_kv_cache(**args)


def test_check_indices_off_skips_the_host_read():
    """With the check off the wrapper goes straight to the launch (the kernel masks instead)."""
    args = {**good_write(), "slot_mapping": torch.tensor([0] * 9 + [10_000])}
    with pytest.raises(AssertionError, match="a kernel was launched"):
        write_kv_cache(**args, check_indices=False)
