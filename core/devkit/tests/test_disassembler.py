"""Choosing a disassembler that reads SM70: one that refuses is passed over, a CUDA 12 one is
taken from a wheel when none here reads it, and when none can be had the gates say so.

The refusing tool is a script on disk that answers as Triton 3.9's bundled ``nvdisasm`` does;
the readers are Triton 3.6's bundled CUDA 12.8 tools.
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("triton")

from volta_devkit import disassembler
from volta_devkit.disassembler import (
    FETCH_REQUIREMENT,
    DisassemblerUnavailable,
    find_disassembler,
    nvidia_tool,
    probe_cubin,
    sass_histogram,
)
from volta_devkit.gate import GateReport, _measure_sass

REFUSAL = (
    "nvdisasm fatal   : CUDA architecture SM70 is deprecated. "
    "Please use CUDA toolkit 13.0 or earlier"
)


def _cuda12_tool(name: str) -> Path:
    tool = nvidia_tool(name)
    if tool is None:
        pytest.skip(f"no bundled {name} (Triton's wheel carries it)")
    return tool


def _refusing_tool(folder: Path, exit_code: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "nvdisasm"
    tool.write_text(f"#!/bin/sh\necho '{REFUSAL}' >&2\nexit {exit_code}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool


@pytest.fixture
def tools_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(disassembler.CACHE_ENV, str(tmp_path / "tools"))
    monkeypatch.delenv(disassembler.NO_DOWNLOAD_ENV, raising=False)
    return tmp_path / "tools"


def test_the_probe_cubin_is_an_sm70_elf_with_sass() -> None:
    cubin = probe_cubin("sm_70")
    assert cubin.startswith(b"\x7fELF")
    assert cubin[0x30] == 70  # e_flags' low byte: the SM version of the code
    sass = find_disassembler("sm_70", download=None).sass(cubin)
    assert sass_histogram(sass).get("EXIT", 0) >= 1


@pytest.mark.parametrize("name", ["cuobjdump", "nvdisasm"])
def test_both_tool_kinds_read_sm70(name: str) -> None:
    tool = _cuda12_tool(name)
    chosen = find_disassembler("sm_70", candidates=[(tool, "bundled")], download=None)
    assert chosen.tool == tool
    assert chosen.rejected == ()


@pytest.mark.parametrize("exit_code", [0, 1])
def test_a_tool_that_refuses_sm70_is_passed_over(tmp_path: Path, exit_code: int) -> None:
    refusing = _refusing_tool(tmp_path / "cuda13", exit_code)
    reader = _cuda12_tool("cuobjdump")
    chosen = find_disassembler(
        "sm_70", candidates=[(refusing, "Triton 3.9's bundled"), (reader, "CUDA 12")], download=None
    )
    assert chosen.tool == reader
    assert chosen.origin == "CUDA 12"
    (why,) = chosen.rejected
    assert str(refusing) in why
    assert "SM70 is deprecated" in why
    assert f"exit {exit_code}" in why


def test_none_reading_sm70_is_said_plainly(tmp_path: Path) -> None:
    refusing = _refusing_tool(tmp_path / "cuda13", 1)
    missing = tmp_path / "nowhere" / "cuobjdump"
    with pytest.raises(DisassemblerUnavailable) as info:
        find_disassembler("sm_70", candidates=[(missing, "x"), (refusing, "y")], download=None)
    message = str(info.value)
    assert message.startswith("no disassembler reads sm_70. Tried: ")
    assert f"{refusing} (y): exit 1, no SASS: {' '.join(REFUSAL.split())}" in message
    assert f"downloading {FETCH_REQUIREMENT}: not tried" in message


def _fake_triton_wheel(folder: Path) -> Path:
    """A wheel laid out as Triton's, carrying the CUDA 12.8 tools found here (``cuobjdump
    -sass`` runs the ``nvdisasm`` beside it)."""
    wheel = folder / "triton-3.6.0-cp311-cp311-manylinux_2_27_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("cuobjdump", "nvdisasm"):
            archive.write(_cuda12_tool(name), f"triton/backends/nvidia/bin/{name}")
        archive.writestr("triton/__init__.py", "")
    return wheel


def test_a_cuda12_disassembler_is_taken_from_the_wheel(tmp_path: Path, tools_cache: Path) -> None:
    refusing = _refusing_tool(tmp_path / "cuda13", 1)
    fetched: list[Path] = []

    def download(dest: Path) -> Path:
        fetched.append(dest)
        return _fake_triton_wheel(dest)

    chosen = find_disassembler("sm_70", candidates=[(refusing, "bundled")], download=download)
    assert len(fetched) == 1
    assert chosen.tool == tools_cache / "triton-3.6.0" / "cuobjdump"
    assert chosen.origin == f"{FETCH_REQUIREMENT}'s, downloaded"
    assert os.access(chosen.tool, os.X_OK)
    assert "SM70 is deprecated" in chosen.rejected[0]
    # Later lookups find the extracted tool among the default candidates: no second download.
    assert (chosen.tool, chosen.origin) in disassembler.default_candidates()


def test_a_failed_download_is_part_of_the_message(tmp_path: Path, tools_cache: Path) -> None:
    refusing = _refusing_tool(tmp_path / "cuda13", 1)

    def offline(dest: Path) -> Path:
        raise DisassemblerUnavailable(f"pip download {FETCH_REQUIREMENT} failed (exit 1): offline")

    with pytest.raises(DisassemblerUnavailable, match=r"SM70 is deprecated.*failed \(exit 1\)"):
        find_disassembler("sm_70", candidates=[(refusing, "bundled")], download=offline)


def test_downloads_can_be_switched_off(
    tmp_path: Path, tools_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(disassembler.NO_DOWNLOAD_ENV, "1")
    refusing = _refusing_tool(tmp_path / "cuda13", 1)

    def must_not_run(dest: Path) -> Path:
        raise AssertionError("downloaded although downloads are off")

    with pytest.raises(DisassemblerUnavailable, match="downloads are off"):
        find_disassembler("sm_70", candidates=[(refusing, "bundled")], download=must_not_run)


def test_an_explicit_disassembler_is_the_only_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusing = _refusing_tool(tmp_path / "cuda13", 0)
    monkeypatch.setenv(disassembler.TOOL_ENV, str(refusing))
    assert disassembler.default_candidates() == [(refusing, f"${disassembler.TOOL_ENV}")]
    with pytest.raises(DisassemblerUnavailable, match="SM70 is deprecated"):
        disassembler.disassembler_for("sm_70")
    monkeypatch.setenv(disassembler.TOOL_ENV, str(shutil.which("true") or "/bin/true"))
    with pytest.raises(DisassemblerUnavailable, match="no SASS: no output"):
        disassembler.disassembler_for("sm_70")


def test_the_triton_gate_reports_a_problem_not_an_empty_histogram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(disassembler.TOOL_ENV, str(_refusing_tool(tmp_path / "cuda13", 0)))
    report = GateReport("k", 70)
    _measure_sass(report, probe_cubin("sm_70"), 70)
    assert report.sass_histogram == {}
    assert not report.passed
    (problem,) = report.problems
    assert problem.startswith("no SASS histogram: no disassembler reads sm_70")
    assert "SM70 is deprecated" in problem
    monkeypatch.delenv(disassembler.TOOL_ENV)
    fine = GateReport("k", 70)
    _measure_sass(fine, probe_cubin("sm_70"), 70)
    assert fine.passed
    assert fine.sass_histogram.get("EXIT", 0) >= 1
