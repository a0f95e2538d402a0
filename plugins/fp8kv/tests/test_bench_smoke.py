"""The benchmark suite runs end to end (tiny sizes, interpreter): JSON, chart and table."""

from __future__ import annotations

import json

from volta_fp8kv import bench


def test_bench_suite_writes_json_chart_and_table(tmp_path, monkeypatch):
    for name, value in {
        "DEVICE": "cpu",
        "TOKENS": 128,
        "HEADS": 2,
        "HEAD_SIZE": 64,
        "SETS": 2,
        "WARMUP": 1,
        "ITERS": 1,
        "ACCURACY_TOKENS": 32,
        "COPY_ELEMENTS": 4096,
    }.items():
        monkeypatch.setattr(bench, name, value)
    results = bench.run(tmp_path)
    saved = json.loads((tmp_path / "fp8kv_bench.json").read_text())
    assert saved["bytes_per_token"] == {"float16": 512, "fp8_e5m2": 256}
    assert saved["targets"]["e5m2 bytes/token == fp16 / 2"] is True
    assert saved["gather"]["fp16"]["roundtrip_rel_error_k"] == 0.0
    assert 0 < saved["gather"]["e5m2_per_tensor"]["roundtrip_rel_error_k"] < 0.1
    assert (tmp_path / "fp8kv_bench.png").stat().st_size > 0
    text = bench.table(results)
    assert "cache_write e5m2_per_head" in text
    assert "target per_head within 10% of per_tensor" in text
