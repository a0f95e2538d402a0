"""The speed estimate prices exactly the kernels the plan prints, with the installed plugins.

For every bundled example on a V100, at one token, at a tensor-core batch and with MTP, and for
routed-experts models made from the W4A16 and the FP8 examples (ct_wna16's experts and fp8w's)
at one token, 16 and 64, with and without NVRTC: every stage a plugin prices names the stage the
plan printed for that layer or module, the same kernel (or its fallback without NVRTC) and the
same unit. A second home for "which kernel runs" (a threshold in the host's estimate, a
roofline in a plugin that its dispatch does not read) makes this fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from volta_core.cli import main
from volta_core.host.discovery import get_plugin_manager
from volta_core.planner import plan as plan_module
from volta_core.planner.model import example_names, read_config

WORKLOADS = {
    "one token": ["--batch", "1"],
    "tensor-core batch": ["--batch", "16"],
    "MTP": ["--batch", "4", "--speculative-tokens", "2"],
}


def _has_mtp_head(example: str) -> bool:
    _, raw = read_config(example)
    return bool(raw.get("text_config", raw).get("mtp_num_hidden_layers"))


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    get_plugin_manager.cache_clear()
    main(["plan", *argv, "--json"])
    out, _ = capsys.readouterr()
    return json.loads(out)


def _printed(path: dict[str, Any], nvrtc: bool) -> tuple[str, str]:
    if path["needs_nvrtc"] and not nvrtc:
        return path["fallback"], path["fallback_unit"]
    return path["kernel"], path["unit"]


#: Every bundled example at every workload; MTP only where the example has a draft head.
CASES = [
    (example, workload)
    for example in example_names()
    for workload in sorted(WORKLOADS)
    if workload != "MTP" or _has_mtp_head(example)
]


#: The routed-experts models' workloads: a batch past the experts' decode step too.
MOE_WORKLOADS = {**WORKLOADS, "routed blocks": ["--batch", "64"]}

#: The routed-experts models: a bundled example made a Qwen3.5-MoE (:func:`_moe_config`), and
#: the plugin that serves its experts.
MOE_MODELS = {
    "routed experts": ("qwen3.5-27b-w4a16", "ct_wna16"),
    "routed experts fp8": ("qwen3.6-27b-fp8", "fp8w"),
}


def _moe_config(tmp_path: Path, example: str = "qwen3.5-27b-w4a16") -> str:
    """A bundled example (W4A16, or FP8 with 128 x 128 blocks) made a Qwen3.5-MoE (256
    experts, 8 a token, 512-wide, a shared expert): no bundled example has routed experts."""
    _, raw = read_config(example)
    raw["model_type"], raw["architectures"] = "qwen3_5_moe", ["Qwen3_5MoeForConditionalGeneration"]
    text = raw["text_config"]
    text.update(
        model_type="qwen3_5_moe_text",
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        hidden_size=2048,
        num_hidden_layers=40,
        num_attention_heads=16,
        num_key_value_heads=2,
        layer_types=text["layer_types"][:40],
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("nvrtc", [True, False], ids=["nvrtc", "no-nvrtc"])
@pytest.mark.parametrize(
    ("example", "workload"),
    [
        *CASES,
        *(
            (model, w)
            for model in MOE_MODELS
            for w in ("one token", "tensor-core batch", "routed blocks")
        ),
    ],
)
def test_every_priced_stage_runs_where_the_plan_says(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    example: str,
    workload: str,
    nvrtc: bool,
) -> None:
    found = ("12.9", "") if nvrtc else (None, "cuda-bindings is missing")
    monkeypatch.setattr(plan_module, "nvrtc_found", lambda: found)
    model = _moe_config(tmp_path, MOE_MODELS[example][0]) if example in MOE_MODELS else example
    argv = [model, "--max-model-len", "8192", "--context", "4096", "--gpus", "4"]
    data = _plan(capsys, *argv, *MOE_WORKLOADS[workload])
    speed = data["speed"]
    assert speed["nvrtc"] is (nvrtc or data["nvrtc"] is not None)
    attention = {a["layer"]: a for a in data["attention"]}
    first = next(a for a in data["attention"] if a["kernel_paths"])
    modules = {q["module"]: q["kernel_paths"] for q in data["quant"]}
    priced = [line for line in speed["kernels"] if line["served_by"] != "vLLM"]
    assert priced, "no stage of the example was priced by the plugin serving it"
    for line in priced:
        if line["module"].startswith("attention"):
            layers = [attention[i] if i >= 0 else first for i in line["layers"]]
            path_lists = [layer["kernel_paths"] for layer in layers]
        else:
            path_lists = [modules[line["module"]]]
        for paths in path_lists:
            (path,) = [p for p in paths if p["stage"] == line["stage"]]
            assert (line["kernel"], line["unit"]) == _printed(path, speed["nvrtc"]), line
    units = {line["unit"] for line in priced}
    if workload == "tensor-core batch" and nvrtc:
        assert "tensor cores" in units
    if example in MOE_MODELS:
        (experts,) = [line for line in priced if line["term"] == "MoE experts (routed)"]
        assert experts["served_by"] == MOE_MODELS[example][1]
        if workload == "routed blocks":
            # The plugin's grouped tensor-core GEMM (ct_wna16's int4/int8, fp8w's e4m3) where
            # NVRTC builds it, its Triton routed blocks else.
            want = (
                "tensor cores over routed blocks (CUDA, mma.m8n8k4)"
                if nvrtc
                else "Triton grouped GEMM over routed blocks"
            )
            assert experts["kernel"] == want, experts


def test_w4a16_mlp_is_priced_by_the_kernels_ct_wna16_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The W4A16 MLP as ct_wna16's dispatch runs it on a V100, stage by stage: at one token
    its split-K GEMV reads the packed int4 words and fp16 group scales (a quarter of fp16, and
    1/64 for the scales at group 128) and the activations, on the FMA units, bound by the
    bytes; at 16 tokens the tensor-core GEMM (CUDA mma.m8n8k4) reads the same weights, still
    bound by them; above 256 tokens the plugin dequantizes to fp16 first (4 more bytes per
    weight: fp16 written, then read by cuBLAS), bound by the tensor cores."""
    monkeypatch.setattr(plan_module, "nvrtc_found", lambda: ("12.9", ""))
    base = ["qwen3.5-27b-w4a16", "--max-model-len", "4096", "--context", "1024"]
    mlp = {}
    for batch in (1, 16, 300):
        plan = _plan(capsys, *base, "--batch", str(batch))
        mlp[batch] = {t["kernel"]: t for t in plan["speed"]["terms"]}["MLP"]
    params = 64 * 3 * 5120 * 17408
    packed = params // 2 + params // 128 * 2

    def activations(m: int) -> int:  # fp16 inputs read and outputs written, 3 modules a layer
        return 64 * 3 * (2 * m * 5120 + 2 * m * 17408)

    assert mlp[1]["kernels"] == ["Triton split-K on FMA"]
    assert (mlp[1]["bytes"], mlp[1]["bound"]) == (packed + activations(1), "HBM")
    assert mlp[16]["kernels"] == ["tensor cores (CUDA, mma.m8n8k4)"]
    assert (mlp[16]["bytes"], mlp[16]["bound"]) == (packed + activations(16), "HBM")
    assert mlp[300]["kernels"] == ["dequantize, then cuBLAS on tensor cores"]
    assert mlp[300]["bytes"] == packed + 4 * params + activations(300)
    assert mlp[300]["bound"] == "tensor cores"
