"""The host's kernel-side API: arrival-counter buffers (zeroed, shared per stream, grown without
freeing the old one) and the device facts a launch is planned for."""

from __future__ import annotations

import pytest

# The kernel-side API runs on torch (the core's `kernels` extra); the core's own light run skips.
torch = pytest.importorskip("torch")

from volta_core.kernel_api import (  # noqa: E402
    INTERPRETER_FACTS,
    MIN_COUNTERS,
    arrival_counters,
    device_facts,
    zeroed_accumulators,
)


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


def test_a_cpu_launch_is_planned_for_a_v100() -> None:
    facts = device_facts(torch.device("cpu"))
    assert facts == INTERPRETER_FACTS
    assert facts.capability == (7, 0)
    assert facts.sm_count == 80


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_device_reports_its_own_facts() -> None:
    props = torch.cuda.get_device_properties(0)
    facts = device_facts(torch.device("cuda", 0))
    assert facts.capability == (props.major, props.minor)
    assert facts.sm_count == props.multi_processor_count
