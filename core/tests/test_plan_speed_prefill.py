"""The SM70 cost of vLLM's Gated DeltaNet kernels and the plan's prefill (time to first token).

Hand-computed at Qwen3.5-27B's linear-attention shapes (the bundled ``qwen3.5-27b-w4a16``:
16 key and 48 value heads of 128, conv width 4, the recurrent state in fp32 as its
``mamba_ssm_dtype`` says, fp16 activations), TP 1: ``Hg = 16, H = 48, K = V = 128, C = 2 x 16 x
128 + 48 x 128 = 10240``; the V100 whitepaper's 900 GB/s and 15.7 TFLOP/s FMA.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from volta_core.cli import main
from volta_core.host.discovery import get_plugin_manager
from volta_core.planner import linear_attention as gdn
from volta_core.planner import plan as plan_module
from volta_core.planner.model import read_config

HBM, FMA = 900e9, 15.7e12
QWEN35_27B = gdn.GdnShape(16, 48, 128, 128, 4, act_bytes=2, state_bytes=4)
#: One GDN layer's decode step at one sequence (the module docstring's formulas): the fused
#: recurrent update reads and writes the 48 x 128 x 128 fp32 state and reads q, k, v, a, b and
#: writes o; the conv update reads x and the 3-wide state, writes both back and the output.
RECURRENT_BYTES = 48 * 128 * 128 * 4 * 2 + 2 * (2 * 16 * 128 + 2 * 48 * 128 + 2 * 48)
CONV_UPDATE_BYTES = 2 * (2 * 10240 + 10240 * 3 * 2 + 10240 * 4)
NORM_BYTES = 2 * (3 * 48 * 128 + 128)
DECODE_LAYER_S = (RECURRENT_BYTES + CONV_UPDATE_BYTES + NORM_BYTES) / HBM  # 7.34 us
#: One GDN layer's 2048-token prefill chunk: the four tl.dot kernels' FLOPs over the FMA rate
#: plus the HBM-bound kernels' bytes over the bandwidth.
T, BT = 2048, 64
MATMUL_FLOPS = {
    "chunk_scaled_dot_kkt_fwd_kernel": 2 * T * 48 * BT * 128,
    "recompute_w_u_fwd_kernel": 2 * T * 48 * BT * (128 + 128),
    "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": 4 * T * 48 * 128 * 128,
    "chunk_fwd_kernel_o": T * 48 * (2 * 128 * 128 + 2 * BT * 128 * 2 + 2 * BT * 128),
}
MEMORY_BYTES = {
    "_causal_conv1d_fwd_kernel": 2 * (2 * T * 10240 + 10240 * 4) + 2 * 2 * 10240 * 3,
    "fused_gdn_gating_kernel": T * 48 * (2 * 2 + 4 + 2),
    "l2norm_fwd_kernel2": 2 * (2 * 2 * T * 16 * 128),
    "chunk_local_cumsum_scalar_kernel": 8 * T * 48,
    "merge_16x16_to_64x64_inverse_kernel": T * 48 * BT * (4 + 2),
    "layer_norm_fwd_kernel": 2 * (3 * T * 48 * 128 + 128),
}
PREFILL_LAYER_S = sum(MATMUL_FLOPS.values()) / FMA + sum(MEMORY_BYTES.values()) / HBM  # 1.49 ms


def test_gdn_decode_step_at_qwen35_27b() -> None:
    kernels = {c.kernel: c for c in gdn.decode_step(QWEN35_27B, 1)}
    assert list(kernels) == list(gdn.DECODE_KERNELS)
    recurrent = kernels["fused_sigmoid_gating_delta_rule_update_kernel"]
    assert (recurrent.bytes, recurrent.flops) == (RECURRENT_BYTES, 7 * 48 * 128 * 128)
    assert recurrent.bound() == "HBM"
    assert kernels["_causal_conv1d_update_kernel"].bytes == CONV_UPDATE_BYTES
    assert sum(c.seconds() for c in kernels.values()) == pytest.approx(DECODE_LAYER_S)
    # The packed decode reads the conv output instead of q, k and v: the same cost.
    packed = gdn.decode_kernel(
        "fused_recurrent_gated_delta_rule_packed_decode_kernel", QWEN35_27B, 1
    )
    assert (packed.bytes, packed.flops) == (recurrent.bytes, recurrent.flops)
    # Eight sequences with two new tokens each: the state is read once and written per token.
    eight = gdn.decode_kernel(recurrent.kernel, QWEN35_27B, 8, 2)
    assert eight.bytes == 8 * 48 * 128 * 128 * 4 * 3 + 16 * 2 * (16480)


def test_gdn_prefill_chunk_at_qwen35_27b() -> None:
    kernels = {c.kernel: c for c in gdn.prefill_chunk(QWEN35_27B, T)}
    assert list(kernels) == list(gdn.PREFILL_KERNELS)
    for name, flops in MATMUL_FLOPS.items():
        assert (kernels[name].flops, kernels[name].bound()) == (flops, "FMA"), name
    for name, nbytes in MEMORY_BYTES.items():
        assert (kernels[name].bytes, kernels[name].bound()) == (nbytes, "HBM"), name
    solve = kernels["merge_16x16_to_64x64_inverse_kernel"]
    assert solve.flops == T // BT * 48 * (4 * 14 * 2 * 16 * 16 + 16 * 2 * 16**3)
    assert sum(c.seconds() for c in kernels.values()) == pytest.approx(PREFILL_LAYER_S)
    # TP 2 halves the heads: every kernel's work halves, but for the conv weights and norm.
    half = gdn.GdnShape(8, 24, 128, 128, 4, act_bytes=2, state_bytes=4)
    halved = sum(c.seconds() for c in gdn.prefill_chunk(half, T))
    assert halved == pytest.approx(PREFILL_LAYER_S / 2, rel=1e-3)


def test_gdn_cost_refuses_what_it_does_not_model() -> None:
    with pytest.raises(ValueError, match="no SM70 cost for the Gated DeltaNet prefill kernel"):
        gdn.prefill_kernel("flash_qla", QWEN35_27B, T)
    with pytest.raises(ValueError, match="at least one token"):
        gdn.prefill_kernel("chunk_fwd_kernel_o", QWEN35_27B, 0)
    with pytest.raises(ValueError, match="has heads"):
        gdn.GdnShape(0, 48, 128, 128, 4)


@pytest.fixture(autouse=True)
def fresh_plugin_manager() -> None:
    get_plugin_manager.cache_clear()


def _unquantized(tmp_path: Path) -> str:
    """The 27B example without its quantization: every layer is vLLM's own or an attention
    backend's, so the core prices it with no plugin installed."""
    _, raw = read_config("qwen3.5-27b-w4a16")
    raw.pop("quantization_config")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return str(tmp_path / "config.json")


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    assert err == "", err
    return code, out


