"""The gate's measurement cache: a hit gives what measuring gives, anything else measures.

Run on the disassembler probe's real PTX and cubin (a kernel that only returns, built by the
bundled ``ptxas``), so the tools measured and the cache keys are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton")

from volta_devkit import gate, measure_cache
from volta_devkit.disassembler import _PROBE_ISA, _PROBE_PTX, nvidia_tool, probe_cubin

PTX = _PROBE_PTX.format(isa=_PROBE_ISA[70], arch="sm_70")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "gate-cache"
    monkeypatch.setenv(measure_cache.CACHE_ENV, str(folder))
    return folder


def _measured(ptx: str = PTX) -> gate.GateReport:
    report = gate.GateReport("probe", 70)
    gate._measure(report, ptx, probe_cubin("sm_70"), 70)
    return report


def _figures(report: gate.GateReport) -> tuple[object, ...]:
    return (
        report.n_regs,
        report.stack_bytes,
        report.n_spills,
        report.n_spill_loads,
        report.sass_histogram,
        report.problems,
    )


class _Counting:
    """Wraps one of the gate's measuring steps and counts its calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.calls = 0
        real = getattr(gate, name)

        def counted(*args: object) -> None:
            self.calls += 1
            real(*args)

        monkeypatch.setattr(gate, name, counted)


def test_a_second_measurement_of_the_same_build_is_read_back(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ptxas = _Counting(monkeypatch, "_measure_registers")
    sass = _Counting(monkeypatch, "_measure_sass")
    first = _measured()
    assert first.passed, first.problems
    assert first.n_regs is not None
    assert first.sass_histogram.get("EXIT", 0) >= 1
    assert len(list(cache.glob("*.json"))) == 1
    second = _measured()
    assert _figures(second) == _figures(first)
    assert (ptxas.calls, sass.calls) == (1, 1)


def test_other_ptx_is_measured_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ptxas = _Counting(monkeypatch, "_measure_registers")
    _measured()
    _measured(PTX + "// another build\n")
    assert ptxas.calls == 2
    assert len(list(cache.glob("*.json"))) == 2


def test_a_damaged_entry_is_a_miss_and_is_replaced(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _measured()
    (entry,) = cache.glob("*.json")
    for damage in ("", "{not json", '{"n_regs": 8}', '{"n_regs": "x", "sass_histogram": []}'):
        entry.write_text(damage)
        ptxas = _Counting(monkeypatch, "_measure_registers")
        assert _figures(_measured()) == _figures(first)
        assert ptxas.calls == 1, damage
        assert measure_cache.load(entry.stem) is not None


def test_a_measurement_with_a_problem_is_not_kept(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_disassembler(report: gate.GateReport, cubin: bytes, capability: int) -> None:
        report.problems.append("no SASS histogram: none here")

    monkeypatch.setattr(gate, "_measure_sass", no_disassembler)
    report = _measured()
    assert report.problems == ["no SASS histogram: none here"]
    assert not cache.exists() or not list(cache.glob("*.json"))


def test_off_keeps_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(measure_cache.CACHE_ENV, "off")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert measure_cache.cache_dir() is None
    ptxas = _Counting(monkeypatch, "_measure_registers")
    _measured()
    _measured()
    assert ptxas.calls == 2
    assert not list(tmp_path.iterdir())


def test_the_key_names_the_tools_target_and_bytes() -> None:
    ptxas = nvidia_tool("ptxas")
    assert ptxas is not None
    identity = measure_cache.tool_identity(ptxas)
    assert identity is not None
    assert "release" in identity.lower()
    cubin = probe_cubin("sm_70")
    base = measure_cache.key(PTX, cubin, 70, [identity, "cuobjdump 12.8"])
    assert base == measure_cache.key(PTX, cubin, 70, [identity, "cuobjdump 12.8"])
    others = {
        measure_cache.key(PTX, cubin, 75, [identity, "cuobjdump 12.8"]),
        measure_cache.key(PTX, cubin + b"\0", 70, [identity, "cuobjdump 12.8"]),
        measure_cache.key(PTX, cubin, 70, [identity, "cuobjdump 12.9"]),
        measure_cache.key(PTX.replace("ret", "exit"), cubin, 70, [identity, "cuobjdump 12.8"]),
    }
    assert base not in others
    assert len(others) == 4
