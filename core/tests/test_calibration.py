"""Calibrations as data: a bench report's entry is a table entry, and the plan prices with it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from volta_core.bench import cases
from volta_core.bench.report import Ceilings, Measured, assemble
from volta_core.cli import main
from volta_core.host.dispatch import KernelCost, LaunchCost, StageCost, Unit, Workload
from volta_core.kernel_api import Timing
from volta_core.planner import calibration
from volta_core.planner.calibration import (
    Calibration,
    Family,
    FamilyRatio,
    calibrations,
    parse_table,
)

#: A bench report's ``calibration`` entry, as ``vllm-volta bench --json`` writes it.
ENTRY: dict[str, Any] = {
    "device": "Tesla V100-SXM2-32GB",
    "bandwidth_gbps": 790.5,
    "tensor_tflops": 98.2,
    "fma_tflops": 14.6,
    "source": "vllm-volta bench (quick), vllm-volta-core 0.9.0",
}


#: Ratios of every family, each a different factor, so that which one scaled a kernel shows.
RATIOS = {
    "attention decode": {"median_ratio": 2.0, "calls": 8},
    "attention prefill": {"median_ratio": 3.0, "calls": 2},
    "linear": {"median_ratio": 5.0, "calls": 12},
    "MoE experts": {"median_ratio": 7.0, "calls": 3},
    "KV-cache write": {"median_ratio": 11.0, "calls": 4},
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


def _factor(line: dict[str, Any]) -> float:
    """What the ratios above make of a kernel line of the plan, by who serves it: vLLM's own
    kernels stay as priced; the attention plugin's by its stage; the quant plugin's linear
    layers (the example has no routed experts) by the linear ratio."""
    if line["served_by"] == "vLLM":
        return 1.0
    if line["module"].startswith("attention, head size"):
        return 3.0 if line["stage"] == "prefill" else 2.0
    return 5.0


@pytest.mark.needs("vllm-volta-attn-v100", "vllm-volta-ct-wna16")
def test_ratios_scale_exactly_the_kernels_of_their_families(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same device with and without ratios: each plugin-served kernel of the decode and
    the prefill takes its family's ratio times as long, every other kernel the same; the
    assumptions say which families were scaled, from how many calls, and which ratio has no
    term to scale."""
    table = parse_table({"devices": [ENTRY, {**ENTRY, "device": "scaled", "ratios": RATIOS}]})
    monkeypatch.setattr(calibration, "calibrations", lambda: table)
    _, plain, _ = _plan(capsys, "--calibration", ENTRY["device"])
    _, scaled, _ = _plan(capsys, "--calibration", "scaled")
    for before, after, prefill in (
        (plain["speed"], scaled["speed"], False),
        (plain["speed"]["prefill"], scaled["speed"]["prefill"], True),
    ):
        factors = [_factor(line) for line in before["kernels"]]
        assert {f for f in factors if f != 1.0} == ({3.0, 5.0} if prefill else {2.0, 5.0})
        assert [line["ms"] for line in after["kernels"]] == [
            pytest.approx(line["ms"] * f, abs=1e-4 * f)  # ms to 4 places
            for line, f in zip(before["kernels"], factors, strict=True)
        ]
        total = "ms" if prefill else "step_ms"
        grown = sum(
            line["ms"] * (f - 1) for line, f in zip(before["kernels"], factors, strict=True)
        )
        assert after[total] - before[total] == pytest.approx(grown, rel=1e-3)
    assert plain["speed"]["assumption_notes"][1].startswith("HBM2 ")
    assert scaled["speed"]["assumption_notes"][1:3] == [
        "scaled by its report's median of measured / estimate per family: the plugins' "
        "attention decode x2.00 (8 calls), attention prefill x3.00 (2 calls), linear x5.00 "
        "(12 calls), MoE experts x7.00 (3 calls); vLLM's own kernels and other families as "
        "priced",
        "not applied: KV-cache write x11.00 (4 calls): the estimate has no term of it",
    ]
    assert scaled["speed"]["assumptions"]["ratios"][0] == {
        "family": "attention decode",
        "median_ratio": 2.0,
        "calls": 8,
    }


