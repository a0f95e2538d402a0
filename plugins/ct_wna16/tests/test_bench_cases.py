"""The call ``vllm-volta bench`` times for a claimed linear layer computes that layer.

Run through the plugin's hook as the command asks it (``volta_bench_case``, then the named
function), on CPU under the Triton interpreter in CI: the output is ``x @ dequant(W).T`` of the
input set the call built, and the bytes it declares are the bytes it allocates.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from ct_wna16_checkpoints import quantization_config

from volta_core import Device, LayerKind, QuantConfig, QuantLayer
from volta_core.kernel_api import Workload
from volta_ct_wna16 import plugin
from volta_ct_wna16.layout import dequantize
from volta_ct_wna16.scheme import WeightScheme
from volta_devkit.testing import assert_rel_close

V100 = Device((7, 0))
LAYER = QuantLayer(LayerKind.LINEAR, "model.layers.0.mlp.down_proj", 256, 64)


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_the_bench_call_is_the_layer(kernel_device: str, symmetric: bool) -> None:
    quant = QuantConfig("compressed-tensors", quantization_config(WeightScheme(4, symmetric, 32)))
    work = Workload(2)
    case = plugin.volta_bench_case(LAYER, plugin.METHOD, V100, quant, work)
    assert case is not None
    cost = plugin.volta_kernel_cost(LAYER, plugin.METHOD, V100, quant, work)
    assert cost is not None
    assert (case.stage, case.kernel) == (cost.stage, cost.cost.kernel)
    module, _, name = case.impl.partition(":")
    call = getattr(importlib.import_module(module), name)(LAYER, quant, work, kernel_device)
    torch.manual_seed(0)
    x, weights, out = call.make_inputs()
    allocated = [x, weights.qweight, weights.scales, weights.zeros, weights.zeros8, out]
    assert call.bytes_per_set == sum(
        t.numel() * t.element_size() for t in allocated if t is not None
    )
    call.run(x, weights, out)
    reference = x.double() @ dequantize(weights).t()
    assert_rel_close(out, reference, 1e-2, f"bench call, {'sym' if symmetric else 'asym'}")


def test_fused_experts_and_act_order_give_no_bench_case() -> None:
    experts = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 256, 64, 8, 2)
    quant = QuantConfig("compressed-tensors", quantization_config(WeightScheme(4, True, 32)))
    assert plugin.volta_bench_case(experts, plugin.METHOD, V100, quant, Workload(1)) is None
    assert plugin.volta_bench_case(LAYER, "another-method", V100, quant, Workload(1)) is None
