"""The hooks: what the plugin claims, declines and leaves alone, through the real host."""

from __future__ import annotations

import pytest

from volta_core.device import Device
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import LayerKind, QuantClaim, QuantConfig, QuantLayer, TensorSplit
from volta_fp8w import plugin
from volta_fp8w.plugin import FACTORY, METHOD, MOE_FACTORY
from volta_fp8w.scheme import Fp8Scheme, quant_layer_scheme

V100 = Device((7, 0))
T4 = Device((7, 5))
A100 = Device((8, 0))
H100 = Device((9, 0))

#: Qwen's official FP8 releases (Qwen3-*-FP8, Qwen3.5/3.6-*-FP8) state exactly this.
QWEN_FP8 = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


def ct_fp8(strategy: str = "channel", activations: dict | None = None, **extra) -> dict:
    """A compressed-tensors FP8 config as llm-compressor writes it (FP8_DYNAMIC: channel weights,
    dynamic per-token activations; FP8_BLOCK: 128x128 blocks)."""
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy}
    if strategy == "block":
        weights["block_structure"] = [128, 128]
    weights.update(extra.pop("weights", {}))
    return {
        "quant_method": "compressed-tensors",
        "format": extra.pop("format", "float-quantized"),
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": activations,
            }
        },
        "ignore": extra.pop("ignore", ["lm_head"]),
    }


def linear(prefix: str = "model.layers.0.mlp.down_proj") -> QuantLayer:
    return QuantLayer(LayerKind.LINEAR, prefix, input_size=3072, output_size=1024)


def experts() -> QuantLayer:
    return QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts")


@pytest.fixture(scope="module")
def manager() -> VoltaPluginManager:
    pm = VoltaPluginManager(strict=True)
    pm.register(plugin, "fp8w", distribution="vllm-volta-fp8w", version="0.1.0")
    return pm


def claim(manager, raw: dict, layer: QuantLayer, device: Device = V100) -> QuantClaim | None:
    return manager.resolve_quant(QuantConfig(raw["quant_method"], raw), layer, device).claim


def declines(manager, raw: dict, layer: QuantLayer, device: Device = V100) -> list[str]:
    resolution = manager.resolve_quant(QuantConfig(raw["quant_method"], raw), layer, device)
    return [decline.reason for _, decline in resolution.declines]


def test_qwen_fp8_release_linear_layers_and_experts_are_claimed_on_a_v100(manager) -> None:
    got = claim(manager, QWEN_FP8, linear())
    assert got == QuantClaim(
        METHOD,
        FACTORY,
        priority=10,
        detail=(
            "FP8 e4m3 W8A16 block 128x128 (the checkpoint's dynamic FP8 activations run as fp16)"
        ),
    )
    moe = claim(manager, QWEN_FP8, experts())
    assert moe is not None
    assert moe.impl == MOE_FACTORY
    assert moe.detail.startswith("fused MoE")


@pytest.mark.parametrize("device", [V100, T4, H100])
def test_claimed_on_volta_turing_and_the_tested_hopper(manager, device) -> None:
    assert claim(manager, QWEN_FP8, linear(), device) is not None


def test_declined_on_ampere_where_vllm_runs_fp8_itself(manager) -> None:
    assert claim(manager, QWEN_FP8, linear(), A100) is None
    [reason] = declines(manager, QWEN_FP8, linear(), A100)
    assert "sm_80" in reason
    assert "vLLM's own FP8" in reason


def test_fp8_ignored_layers_follow_vllms_exact_rule(manager) -> None:
    raw = dict(
        QWEN_FP8,
        ignored_layers=[
            "model.layers.0.mlp.down_proj",
            "model.layers.1.self_attn.q_proj",
            "model.layers.1.self_attn.k_proj",
            "model.layers.1.self_attn.v_proj",
            "model.layers.2.self_attn.q_proj",
            "model.layers.3.mlp.experts.0.down_proj",
        ],
    )
    assert claim(manager, raw, linear()) is None
    assert declines(manager, raw, linear()) == []
    assert claim(manager, raw, linear("model.layers.1.self_attn.qkv_proj")) is None
    assert claim(manager, raw, linear("model.layers.1.mlp.down_proj")) is not None
    [reason] = declines(manager, raw, linear("model.layers.2.self_attn.qkv_proj"))
    assert "shards" in reason
    # vLLM's exact mode ignores experts by substring of an ignored expert name.
    assert (
        claim(manager, raw, QuantLayer(LayerKind.FUSED_MOE, "model.layers.3.mlp.experts")) is None
    )
    # HF's key, which vLLM reads when ignored_layers is absent.
    hf = dict(QWEN_FP8, modules_to_not_convert=["model.layers.0.mlp.down_proj"])
    assert claim(manager, hf, linear()) is None


def test_the_fp8_output_head_stays_vllms(manager) -> None:
    """vLLM's ``Fp8Config`` never quantizes ``lm_head`` (a ``ParallelLMHead``, not a linear
    layer, so the adapter never asks for it); the plan keeps it unquantized without asking the
    plugins, and fp8w serves every other module of the example."""
    from volta_core.planner.model import describe_model, read_config
    from volta_core.planner.plan import PlanOptions, make_plan

    name, raw = read_config("qwen3.6-27b-fp8")
    plan = make_plan(describe_model(name, raw), PlanOptions(device=V100), manager)
    rows = {row.prefix: row for row in plan.quant}
    assert rows["lm_head"].plugin is None
    assert rows["lm_head"].decision.startswith("unquantized (vLLM's fp8 method")
    served = [row for row in plan.quant if row.kind == "linear" and row.prefix != "lm_head"]
    assert served
    assert {row.plugin for row in served} == {"fp8w"}


