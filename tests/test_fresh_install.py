"""`pip install ./core ./plugins/<name>` in a fresh virtual environment gives a working tool, for
every plugin alone with the core (and the plugins it depends on) and for all of them together.

Installs real wheels built from this checkout (not editable) into a new venv, so packaging
mistakes (missing package data, entry points, dependencies) fail here. One venv holds the core;
each test leaves exactly the plugins it names, and the plugins they depend on, installed beside
it (the others uninstalled), so a plugin that only works next to one it does not depend on fails
its own test.
"""

from __future__ import annotations

import json
import re
import subprocess
import venv
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = sorted(p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file())

#: What each plugin, installed alone with the core, must show: its declarations in
#: ``vllm-volta plugins --json`` and, for a plugin that takes part in plans, the arguments of a
#: ``vllm-volta plan`` and a line of it that only that plugin can write (the reasoning parser
#: runs inside vLLM only: its declaration is what the tool can show).
ALONE = {
    "attn_v100": (
        {"attention backend": ["VOLTA_ATTN_V100"]},
        ["gemma-4-dual-head"],
        "full_attention, head size 512, 32/16 heads -> VOLTA_ATTN_V100",
    ),
    "ct_wna16": (
        {"quant method": ["ct-wna16"]},
        ["qwen3.5-27b-w4a16"],
        "ct-wna16 (plugin ct_wna16): W4A16 g128 sym",
    ),
    "fp8w": (
        {"quant method": ["fp8w"]},
        ["qwen3.6-27b-fp8"],
        "fp8w (plugin fp8w): FP8 e4m3 W8A16 block 128x128",
    ),
    "fp8kv": (
        {"KV-cache format": ["packed.float16", "packed.fp8_e5m2", "packed.fp8_e4m3"]},
        ["qwen3-8b-fp8-kv-per-head", "--kv-cache-dtype", "fp8_e5m2"],
        "fp8kv: accept: e5m2 KV cache on sm_70",
    ),
    "reasoning": ({"reasoning parser": ["qwen3-volta"]}, None, None),
}


def _requires(plugin: str) -> list[str]:
    """The plugins ``plugin`` depends on (their folder names), dependencies first."""
    folders = {_distribution(p)[0]: p for p in PLUGINS}
    project = tomllib.loads((ROOT / "plugins" / plugin / "pyproject.toml").read_text())["project"]
    needed: list[str] = []
    for requirement in project.get("dependencies", []):
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)
        folder = folders.get(name.group(0).lower()) if name else None
        if folder is not None:
            needed += [p for p in [*_requires(folder), folder] if p not in needed]
    return needed


def _distribution(plugin: str) -> tuple[str, str]:
    """The plugin's distribution name and version, as this checkout's editable install in the
    development environment reports them (the same pyproject.toml the wheel is built from)."""
    (ep,) = entry_points(group="vllm_volta.plugins", name=plugin)
    return ep.dist.name, ep.dist.version


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = tmp_path_factory.mktemp("fresh") / "venv"
    venv.create(env, with_pip=True)
    subprocess.run([*_pip(env), "install", "-q", str(ROOT / "core")], check=True)
    return env


def _pip(env: Path) -> list[str]:
    return [str(env / "bin" / "python"), "-m", "pip"]


def _only(env: Path, *plugins: str) -> list[str]:
    """Leave exactly ``plugins`` and the plugins they depend on installed beside the core; return
    the installed plugins, in ``PLUGINS`` order."""
    installed = sorted({d for p in plugins for d in [*_requires(p), p]})
    others = [_distribution(p)[0] for p in PLUGINS if p not in installed]
    if others:
        subprocess.run([*_pip(env), "uninstall", "-q", "-y", *others], check=True)
    ordered = [d for p in plugins for d in [*_requires(p), p]]
    wanted = [str(ROOT / "plugins" / p) for p in dict.fromkeys(ordered)]
    subprocess.run([*_pip(env), "install", "-q", *wanted], check=True)
    return installed


def _tool(env: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(env / "bin" / "vllm-volta"), *args], capture_output=True, text=True, check=False
    )


def test_every_plugin_has_an_alone_check() -> None:
    assert sorted(ALONE) == PLUGINS


@pytest.mark.parametrize("plugin", PLUGINS)
def test_each_plugin_works_alone_with_the_core(fresh_env: Path, plugin: str) -> None:
    installed = _only(fresh_env, plugin)
    provides, plan_args, plan_line = ALONE[plugin]

    listed = _tool(fresh_env, "plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr == ""
    records = json.loads(listed.stdout)
    assert [(r["name"], r["distribution"], r["version"], r["status"]) for r in records] == [
        (name, *_distribution(name), "loaded") for name in installed
    ]
    (own,) = (r for r in records if r["name"] == plugin)
    assert own["provides"] == provides

    if plan_args is not None:
        plan = _tool(fresh_env, "plan", *plan_args)
        assert plan_line in plan.stdout, plan.stdout + plan.stderr


def test_plan_runs_on_every_bundled_example_with_every_plugin(fresh_env: Path) -> None:
    _only(fresh_env, *PLUGINS)
    names = _tool(fresh_env, "examples")
    examples = names.stdout.split()
    assert len(examples) >= 5
    for example in examples:
        done = _tool(fresh_env, "plan", example)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "problems: none" in done.stdout
