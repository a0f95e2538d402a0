"""Calibrations as data: a bench report's entry is a table entry, and the plan prices with it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from volta_core.cli import main
from volta_core.planner import calibration
from volta_core.planner.calibration import Calibration, calibrations, parse_table

#: A bench report's ``calibration`` entry, as ``vllm-volta bench --json`` writes it.
ENTRY = {
    "device": "Tesla V100-SXM2-32GB",
    "bandwidth_gbps": 790.5,
    "tensor_tflops": 98.2,
    "fma_tflops": 14.6,
    "source": "vllm-volta bench (quick), vllm-volta-core 0.9.0",
}


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code = main(["plan", "qwen3.5-27b-w4a16", "--max-model-len", "4096", "--json", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out else {}, err


def test_a_report_entry_calibrates_the_plan(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    table = parse_table({"devices": [ENTRY]})
    assert table == {ENTRY["device"]: Calibration(**ENTRY)}
    assert isinstance(calibrations(), dict)  # the bundled table parses
    _, plain, _ = _plan(capsys)
    monkeypatch.setattr(calibration, "calibrations", lambda: table)
    _, measured, _ = _plan(capsys, "--calibration", ENTRY["device"])
    a = measured["speed"]["assumptions"]
    assert (a["hbm_gbps"], a["tensor_tflops"], a["fma_tflops"]) == (790.5, 98.2, 14.6)
    notes = measured["speed"]["assumption_notes"]
    assert notes[0] == f"calibrated: rates measured on {Calibration(**ENTRY).label}"
    assert plain["speed"]["assumption_notes"][0].startswith("not calibrated: ")
    # Slower HBM: the same kernels take longer.
    assert measured["speed"]["step_ms"] > plain["speed"]["step_ms"]
    code, _, err = _plan(capsys, "--calibration", ENTRY["device"], "--hbm-gbps", "800")
    assert (code, err.strip()) == (
        2,
        "vllm-volta: error: --calibration sets the HBM bandwidth: leave out --hbm-gbps",
    )
    code, _, err = _plan(capsys, "--calibration", "Tesla P100")
    assert code == 2
    assert "no calibration for 'Tesla P100' (measured devices: Tesla V100-SXM2-32GB)" in err


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ([], "must be an object with a 'devices' list"),
        ({"devices": [{**ENTRY, "clock": 1}]}, "entry 0 must have exactly the fields"),
        ({"devices": [{**ENTRY, "fma_tflops": -1}]}, "the rates positive numbers"),
        ({"devices": [{**ENTRY, "source": ""}]}, "device and source are text"),
        ({"devices": [ENTRY, ENTRY]}, "names 'Tesla V100-SXM2-32GB' twice"),
    ],
)
def test_a_malformed_table_names_the_entry(raw: Any, error: str) -> None:
    with pytest.raises(ValueError, match=r"calibrations\.json") as info:
        parse_table(raw)
    assert error in str(info.value)
