"""The benchmark harness's CPU-side parts: suite loading, the table, the chart.

Timing itself needs a GPU: ``python -m volta_devkit.bench_selfcheck`` on the device
machine checks it (see docs/kernels.md for the measured figures).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from volta_devkit import bench


def _record() -> dict[str, object]:
    timing = {"median_ms": 0.5, "q20_ms": 0.49, "q80_ms": 0.52, "reps": 100, "input_sets": 3}
    return {
        "suite": "demo.bench",
        "environment": {
            "device": "Some GPU",
            "capability": "9.0",
            "driver": "1.0",
            "torch": "t",
            "triton": "3.6.0",
        },
        "ceilings": {"copy_gbps": 3000.0, "fp16_matmul_tflops": 700.0},
        "results": [
            {
                "name": "torch op",
                "timing": {**timing, "median_ms": 1.0},
                "gbps": 1000.0,
                "tflops": None,
                "of_copy": 1000.0 / 3000.0,
                "of_matmul": None,
                "speedup": None,
            },
            {
                "name": "kernel",
                "timing": timing,
                "gbps": 2000.0,
                "tflops": 1.5,
                "of_copy": 2000.0 / 3000.0,
                "of_matmul": 1.5 / 700.0,
                "speedup": 2.0,
            },
        ],
    }


def test_table_lists_ceilings_then_cases_with_ratios() -> None:
    lines = bench.format_table(_record()).splitlines()
    assert lines[0].startswith("demo.bench on Some GPU (sm 9.0, driver 1.0")
    assert lines[1] == "ceilings: copy 3000.0 GB/s, fp16 matmul 700.0 TFLOP/s"
    kernel = lines[-1].split()
    assert kernel[0] == "kernel"
    assert kernel[1:4] == ["0.5000", "2000.0", "66.7%"]
    assert kernel[-1] == "2.00x"
    assert lines[-2].split()[-1] == "-"  # no baseline: no ratio


def test_chart_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "demo.png"
    bench.draw(_record(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_module_without_cases_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "not_a_suite.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit, match="defines no cases"):
        bench.load_suite("not_a_suite")
    sys.modules.pop("not_a_suite", None)


def test_selfcheck_suite_declares_paired_cases() -> None:
    from volta_devkit import bench_selfcheck

    pytest.importorskip("torch")
    cases = list(bench_selfcheck.cases())
    names = {c.name for c in cases}
    assert len(cases) == 2 * len(bench_selfcheck.SHAPES) + len(bench_selfcheck.GRAPHED)
    for case in cases:
        assert case.bytes_moved > 0
        assert case.baseline is None or case.baseline in names
    graphed = [c for c in cases if c.graphed]
    assert [c.shape["rows"] for c in graphed] == [rows for rows, _ in bench_selfcheck.GRAPHED]
    assert all(c.baseline is not None and "graph" not in c.baseline for c in graphed)


def test_graph_timer_refuses_no_input_sets() -> None:
    with pytest.raises(ValueError, match="at least one input set"):
        bench.time_cuda_graph(lambda: None, [])
