"""A per-process record of what the adapter did, for operators and end-to-end tests.

vLLM runs the adapter in several processes (API server, engine core, workers), whose logs are
interleaved or lost. With ``VLLM_VOLTA_REPORT_DIR`` set, each process keeps one JSON file
``volta-<pid>.json`` there: the process, the vLLM version, every discovered plugin with its
status, and each thing the adapter applied (parsers registered, quantization configs
overridden, KV-cache decisions, attention routes). Unset, nothing is written.

Writing a report never fails the process it describes: a directory that cannot be created or
written is logged once and the report dropped. Files are created mode 0600 under a random
temporary name (``O_EXCL``, never through a link) and renamed into place, so a link planted at
a predictable name redirects nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ENV_REPORT_DIR = "VLLM_VOLTA_REPORT_DIR"

_lock = threading.Lock()
_report: dict[str, Any] | None = None
_failed_pid: int | None = None  # the process whose report could not be written
_logger = logging.getLogger(__name__)


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


def _warn_once(path: Path, exc: Exception) -> None:
    global _failed_pid
    if _failed_pid != os.getpid():
        _failed_pid = os.getpid()
        _logger.warning(
            "vllm-volta: cannot write the report %s (%s): %s; reports are off in this process",
            path,
            ENV_REPORT_DIR,
            exc,
        )


def _write(report: dict[str, Any]) -> None:
    path = _path()
    if path is None or _failed_pid == os.getpid():
        return
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    except OSError as exc:
        _warn_once(path, exc)
        return
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(report, indent=1, sort_keys=True, default=str))
        os.replace(tmp, path)
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _warn_once(path, exc)


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
