"""Reading the per-process reports the adapter writes under ``VLLM_VOLTA_REPORT_DIR``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Engine arguments every end-to-end engine uses: small, eager, CPU-sized, and float16 as on a
#: V100 (no bfloat16 there; the plugins' kernels take float16 activations).
ENGINE_ARGS = {
    "dtype": "float16",
    "gpu_memory_utilization": 0.1,
    "max_model_len": 256,
    "enforce_eager": True,
    "max_num_seqs": 4,
}


def cli_args(**extra: Any) -> list[str]:
    args: list[str] = []
    for key, value in {**ENGINE_ARGS, **extra}.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        else:
            args += [flag, str(value)]
    return args


def read_reports(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("volta-*.json"))]


def by_role(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The reports of the API server / main process, the engine core and the first worker."""
    roles: dict[str, dict[str, Any]] = {}
    for report in reports:
        name = report["process"]
        if name == "MainProcess":
            roles["main"] = report
        elif name.startswith("EngineCore"):
            roles["engine_core"] = report
        elif "Worker" in name:
            roles.setdefault("worker", report)
    return roles


def events(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in report["events"] if e["kind"] == kind]
