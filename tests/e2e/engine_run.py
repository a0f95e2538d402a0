"""Run one offline vLLM engine on a checkpoint and print what it generated as one JSON line.

Run as a script (vLLM spawns its engine processes, so the work sits under the main guard):
``python engine_run.py MODEL KV_CACHE_DTYPE``. Prints ``{"text": ..., "finish_reason": ...}``
or exits non-zero with vLLM's error on stderr.
"""

from __future__ import annotations

import json
import sys

from e2e_reports import ENGINE_ARGS


def main(model: str, kv_cache_dtype: str) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, kv_cache_dtype=kv_cache_dtype, **ENGINE_ARGS)
    params = SamplingParams(temperature=0, max_tokens=16)
    out = llm.chat([{"role": "user", "content": "hello there"}], params)[0].outputs[0]
    print("RESULT " + json.dumps({"text": out.text, "finish_reason": out.finish_reason}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
