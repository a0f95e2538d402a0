"""The installed vLLM family's Gated DeltaNet kernels build and fit sm_70, without a GPU.

The launches are the family's own (gdn_launches: its host code run on CPU tensors, as on a
V100, for Qwen3.5-27B and 35B-A3B at TP 1, 2 and 4); each autotune group at the headline
shape is compiled for sm_70 through the devkit's gate until one configuration runs (gdn_gate).
All of it happens in gdn_report.py, in a child process with the Triton compiler on. With
``VOLTA_GDN_SM70_REPORT`` set, the report is also written there, for the README's table
(render_table.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent

#: What each phase of the layer must launch, by a part of the kernel's name, in every family.
PREFILL_STAGES = (
    "causal_conv1d_fwd",
    "chunk_local_cumsum",
    "chunk_scaled_dot_kkt",
    "merge_16x16_to_64x64_inverse",
    "recompute_w_u",
    "chunk_gated_delta_rule_fwd_kernel_h",
    "chunk_fwd_kernel_o",
    "layer_norm_fwd",
)
DECODE_STAGES = ("causal_conv1d_update", "fused_sigmoid_gating_delta_rule_update")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("triton")
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("no vllm installed")
    out = tmp_path_factory.mktemp("gdn") / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, str(HERE / "gdn_report.py"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    text = out.read_text()
    if os.environ.get("VOLTA_GDN_SM70_REPORT"):
        Path(os.environ["VOLTA_GDN_SM70_REPORT"]).write_text(text)
    return dict(json.loads(text))


def test_every_shape_launches_the_whole_layer(report: dict[str, Any]) -> None:
    """Each shape's prefill chunk and decode batches launch every stage of the layer."""
    for shape, phases in report["launched"].items():
        for phase, names in phases.items():
            for stage in PREFILL_STAGES if phase == "prefill" else DECODE_STAGES:
                assert any(stage in n for n in names), (shape, phase, stage, names)


def test_every_gdn_kernel_has_a_configuration_that_runs_on_sm70(report: dict[str, Any]) -> None:
    """One configuration of each autotune group compiles for sm_70 and fits its shared
    memory (spills are reported in the table, not failed: a spilling kernel runs)."""
    failing = [k for k in report["kernels"] if not k["fits"]]
    assert not failing, json.dumps(failing, indent=1)
    assert {k["kernel"] for k in report["kernels"]} >= set(
        report["launched"][report["shape"]]["prefill"]
    )
