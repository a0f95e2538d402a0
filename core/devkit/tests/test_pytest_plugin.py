"""The kernel-test pytest plugin, seen from a separate pytest run as a plugin's tests see it.

The plugin is opt-in: the inner run loads it with ``-p volta_devkit.testing``, as every
vllm-volta distribution's ``addopts`` does, and a run without it is left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from volta_devkit import testing

INNER = """
import os
import sys

import pytest

INTERPRET_AT_IMPORT = os.environ.get("TRITON_INTERPRET")


def test_interpreter_switch_was_set_before_import():
    assert INTERPRET_AT_IMPORT == "1"


def test_device_fixture(kernel_device):
    assert kernel_device == "cpu"


def test_plugin_is_light():
    assert "torch" not in sys.modules


@pytest.mark.gpu
def test_needs_gpu():
    raise AssertionError("must be skipped without CUDA")
"""


def test_no_distribution_loads_it_into_every_pytest_run() -> None:
    loaders = [
        f"{ep.dist.name if ep.dist else '?'}: {ep.name} = {ep.value}"
        for ep in metadata.entry_points(group="pytest11")
        if ep.value.startswith(("volta_core", "volta_devkit"))
    ]
    assert loaders == []


@pytest.mark.skipif(testing.cuda_available(), reason="checks the CPU-only behaviour")
def test_a_run_that_does_not_opt_in_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(
        "import os\n\ndef test_no_interpreter():\n"
        "    assert os.environ.get('TRITON_INTERPRET') is None\n"
    )
    env = {k: v for k, v in os.environ.items() if k != testing.INTERPRET_ENV}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "volta kernels" not in run.stdout


@pytest.mark.skipif(testing.cuda_available(), reason="checks the CPU-only behaviour")
def test_cpu_only_run_interprets_and_skips_gpu_tests(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items() if k != testing.INTERPRET_ENV}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "volta_devkit.testing",
         "--strict-markers", "-rs", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "3 passed, 1 skipped" in out, out
    assert "needs a CUDA device; none here" in out, out
    assert "volta kernels: no CUDA device" in out, out

    selected = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
         "volta_devkit.testing", "-m", "gpu", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert "1 skipped, 3 deselected" in selected.stdout, selected.stdout + selected.stderr


def test_cuda_probe_honours_hidden_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert testing._probe_cuda() is False
