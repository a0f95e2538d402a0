"""A per-process record of what the adapter did, for operators and end-to-end tests.

vLLM runs the adapter in several processes (API server, engine core, workers), whose logs are
interleaved or lost. With ``VLLM_VOLTA_REPORT_DIR`` set, each process keeps one JSON file
``volta-<pid>.json`` there: the process, the vLLM version, every discovered plugin with its
status, and each thing the adapter applied (parsers registered, quantization configs
overridden, KV-cache decisions, attention routes). Unset, nothing is written.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
from pathlib import Path
from typing import Any

ENV_REPORT_DIR = "VLLM_VOLTA_REPORT_DIR"

_lock = threading.Lock()
_report: dict[str, Any] | None = None


def _path() -> Path | None:
    directory = os.environ.get(ENV_REPORT_DIR)
    return Path(directory) / f"volta-{os.getpid()}.json" if directory else None


def _current() -> dict[str, Any]:
    global _report
    if _report is None or _report.get("pid") != os.getpid():
        _report = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "process": multiprocessing.current_process().name,
            "argv": sys.argv[:3],
            "events": [],
        }
    return _report


def _write(report: dict[str, Any]) -> None:
    path = _path()
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=True))
    tmp.replace(path)


def set_fields(**fields: Any) -> None:
    """Record process-wide facts (vLLM version, plugins...)."""
    with _lock:
        report = _current()
        report.update(fields)
        _write(report)


def event(kind: str, **detail: Any) -> None:
    """Record one thing the adapter applied; identical events are kept once."""
    with _lock:
        report = _current()
        entry = {"kind": kind, **detail}
        if entry not in report["events"]:
            report["events"].append(entry)
            _write(report)
