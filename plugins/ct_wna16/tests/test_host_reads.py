"""A linear call and a fused-experts call read nothing back from the device.

Reading a device tensor's values on the host synchronises with the GPU: once per layer it
would cost a decode step its overlap of host and device work (and break CUDA-graph capture).
The kernels are replaced by launchers that do nothing (the Triton interpreter reads tensors
itself), the launches planned for a V100 (CPU tensors: capability 7.0), and every host read of
a tensor inside the calls is an error (``volta_devkit.host_reads``), at each token count that
takes another path.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from ct_wna16_checkpoints import fresh_checkpoint

from volta_ct_wna16.experts import ExpertWeights, experts_forward
from volta_ct_wna16.layout import PackedWeights
from volta_ct_wna16.ops import wna16_linear
from volta_ct_wna16.scheme import WeightScheme
from volta_devkit.host_reads import HostReadError, no_host_reads

SCHEME = WeightScheme(4, False, 32)


class _NoLaunch:
    """A Triton kernel whose launch does nothing (``kernel[grid](*args, **constexprs)``)."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: None


@pytest.fixture
def kernels_stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    import volta_ct_wna16.kernels

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in dir(volta_ct_wna16.kernels):
        if name.endswith("_kernel"):
            monkeypatch.setattr(volta_ct_wna16.kernels, name, _NoLaunch())


@pytest.mark.usefixtures("kernels_stubbed")
@pytest.mark.parametrize("m", [1, 3, 16, 40, 600])
def test_a_linear_call_reads_nothing_back(m: int) -> None:
    pw = fresh_checkpoint(256, 384, SCHEME, seed=m).packed("trap")
    x = torch.randn(m, 384).half()
    with no_host_reads():
        wna16_linear(x, pw, torch.randn(256).half())


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
