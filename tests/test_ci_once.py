"""CI's one-run-per-test rule (``scripts/volta_ci_once.py``), on a repository made in a
temporary folder: a distribution's run records what passed there, and the whole suite, on two
pytest-xdist workers, runs everything else and nothing twice."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[1] / "scripts" / "volta_ci_once.py"

DIST_TESTS = """
import pytest

def test_passes():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n == 1

def test_skips():
    pytest.skip("needs what this environment lacks")

@pytest.mark.xfail(reason="known")
def test_xfails():
    assert False

class TestGroup:
    def test_method(self):
        pass

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown")

def test_teardown_fails(broken_teardown):
    pass
"""


def _pytest(cwd: Path, root: Path, log: Path | None, *args: str) -> str:
    """pytest's output, run in ``cwd`` with the plugin of the repository at ``root``."""
    env = {k: v for k, v in os.environ.items() if k != "VOLTA_PASSED_LOG"}
    env["PYTHONPATH"] = str(root / "scripts")
    if log is not None:
        env["VOLTA_PASSED_LOG"] = str(log)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "volta_ci_once", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.stdout + done.stderr


def test_each_test_passes_once(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(PLUGIN, tmp_path / "scripts")
    (tmp_path / "dist" / "tests").mkdir(parents=True)
    (tmp_path / "dist" / "tests" / "test_dist.py").write_text(DIST_TESTS)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_root.py").write_text("def test_root():\n    pass\n")
    log = tmp_path / "log"

    isolated = _pytest(tmp_path / "dist", tmp_path, log, "-q")
    assert "1 failed, 4 passed, 1 skipped, 1 xfailed, 1 error" in isolated, isolated
    assert (log / "dist.passed").read_text().splitlines() == [
        "dist/tests/test_dist.py::TestGroup::test_method",
        "dist/tests/test_dist.py::test_param[1]",
        "dist/tests/test_dist.py::test_passes",
    ]

    whole = _pytest(
        tmp_path, tmp_path, log, "-v", "-n", "2", "--rootdir", str(tmp_path), "dist", "tests"
    )
    ran = {
        next(word for word in line.split() if "::" in word)
        for line in whole.splitlines()
        if line.startswith("[gw") and "::" in line
    }
    assert ran == {
        "dist/tests/test_dist.py::test_param[2]",
        "dist/tests/test_dist.py::test_skips",
        "dist/tests/test_dist.py::test_xfails",
        "dist/tests/test_dist.py::test_teardown_fails",
        "tests/test_root.py::test_root",
    }, whole
    assert "3 tests passed in their distributions' own environments" in whole

    alone = _pytest(tmp_path, tmp_path, None, "-q", "--rootdir", str(tmp_path), "dist", "tests")
    assert "deselected" not in alone
    assert "1 failed, 5 passed, 1 skipped, 1 xfailed, 1 error" in alone, alone
