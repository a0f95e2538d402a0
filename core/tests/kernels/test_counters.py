"""The arrival-counter buffers: zeroed, shared per stream, grown without freeing the old one."""

from __future__ import annotations

import torch

from volta_core.kernels.counters import MIN_COUNTERS, arrival_counters, zeroed_accumulators


def test_one_zeroed_buffer_per_stream_that_grows_and_keeps_the_old_one() -> None:
    device = torch.device("cpu")
    first = arrival_counters(device)
    assert first.dtype == torch.int32
    assert first.numel() >= MIN_COUNTERS
    assert not first.any()
    assert arrival_counters(device, first.numel()) is first
    first[3] = 1  # a buffer a captured graph still uses must not be handed out zeroed again
    grown = arrival_counters(device, first.numel() + 1)
    assert grown is not first
    assert grown.numel() >= 2 * first.numel()
    assert not grown.any()
    assert arrival_counters(device) is grown
    assert first[3] == 1
    first[3] = 0


def test_accumulators_are_a_separate_fp32_buffer() -> None:
    device = torch.device("cpu")
    counters = arrival_counters(device)
    acc = zeroed_accumulators(device, 10)
    assert acc.dtype == torch.float32
    assert not acc.any()
    assert acc.data_ptr() != counters.data_ptr()
    assert zeroed_accumulators(device) is acc
    assert arrival_counters(device) is counters
