"""The calls ``vllm-volta bench`` times for a claimed linear layer and for fused experts
compute them.

Run through the plugin's hook as the command asks it (``volta_bench_case``, then the named
function), on CPU under the Triton interpreter in CI: a linear call's output is
``x @ dequant(W).T`` of the input set it built; an experts call's, at a decode count and at a
routed-blocks count, each token's router-weighted sum of ``down(SiLU(gate(x)) * up(x))`` over
its experts; and the bytes each call declares are the bytes it allocates.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from ct_wna16_awq_gptq import quantization_config as gptq_config
from ct_wna16_checkpoints import quantization_config

from volta_core import Device, LayerKind, QuantConfig, QuantLayer
from volta_core.kernel_api import BenchCall, Workload
from volta_ct_wna16 import plugin
from volta_ct_wna16.layout import PackedWeights, dequantize
from volta_ct_wna16.scheme import Packing, WeightScheme
from volta_devkit.testing import assert_rel_close

V100 = Device((7, 0))
LAYER = QuantLayer(LayerKind.LINEAR, "model.layers.0.mlp.down_proj", 256, 64)
#: Fused experts: 8 experts of 64 intermediate rows on a 128-wide model, 2 a token.
EXPERTS = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 128, 64, 8, 2)


def _quant(symmetric: bool) -> QuantConfig:
    return QuantConfig("compressed-tensors", quantization_config(WeightScheme(4, symmetric, 32)))


def _call(layer: QuantLayer, quant: QuantConfig, work: Workload, device: str) -> BenchCall:
    """The hook's case for ``work`` (the stage and kernel of the plugin's cost) and its call."""
    case = plugin.volta_bench_case(layer, plugin.METHOD, V100, quant, work)
    assert case is not None
    cost = plugin.volta_kernel_cost(layer, plugin.METHOD, V100, quant, work)
    assert cost is not None
    assert (case.stage, case.kernel) == (cost.stage, cost.cost.kernel)
    module, _, name = case.impl.partition(":")
    call = getattr(importlib.import_module(module), name)(layer, quant, work, device)
    assert isinstance(call, BenchCall)
    return call


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_the_bench_call_is_the_layer(kernel_device: str, symmetric: bool) -> None:
    call = _call(LAYER, _quant(symmetric), Workload(2), kernel_device)
    torch.manual_seed(0)
    x, weights, out = call.make_inputs()
    assert call.bytes_per_set == _nbytes(
        x, weights.qweight, weights.scales, weights.zeros, weights.zeros8, out
    )
    call.run(x, weights, out)
    reference = x.double() @ dequantize(weights).t()
    assert_rel_close(out, reference, 1e-2, f"bench call, {'sym' if symmetric else 'asym'}")


def _expert(pw: PackedWeights, e: int) -> torch.Tensor:
    """Expert ``e``'s dense ``[n, k]`` weight in float64."""
    zeros = pw.zeros[e] if pw.zeros is not None else None
    one = PackedWeights(pw.qweight[e], pw.scales[e], zeros, pw.n, pw.k, pw.bits, pw.group)
    return dequantize(one)


@pytest.mark.parametrize("tokens", [3, 24], ids=["decode", "routed blocks"])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_the_bench_call_is_the_experts_step(
    kernel_device: str, symmetric: bool, tokens: int
) -> None:
    call = _call(EXPERTS, _quant(symmetric), Workload(tokens), kernel_device)
    torch.manual_seed(0)
    x, weights, router, ids = call.make_inputs()
    w13, w2 = weights.w13, weights.w2
    assert call.bytes_per_set == _nbytes(
        x, router, ids, w13.qweight, w13.scales, w13.zeros, w2.qweight, w2.scales, w2.zeros
    )
    top_k, inter = EXPERTS.top_k, EXPERTS.output_size
    assert ids.shape == (tokens, top_k)
    assert all(len(set(row)) == top_k for row in ids.tolist())  # distinct experts a token
    torch.testing.assert_close(router.sum(dim=1).cpu(), torch.ones(tokens))
    out = call.run(x, weights, router, ids)
    assert isinstance(out, torch.Tensor)
    expected = torch.zeros(tokens, EXPERTS.input_size, dtype=torch.float64)
    for t in range(tokens):
        for s in range(top_k):
            e = int(ids[t, s])
            h = _expert(w13, e) @ x[t].double().cpu()
            act = torch.nn.functional.silu(h[:inter]) * h[inter:]
            expected[t] += float(router[t, s]) * (_expert(w2, e) @ act)
    assert_rel_close(out, expected, 2e-2, f"bench experts call, {tokens} tokens")


def test_act_order_and_another_method_give_no_bench_case() -> None:
    """GPTQ act-order gathers each call's input (not what the call times); a layer another
    method serves is not the plugin's to time."""
    act_order = gptq_config(WeightScheme(4, True, 32, Packing.GPTQ, act_order=True))
    quant = QuantConfig("gptq", act_order)
    assert plugin.volta_bench_case(LAYER, plugin.METHOD, V100, quant, Workload(1)) is None
    assert plugin.volta_bench_case(LAYER, "another-method", V100, _quant(True), Workload(1)) is None
