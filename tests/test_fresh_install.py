"""`pip install ./core ./plugins/reasoning` in a fresh virtual environment gives a working tool.

Installs real wheels built from this checkout (not editable) into a new venv, so packaging
mistakes (missing package data, entry points, dependencies) fail here.
"""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = tmp_path_factory.mktemp("fresh") / "venv"
    venv.create(env, with_pip=True)
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, str(ROOT / "core"), str(ROOT / "plugins" / "reasoning")], check=True)
    return env


def test_plugins_lists_the_reasoning_plugin_with_its_version(fresh_env: Path) -> None:
    done = subprocess.run(
        [str(fresh_env / "bin" / "vllm-volta"), "plugins", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    records = json.loads(done.stdout)
    assert [(r["name"], r["distribution"], r["version"], r["status"]) for r in records] == [
        ("reasoning", "vllm-volta-reasoning", "0.1.0", "loaded")
    ]
    assert records[0]["provides"] == {"reasoning parser": ["qwen3-volta"]}
    assert done.stderr == ""


def test_plan_runs_on_every_bundled_example(fresh_env: Path) -> None:
    tool = str(fresh_env / "bin" / "vllm-volta")
    names = subprocess.run([tool, "examples"], capture_output=True, text=True, check=True)
    examples = names.stdout.split()
    assert len(examples) >= 5
    for example in examples:
        done = subprocess.run([tool, "plan", example], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "problems: none" in done.stdout
