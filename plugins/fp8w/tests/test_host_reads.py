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
from test_kernels import fresh_weights
from test_moe import SCHEMES, make_case

from volta_devkit.host_reads import HostReadError, no_host_reads


class _NoLaunch:
    """A Triton kernel whose launch does nothing (``kernel[grid](*args, **constexprs)``)."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: None


@pytest.fixture
def kernels_stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    import volta_fp8w.kernels
    import volta_fp8w.kernels.moe

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in ("fp8w_splitk_kernel", "fp8w_gemm_kernel", "fp8w_dequant_kernel"):
        monkeypatch.setattr(volta_fp8w.kernels, name, _NoLaunch())
    for name in dir(volta_fp8w.kernels.moe):
        if name.endswith("_kernel"):
            monkeypatch.setattr(volta_fp8w.kernels.moe, name, _NoLaunch())


@pytest.mark.usefixtures("kernels_stubbed")
@pytest.mark.parametrize("m", [1, 3, 16, 40, 600])
def test_a_linear_call_reads_nothing_back(m: int) -> None:
    from volta_fp8w.ops import fp8_linear

    w = fresh_weights(256, 384, (128, 128), seed=m)
    x = torch.randn(m, 384).half()
    bias = torch.randn(256).half()
    with no_host_reads():
        fp8_linear(x, w, bias)


@pytest.mark.usefixtures("kernels_stubbed")
@pytest.mark.parametrize("m", [1, 16, 80])
def test_a_fused_experts_call_reads_nothing_back(m: int) -> None:
    """Both paths (the decode GEMVs, the routed blocks); the ids are not checked against the
    experts there (``check_values=False``, as on CUDA), and checking them is a host read."""
    from volta_fp8w.experts import experts_forward

    case = make_case(SCHEMES[0], experts=8)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, case.scheme.hidden, generator=gen).half()
    ids = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(m)]).to(torch.int32)
    weights = torch.rand(m, 2, generator=gen)
    with no_host_reads():
        experts_forward(x, case.weights, weights, ids, check_values=False)
    with no_host_reads(), pytest.raises(HostReadError):
        experts_forward(x, case.weights, weights, ids, check_values=True)
