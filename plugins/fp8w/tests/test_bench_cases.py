"""The calls ``vllm-volta bench`` times for a claimed FP8 linear layer and for fused FP8
experts compute them.

Run through the plugin's hook as the command asks it (``volta_bench_case``, then the named
function), on CPU under the Triton interpreter in CI: a linear call's output, at a count of
each stage the dispatch names on a V100, is ``x @ W.T`` of the input set it built (block and
channel scales); an experts call's, at a decode count and at a routed-blocks count, each
token's router-weighted sum of ``down(SiLU(gate(x)) * up(x))`` over its experts; and the bytes
each call declares are the bytes it allocates.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

from volta_core import Device, LayerKind, QuantConfig, QuantLayer
from volta_core.kernel_api import BenchCall, Workload
from volta_devkit.testing import assert_rel_close
from volta_fp8w import plugin
from volta_fp8w.dispatch import linear_paths
from volta_fp8w.layout import Fp8Weights

V100 = Device((7, 0))
LAYER = QuantLayer(LayerKind.LINEAR, "model.layers.0.mlp.down_proj", 256, 64)
#: Fused experts: 8 experts of 128 intermediate rows on a 128-wide model, 2 a token.
EXPERTS = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 128, 128, 8, 2)
#: Qwen's FP8 releases (128 x 128 blocks) and llm-compressor's channel-wise FP8.
CONFIGS: dict[str, dict[str, Any]] = {
    "block": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
    "channel": {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            }
        },
    },
}


def _quant(name: str) -> QuantConfig:
    raw = CONFIGS[name]
    return QuantConfig(raw["quant_method"], raw)


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


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _dense(w: Fp8Weights) -> torch.Tensor:
    """``w``'s float64 ``[n, k]`` weight (one expert's where ``w`` is a stack's slice)."""
    return w.dequantize().double()


#: One token count in each stage the dispatch names for LAYER on a V100 (1-7, 8, 9-32, 33+).
STAGE_COUNTS = [1, 8, 9, 33]


def test_the_counts_reach_every_linear_stage() -> None:
    stages = [p.stage for p in linear_paths(LAYER.output_size, LAYER.input_size, V100.capability)]
    quant = _quant("block")
    reached = []
    for m in STAGE_COUNTS:
        case = plugin.volta_bench_case(LAYER, plugin.METHOD, V100, quant, Workload(m))
        assert case is not None
        reached.append(case.stage)
    assert reached == stages


@pytest.mark.parametrize("tokens", STAGE_COUNTS)
@pytest.mark.parametrize("scheme", sorted(CONFIGS))
def test_the_bench_call_is_the_layer(kernel_device: str, scheme: str, tokens: int) -> None:
    call = _call(LAYER, _quant(scheme), Workload(tokens), kernel_device)
    torch.manual_seed(0)
    x, weights, out = call.make_inputs()
    assert call.bytes_per_set == _nbytes(x, weights.weight, weights.scales, out)
    assert not bool(((weights.weight & 0x7F) == 0x7F).any())  # no NaN code
    call.run(x, weights, out)
    reference = x.double() @ _dense(weights).t()
    assert_rel_close(out, reference, 1e-2, f"bench call, {scheme}, {tokens} tokens")


@pytest.mark.parametrize("tokens", [3, 24], ids=["decode", "routed blocks"])
@pytest.mark.parametrize("scheme", sorted(CONFIGS))
def test_the_bench_call_is_the_experts_step(kernel_device: str, scheme: str, tokens: int) -> None:
    call = _call(EXPERTS, _quant(scheme), Workload(tokens), kernel_device)
    torch.manual_seed(0)
    x, weights, router, ids = call.make_inputs()
    w13, w2 = weights.w13, weights.w2
    assert call.bytes_per_set == _nbytes(
        x, router, ids, w13.weight, w13.scales, w2.weight, w2.scales
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
            gate_up, down = weights.expert(int(ids[t, s]))
            h = _dense(gate_up) @ x[t].double()
            act = torch.nn.functional.silu(h[:inter]) * h[inter:]
            expected[t] += float(router[t, s]) * (_dense(down) @ act)
    assert_rel_close(out, expected, 2e-2, f"bench experts call, {scheme}, {tokens} tokens")


def test_another_method_gives_no_bench_case() -> None:
    quant = _quant("block")
    assert plugin.volta_bench_case(LAYER, "another-method", V100, quant, Workload(1)) is None
    unknown = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 128, 128)
    assert plugin.volta_bench_case(unknown, plugin.METHOD, V100, quant, Workload(1)) is None