def _terms(block: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["kernel"]: t for t in block["terms"]}


def test_plan_prices_gdn_layers_and_the_prefill(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Decode: the 48 GDN layers' FLA fused_recurrent term; prefill: a 5000-token prompt in
    chunks of 2048, 2048 and 904 (--max-num-batched-tokens), each a pass of the model; its
    time is the sum of its terms, and its text line states the time to first token."""
    config = _unquantized(tmp_path)
    argv = [config, "--max-model-len", "8192", "--context", "4096", "--prompt-tokens", "5000"]
    code, out = _plan(capsys, *argv, "--json")
    assert code == 0
    speed = json.loads(out)["speed"]
    decode = _terms(speed)["linear attention (FLA fused_recurrent on FMA)"]
    assert decode["count"] == 48
    assert decode["ms"] == pytest.approx(48 * DECODE_LAYER_S * 1e3, rel=1e-3)
    assert not any("state" in t for t in _terms(speed))
    lines = [k for k in speed["kernels"] if k["term"] == decode["kernel"]]
    assert {k["kernel"] for k in lines} == set(gdn.DECODE_KERNELS)
    assert all(len(k["layers"]) == 48 and k["stage"] == "decode" for k in lines)

    prefill = speed["prefill"]
    assert (prefill["prompt_tokens"], prefill["chunk_tokens"], prefill["chunks"]) == (5000, 2048, 3)
    chunked = _terms(prefill)["linear attention (FLA chunk_gated_delta_rule on FMA)"]
    per_layer = 2 * PREFILL_LAYER_S + sum(c.seconds() for c in gdn.prefill_chunk(QWEN35_27B, 904))
    assert chunked["ms"] == pytest.approx(48 * per_layer * 1e3, rel=1e-3)
    # The MLP runs three passes: its weights are read three times, its FLOPs are the prompt's.
    mlp = _terms(prefill)["MLP"]
    assert mlp["flops"] == 2 * 5000 * 64 * 3 * 5120 * 17408
    assert mlp["bytes"] == 3 * _terms(speed)["MLP"]["bytes"]

    _code, out = _plan(capsys, *argv[:-2], "--prompt-tokens", "2048")
    (line,) = [x for x in out.splitlines() if x.startswith("prefill (ESTIMATE for V100")]
    assert "2048-token prompt in " in line
    assert " ms (time to first token), " in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompt-tokens", "0"], "--prompt-tokens 0 must be at least 1"),
        (["--prompt-tokens", "9000"], "--prompt-tokens 9000 is longer than --max-model-len 8192"),
    ],
)
def test_bad_prompt_length_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    code = main(["plan", _unquantized(tmp_path), "--max-model-len", "8192", *argv])
    _out, err = capsys.readouterr()
    assert code == 2
    assert err.strip().endswith(message)
    assert "Traceback" not in err


@pytest.mark.needs("vllm-volta-ct-wna16")
def test_moe_prefill_runs_ct_wna16s_tensor_core_kernels(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A Qwen3-30B-A3B-like W4A16 MoE (the 27B example with 128 experts, 8 a token, 768 wide)
    at a 2048-token chunk: ct_wna16 prices its routed experts with its grouped tensor-core
    GEMM and its dense projections with the tensor-core path, as the plan prints them."""
    monkeypatch.setattr(plan_module, "nvrtc_found", lambda: ("12.9", ""))
    _, raw = read_config("qwen3.5-27b-w4a16")
    raw["model_type"], raw["architectures"] = "qwen3_5_moe", ["Qwen3_5MoeForConditionalGeneration"]
    text = raw["text_config"]
    text.update(
        model_type="qwen3_5_moe_text",
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        shared_expert_intermediate_size=0,
        hidden_size=2048,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        layer_types=text["layer_types"][:48],
    )
    (tmp_path / "config.json").write_text(json.dumps(raw))
    argv = [str(tmp_path / "config.json"), "--max-model-len", "8192", "--prompt-tokens", "2048"]
    _, out = _plan(capsys, *argv, "--json")
    data = json.loads(out)
    prefill = data["speed"]["prefill"]
    (experts,) = [k for k in prefill["kernels"] if k["term"] == "MoE experts (routed)"]
    assert experts["served_by"] == "ct_wna16"
    assert (experts["kernel"], experts["unit"]) == (
        "tensor cores over routed blocks (CUDA, mma.m8n8k4)",
        "tensor cores",
    )
    (printed,) = [
        p
        for q in data["quant"]
        if q["module"] == experts["module"]
        for p in q["kernel_paths"]
        if p["stage"] == experts["stage"]
    ]
    assert printed["kernel"] == experts["kernel"]
    projections = [k for k in prefill["kernels"] if k["served_by"] == "ct_wna16"]
    assert all(k["unit"] == "tensor cores" for k in projections)