def test_an_entry_without_ratios_prices_as_before(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry from before the bench reported ratios, and one with none measured, price the
    same plan to the digit, with no line about ratios."""
    table = parse_table({"devices": [ENTRY, {**ENTRY, "device": "none measured", "ratios": {}}]})
    assert table[ENTRY["device"]].ratios == table["none measured"].ratios == ()
    monkeypatch.setattr(calibration, "calibrations", lambda: table)
    _, old, _ = _plan(capsys, "--calibration", ENTRY["device"])
    _, empty, _ = _plan(capsys, "--calibration", "none measured")
    old_notes, empty_notes = (
        old["speed"].pop("assumption_notes"),
        empty["speed"].pop("assumption_notes"),
    )
    assert old_notes[1:] == empty_notes[1:]
    assert old_notes[1].startswith("HBM2 790.5 GB/s (measured)")
    assert old["speed"]["assumptions"]["ratios"] == []
    old["speed"]["assumptions"]["calibration"] = empty["speed"]["assumptions"]["calibration"]
    assert old["speed"] == empty["speed"]


#: A device's ceilings, at more digits than the report keeps.
CEILINGS = Ceilings(copy_gbps=812.34, read_gbps=850.0, fp16_tflops=101.234, fp32_tflops=14.5)


def _measured(family: cases.Family, factor: float | None) -> Measured:
    """A call of ``family`` timed at ``factor`` times its estimate at :data:`CEILINGS`
    (untimed where None)."""
    cost = StageCost("1-7 tokens", KernelCost("k", (LaunchCost(10**9, 0, 10**9, Unit.FMA),)))
    planned = cases.Planned("m", family, "m.proj", "p", "M", Workload(4), cost, None, "k", None)
    if factor is None:
        return Measured(planned, error="it failed")
    ms = cost.cost.seconds(CEILINGS.rates("GPU")) * 1e3 * factor
    return Measured(planned, Timing(ms, ms, ms, 10, 2), "CUDA graph")


def test_a_bench_reports_entry_is_a_table_entry() -> None:
    """A report's ``calibration`` entry, as ``--json`` prints it, loads as it is: its rates,
    and each timed family's median ratio with the calls it is from (a family none of whose
    calls was timed has none)."""
    measured = [
        *(_measured(cases.Family.LINEAR, f) for f in (2.5, 1.5, 2.0, None)),
        _measured(cases.Family.KV_WRITE, 3.0),
        _measured(cases.Family.ATTENTION_DECODE, None),
    ]
    report = assemble(
        models=["m"],
        quick=True,
        device={"name": "Tesla V100-PCIE-16GB"},
        software={"nvrtc": "12.4", "vllm_volta_core": "0.10.0"},
        ceilings=CEILINGS,
        measured=measured,
        unmeasured=[],
        seconds=1.0,
        calibrated=False,
    )
    entry = json.loads(json.dumps(report))["calibration"]
    assert parse_table({"devices": [entry]}) == {
        "Tesla V100-PCIE-16GB": Calibration(
            "Tesla V100-PCIE-16GB",
            812.3,
            101.23,
            14.5,
            "vllm-volta bench (quick), vllm-volta-core 0.10.0",
            (FamilyRatio(Family.LINEAR, 2.0, 3), FamilyRatio(Family.KV_WRITE, 3.0, 1)),
        )
    }


@pytest.mark.parametrize(
    ("ratios", "error"),
    [
        ([], "must be an object by family (attention decode, attention prefill, linear, MoE"),
        ({"sampling": {"median_ratio": 1.0, "calls": 1}}, "unknown family 'sampling' (families: "),
        ({"linear": {"median_ratio": 0, "calls": 3}}, "'linear' median_ratio must be a positive"),
        ({"linear": {"median_ratio": -1.5, "calls": 3}}, "median_ratio must be a positive number"),
        ({"linear": {"median_ratio": "1.9", "calls": 3}}, "a positive number, not '1.9'"),
        ({"linear": {"median_ratio": True, "calls": 3}}, "a positive number, not True"),
        ({"linear": {"median_ratio": float("nan"), "calls": 3}}, "a positive number, not nan"),
        ({"linear": {"median_ratio": 1.9, "calls": 0}}, "calls must be a positive whole number"),
        ({"linear": {"median_ratio": 1.9, "calls": 2.5}}, "a positive whole number, not 2.5"),
        ({"linear": {"median_ratio": 1.9}}, "'linear' must have exactly the fields median_ratio"),
        ({"linear": 1.9}, "'linear' must have exactly the fields median_ratio, calls"),
    ],
)
def test_invalid_ratios_are_refused_naming_the_entry(ratios: Any, error: str) -> None:
    entry = {**ENTRY, "ratios": ratios}
    where = r"^calibrations\.json entry 1 \(Tesla V100-SXM2-32GB\): ratios: "
    with pytest.raises(ValueError, match=where) as info:
        parse_table({"devices": [{**ENTRY, "device": "fine"}, entry]})
    assert error in str(info.value)
