"""Discovery through real installed entry points (the test plugins under tests/plugins).

Runs in fresh interpreters where import state matters (what gets imported, what is logged).
The test plugins are published in the ``vllm_volta.test_plugins`` group, which the host reads
only with ``VLLM_VOLTA_TEST_PLUGINS=1``: a user's environment never lists them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from volta_core import Device
from volta_core.errors import PluginError, UsageError
from volta_core.host.discovery import discover
from volta_core.host.records import HOST_API_VERSION, PluginStatus

TEST_PLUGINS = {"VLLM_VOLTA_TEST_PLUGINS": "1"}

SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from volta_core.host.discovery import discover
m = discover()
print(json.dumps({
    "records": {n: r.as_dict() for n, r in m.records.items()},
    "imported": sorted(k for k in sys.modules if k.startswith("volta_test")),
}))
"""


def run_discovery(**env: str) -> tuple[dict[str, Any], str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_VOLTA")} | env
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=full, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout), done.stderr


@pytest.mark.needs("vllm-volta-test-healthy")
def test_broken_and_incompatible_plugins_are_isolated_and_reported() -> None:
    out, stderr = run_discovery(**TEST_PLUGINS)
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
    assert f"this host speaks API {HOST_API_VERSION}" in future["error"]
    # Each failure is logged exactly once.
    lines = stderr.splitlines()
    assert sum("'test_broken'" in line for line in lines) == 1
    assert sum("'test_future_api'" in line for line in lines) == 1


@pytest.mark.needs("vllm-volta-test-healthy")
def test_filter_imports_only_the_named_plugins_and_warns_on_unknown_names() -> None:
    out, stderr = run_discovery(VLLM_VOLTA_PLUGINS="test_healthy,no_such_plugin", **TEST_PLUGINS)
    records = out["records"]
    assert records["test_healthy"]["status"] == "loaded"
    assert records["test_future_api"]["status"] == "skipped"
    assert records["test_broken"]["status"] == "skipped"
    assert out["imported"] == ["volta_test_healthy"]
    assert "no_such_plugin" in stderr
    assert "matches no installed plugin" in stderr


def test_strict_mode_turns_a_failure_into_an_error() -> None:
    with pytest.raises(PluginError, match="test_broken"):
        discover({"VLLM_VOLTA_STRICT": "1", "VLLM_VOLTA_PLUGINS": "test_broken", **TEST_PLUGINS})


@pytest.mark.needs("vllm-volta-test-healthy")
def test_in_process_discovery_keeps_working_plugins() -> None:
    manager = discover({"VLLM_VOLTA_PLUGINS": "test_healthy,test_broken", **TEST_PLUGINS})
    assert manager.records["test_healthy"].status is PluginStatus.LOADED
    assert manager.records["test_broken"].status is PluginStatus.FAILED
    assert [spec.name for _, spec in manager.reasoning_parsers()] == ["test-healthy"]


def test_importing_the_host_imports_no_heavy_package() -> None:
    heavy = "{'torch', 'triton', 'vllm', 'transformers'}"
    code = (
        "import sys, volta_core, volta_core.cli, volta_core.planner.plan;"
        "from volta_core.host.discovery import discover; discover();"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_users_environment_lists_no_test_plugin() -> None:
    """`scripts/dev.sh plan` runs without the opt-in: no test plugin is imported or listed."""
    out, stderr = run_discovery()
    assert not [name for name in out["records"] if "test" in name]
    assert out["imported"] == []
    assert "test_" not in stderr


@pytest.mark.needs("vllm-volta-test-healthy")
def test_misbehaving_plugins_fail_alone_through_real_entry_points() -> None:
    out, stderr = run_discovery(**TEST_PLUGINS)
    records = out["records"]
    garbage = records["test_garbage_declarations"]
    assert garbage["status"] == "failed"
    assert garbage["distribution"] == "vllm-volta-test-garbage"
    assert "volta_attention_backends returned str" in garbage["error"]
    assert garbage["hook"] == "volta_attention_backends"
    # Two plugins declaring one name: both fail, whichever loads first, one error naming both.
    for name in ("a_test_clash", "zz_test_clash"):
        assert records[name]["status"] == "failed", records[name]
        assert "'a_test_clash'" in records[name]["error"]
        assert "'zz_test_clash'" in records[name]["error"]
    for name in ("test_healthy", "test_raising", "test_garbage_answers"):
        assert records[name]["status"] == "loaded", records[name]
    assert records["test_healthy"]["provides"]["attention backend"] == ["TEST_HEALTHY_ATTN"]
    assert "Traceback" not in stderr


@pytest.mark.needs("vllm-volta-test-healthy")
def test_a_hook_that_raises_is_recorded_with_its_hook_and_isolated() -> None:
    manager = discover({"VLLM_VOLTA_PLUGINS": "test_raising,test_healthy", **TEST_PLUGINS})
    assert manager.kernel_configs(Device((1, 0))) == []
    record = manager.records["test_raising"]
    assert (record.status, record.hook) == (PluginStatus.FAILED, "volta_kernel_configs")
    assert record.distribution == "vllm-volta-test-raising"
    assert "on purpose" in record.error
    assert manager.records["test_healthy"].status is PluginStatus.LOADED


@pytest.mark.needs("vllm-volta-test-healthy")
def test_strict_mode_turns_a_clash_and_an_unmatched_name_into_errors() -> None:
    with pytest.raises(PluginError, match=r"a_test_clash.*zz_test_clash"):
        discover(
            {"VLLM_VOLTA_STRICT": "1", "VLLM_VOLTA_PLUGINS": "a_test_clash,zz_test_clash"}
            | TEST_PLUGINS
        )
    with pytest.raises(PluginError, match="no_such_plugin"):
        discover({"VLLM_VOLTA_STRICT": "1", "VLLM_VOLTA_PLUGINS": "reasoning,no_such_plugin"})


@pytest.mark.parametrize("value", [",", " , ,"])
def test_a_plugin_filter_naming_nothing_is_a_usage_error(value: str) -> None:
    with pytest.raises(UsageError, match="names no plugin"):
        discover({"VLLM_VOLTA_PLUGINS": value})
