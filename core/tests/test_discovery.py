"""Discovery through real installed entry points (the test plugins under tests/plugins).

Runs in fresh interpreters where import state matters (what gets imported, what is logged).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from volta_core.errors import PluginError
from volta_core.manager import PluginStatus, discover

SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from volta_core.manager import discover
m = discover()
print(json.dumps({
    "records": {n: r.as_dict() for n, r in m.records.items()},
    "imported": sorted(k for k in sys.modules if k.startswith("volta_test")),
}))
"""


def run_discovery(**env: str) -> tuple[dict[str, object], str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_VOLTA")} | env
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=full, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout), done.stderr


def test_broken_and_incompatible_plugins_are_isolated_and_reported() -> None:
    out, stderr = run_discovery()
    records = out["records"]
    assert records["test_healthy"]["status"] == "loaded"
    assert records["test_healthy"]["distribution"] == "vllm-volta-test-healthy"
    assert records["test_healthy"]["version"] == "0.0.1"
    broken = records["test_broken"]
    assert broken["status"] == "failed"
    assert broken["distribution"] == "vllm-volta-test-broken"
    assert "broken on purpose" in broken["error"]
    future = records["test_future_api"]
    assert future["status"] == "refused"
    assert future["host_api"] == "2.0"
    assert "2.0" in future["error"]
    assert "1.0" in future["error"]
    # Each failure is logged exactly once.
    lines = stderr.splitlines()
    assert sum("'test_broken'" in line for line in lines) == 1
    assert sum("'test_future_api'" in line for line in lines) == 1


def test_filter_imports_only_the_named_plugins_and_warns_on_unknown_names() -> None:
    out, stderr = run_discovery(VLLM_VOLTA_PLUGINS="test_healthy,no_such_plugin")
    records = out["records"]
    assert records["test_healthy"]["status"] == "loaded"
    assert records["test_future_api"]["status"] == "skipped"
    assert records["test_broken"]["status"] == "skipped"
    assert out["imported"] == ["volta_test_healthy"]
    assert "no_such_plugin" in stderr
    assert "matches no installed plugin" in stderr


def test_strict_mode_turns_a_failure_into_an_error() -> None:
    with pytest.raises(PluginError, match="test_broken"):
        discover({"VLLM_VOLTA_STRICT": "1", "VLLM_VOLTA_PLUGINS": "test_broken"})


def test_in_process_discovery_keeps_working_plugins() -> None:
    manager = discover({"VLLM_VOLTA_PLUGINS": "test_healthy,test_broken"})
    assert manager.records["test_healthy"].status is PluginStatus.LOADED
    assert manager.records["test_broken"].status is PluginStatus.FAILED
    assert [spec.name for _, spec in manager.reasoning_parsers()] == ["test-healthy"]


def test_importing_the_host_imports_no_heavy_package() -> None:
    heavy = "{'torch', 'triton', 'vllm', 'transformers'}"
    code = (
        "import sys, volta_core, volta_core.cli, volta_core.plan, volta_core.manager;"
        "from volta_core.manager import discover; discover();"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