def test_per_tensor_fp8_checkpoints_are_claimed() -> None:
    raw = {"quant_method": "fp8", "activation_scheme": "static"}
    assert quant_layer_scheme(raw, linear()) == Fp8Scheme("tensor", None, "fp8", "static")
    assert quant_layer_scheme(raw, linear()).scale_name == "weight_scale"
    assert quant_layer_scheme(QWEN_FP8, linear()).scale_name == "weight_scale_inv"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (dict(QWEN_FP8, fmt="e5m2"), "format 'e5m2'"),
        (dict(QWEN_FP8, weight_block_size=[128, 48]), "multiple of 32"),
        (dict(QWEN_FP8, weight_block_size=[128]), "two positive integers"),
        (dict(QWEN_FP8, store_dtype="mxfp4"), "stored as 'mxfp4'"),
        (ct_fp8(format="pack-quantized"), "format 'pack-quantized'"),
        (ct_fp8("group", weights={"group_size": 128}), "strategy 'group'"),
        (ct_fp8(weights={"dynamic": True}), "dynamic weight quantization"),
        (ct_fp8(weights={"symmetric": False}), "asymmetric"),
        (ct_fp8("block", weights={"block_structure": [128, 100]}), "multiple of 32"),
    ],
)
def test_what_it_does_not_run_is_declined_with_the_reason(manager, raw, reason) -> None:
    assert claim(manager, raw, linear()) is None
    [said] = declines(manager, raw, linear())
    assert reason in said


@pytest.mark.parametrize(
    ("raw", "scheme"),
    [
        (ct_fp8("channel"), Fp8Scheme("channel", None, "compressed-tensors")),
        (
            ct_fp8("channel", {"num_bits": 8, "type": "float", "dynamic": True}),
            Fp8Scheme("channel", None, "compressed-tensors", "dynamic"),
        ),
        (
            ct_fp8("tensor", {"num_bits": 8, "type": "float", "dynamic": False}),
            Fp8Scheme("tensor", None, "compressed-tensors", "static"),
        ),
        (ct_fp8("block"), Fp8Scheme("block", (128, 128), "compressed-tensors")),
        (ct_fp8(format="naive-quantized"), Fp8Scheme("channel", None, "compressed-tensors")),
    ],
)
def test_compressed_tensors_fp8_schemes_run_weight_only(manager, raw, scheme) -> None:
    assert quant_layer_scheme(raw, linear()) == scheme
    got = claim(manager, raw, linear())
    assert got is not None
    assert got.detail == scheme.label
    assert scheme.scale_name == "weight_scale"


def test_compressed_tensors_layers_of_other_formats_are_left_alone(manager) -> None:
    int4 = ct_fp8("group", weights={"type": "int", "num_bits": 4, "group_size": 128})
    int4["format"] = "pack-quantized"
    assert claim(manager, int4, linear()) is None
    assert declines(manager, int4, linear()) == []
    assert claim(manager, ct_fp8(), linear("lm_head")) is None
    assert claim(manager, {"quant_method": "awq", "bits": 4}, linear()) is None


def test_compressed_tensors_experts_read_expert_zeros_projections(manager) -> None:
    raw = ct_fp8("block")
    assert claim(manager, raw, experts()) is not None
    mixed = dict(raw, ignore=["lm_head", "model.layers.0.mlp.experts.0.down_proj"])
    [reason] = declines(manager, mixed, experts())
    assert "quantized differently" in reason


@pytest.mark.parametrize("raw", [QWEN_FP8, ct_fp8("block")], ids=["fp8", "compressed-tensors"])
def test_a_rank_that_would_cut_a_scale_block_is_declined(manager, raw) -> None:
    """Qwen3-30B-A3B's experts (intermediate size 768) and a row-parallel layer of 768 inputs,
    with 128x128 blocks: whole blocks on each rank at 1 and 2 ranks, not at 4 (192): declined
    with the loaders' own reasons (``expert_blocks_reason``, ``block_shards_reason``)."""
    for tp in (1, 2, 4):
        moe = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 2048, 768, 128, 8, tp)
        row = QuantLayer(
            LayerKind.LINEAR,
            "model.layers.0.mlp.down_proj",
            768,
            2048,
            tensor_parallel_size=tp,
            split=TensorSplit.INPUT,
        )
        if tp <= 2:
            assert claim(manager, raw, moe) is not None
            assert claim(manager, raw, row) is not None
            continue
        assert claim(manager, raw, moe) is None
        [reason] = declines(manager, raw, moe)
        assert reason.startswith("intermediate size per TP rank 192 (of 768, 4 ranks)")
        assert claim(manager, raw, row) is None
        [reason] = declines(manager, raw, row)
        assert reason.startswith("192 inputs per tensor-parallel rank is not a multiple")
        # The same layer split by output rows keeps whole input blocks on each rank.
        column = QuantLayer(
            LayerKind.LINEAR, "model.layers.0.mlp.down_proj", 768, 2048, tensor_parallel_size=tp
        )
        assert claim(manager, raw, column) is not None


def test_channel_scales_are_claimed_at_any_split(manager) -> None:
    moe = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 2048, 768, 128, 8, 4)
    assert claim(manager, ct_fp8("channel"), moe) is not None
