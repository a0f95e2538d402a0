"""The files the host writes or trusts: the NVRTC cubin cache and the per-process report.

The cache is created mode 0700, refused (:class:`CudaCacheUntrusted`, a
:class:`CudaToolkitUnavailable`, so Triton serves) when it or an entry is not the user's own or
others may write it, and every entry is checked against the SHA-256 beside it: a damaged one is
rebuilt once. NVRTC is stood in for (these rules are the cache's, not the compiler's).

A report never raises into vLLM: an unwritable ``VLLM_VOLTA_REPORT_DIR`` is one warning, and
files are written mode 0600 through a random temporary name that a planted link cannot redirect.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from volta_core.cuda_toolkit import CudaToolkitUnavailable
from volta_core.kernel_api import _nvrtc
from volta_core.vllm import report

SOURCE = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }'
IMAGE = b"\x7fELF cubin of k"
PTX = b"//\n.version 8.8\n.target sm_70\n"


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """NVRTC stood in for: each build is recorded and returns a fixed image."""
    built: list[str] = []

    def build(source: str, name: str, target: str, options: object = ()) -> _nvrtc.NvrtcBuild:
        built.append(target)
        return _nvrtc.NvrtcBuild(PTX if target.startswith("compute_") else IMAGE, "")

    monkeypatch.setattr(_nvrtc, "nvrtc_build", build)
    monkeypatch.setattr(_nvrtc, "nvrtc_version", lambda: (12, 9))
    return built


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache" / "cuda"
    monkeypatch.setenv(_nvrtc.CACHE_ENV, str(folder))
    return folder


def entry(cache: Path, target: str = "sm_70") -> Path:
    key = _nvrtc.cache_key(SOURCE, (), target, (12, 9))
    return cache / f"{key}.{'ptx' if target.startswith('compute_') else 'cubin'}"


def test_the_cache_is_private_and_its_entries_carry_their_digest(
    cache: Path, builds: list[str]
) -> None:
    assert _nvrtc.compile_cubin(SOURCE, "k", "sm_70") == IMAGE
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    digest = entry(cache).with_name(entry(cache).name + _nvrtc.DIGEST_SUFFIX)
    for path in (entry(cache), digest):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _nvrtc.compile_cubin(SOURCE, "k", "sm_70") == IMAGE
    assert builds == ["sm_70"]


def test_a_damaged_entry_is_rebuilt_once(cache: Path, builds: list[str]) -> None:
    _nvrtc.compile_cubin(SOURCE, "k", "sm_70")
    entry(cache).write_bytes(IMAGE[:9])  # an ELF file cut short
    assert _nvrtc.compile_cubin(SOURCE, "k", "sm_70") == IMAGE
    assert _nvrtc.compile_cubin(SOURCE, "k", "sm_70") == IMAGE
    assert builds == ["sm_70", "sm_70"]
    assert entry(cache).read_bytes() == IMAGE


def test_damaged_ptx_is_rebuilt_not_raised(cache: Path, builds: list[str]) -> None:
    _nvrtc.compile_ptx(SOURCE, "k", "compute_70")
    entry(cache, "compute_70").write_bytes(b"\xff\xfe not text")
    assert _nvrtc.compile_ptx(SOURCE, "k", "compute_70") == PTX.decode()
    assert builds == ["compute_70", "compute_70"]


def test_a_cache_others_may_write_is_refused(cache: Path, builds: list[str]) -> None:
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    with pytest.raises(_nvrtc.CudaCacheUntrusted, match="writable by its group or by others"):
        _nvrtc.compile_cubin(SOURCE, "k", "sm_70")
    assert issubclass(_nvrtc.CudaCacheUntrusted, CudaToolkitUnavailable)  # Triton serves
    assert builds == []


def test_a_cache_of_another_user_is_refused(
    cache: Path, builds: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.mkdir(parents=True)
    monkeypatch.setattr(_nvrtc.os, "geteuid", lambda: os.stat(cache).st_uid + 1)
    with pytest.raises(_nvrtc.CudaCacheUntrusted, match="not by this user"):
        _nvrtc.compile_cubin(SOURCE, "k", "sm_70")
    assert builds == []


@pytest.mark.parametrize("plant", ["writable", "link"])
def test_a_planted_entry_is_refused_not_loaded(
    cache: Path, builds: list[str], tmp_path: Path, plant: str
) -> None:
    _nvrtc.compile_cubin(SOURCE, "k", "sm_70")
    target = entry(cache)
    target.unlink()
    if plant == "writable":
        target.write_bytes(b"\x7fELF planted")
        target.chmod(0o666)
    else:
        (tmp_path / "planted.cubin").write_bytes(b"\x7fELF planted")
        target.symlink_to(tmp_path / "planted.cubin")
    with pytest.raises(_nvrtc.CudaCacheUntrusted, match=target.name):
        _nvrtc.compile_cubin(SOURCE, "k", "sm_70")
    assert builds == ["sm_70"]


# -- the report -----------------------------------------------------------------------------


@pytest.fixture
def fresh_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "_report", None)
    monkeypatch.setattr(report, "_failed_pid", None)


def test_an_unwritable_report_dir_is_one_warning_never_an_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fresh_report: None,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the report folder should be")
    monkeypatch.setenv(report.ENV_REPORT_DIR, str(blocker / "reports"))
    with caplog.at_level(logging.WARNING, logger=report.__name__):
        report.set_fields(vllm=("vllm", "0.19.1"))
        report.event("attention", backend="TRITON_ATTN")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot write the report" in warnings[0].getMessage()


def test_reports_are_private_and_follow_no_planted_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_report: None
) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    (folder / f"volta-{os.getpid()}.tmp").symlink_to(victim)  # the old predictable name
    monkeypatch.setenv(report.ENV_REPORT_DIR, str(folder))
    report.event("attention", backend="TRITON_ATTN")
    written = folder / f"volta-{os.getpid()}.json"
    assert '"backend": "TRITON_ATTN"' in written.read_text()
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert victim.read_text() == "untouched"
    assert sorted(p.name for p in folder.iterdir()) == [
        f"volta-{os.getpid()}.json",
        f"volta-{os.getpid()}.tmp",
    ]
