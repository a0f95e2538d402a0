"""The benchmark suite runs end to end (tiny sizes, interpreter): JSON, chart and table.

The suite is a script beside the package (``benchmarks/bench.py``, in no distribution), so it is
loaded from the source tree; an unpacked sdist has no benchmarks and skips this test.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


@pytest.fixture
def bench(monkeypatch):
    if not SUITE.is_file():
        pytest.skip(f"{SUITE} is not here (the sdist holds no benchmarks)")
    spec = importlib.util.spec_from_file_location("fp8kv_bench", SUITE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, value in {
        "DEVICE": "cpu",
        "TOKENS": 128,
        "HEADS": 2,
        "HEAD_SIZE": 64,
        "SETS": 2,
        "ACCURACY_TOKENS": 32,
        "COPY_ELEMENTS": 4096,
    }.items():
        monkeypatch.setattr(module, name, value)
    return module


def test_bench_suite_writes_json_chart_and_table(bench, tmp_path):
    results = bench.run(tmp_path)
    saved = json.loads((tmp_path / "fp8kv_bench.json").read_text())
    assert saved["bytes_per_token"] == {"float16": 512, "fp8_e5m2": 256}
    assert saved["targets"]["e5m2 bytes/token == fp16 / 2"] is True
    assert saved["gather"]["fp16"]["roundtrip_rel_error_k"] == 0.0
    assert 0 < saved["gather"]["e5m2_per_tensor"]["roundtrip_rel_error_k"] < 0.1
    assert saved["cache_write"]["e5m2_per_head_host_writer"]["gb_per_s"] > 0
    assert (tmp_path / "fp8kv_bench.png").stat().st_size > 0
    text = bench.table(results)
    assert "cache_write e5m2_per_head" in text
    assert "cache_write e5m2_per_head_host_writer" in text
    assert "target per_head within 10% of per_tensor" in text
