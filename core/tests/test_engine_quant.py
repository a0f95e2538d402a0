"""The plan reports the quantized layers the engine would refuse on the device: a format no
plugin claims whose family method needs a newer GPU (``host.engine_quant``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from volta_core.cli import main
from volta_core.device import parse_device
from volta_core.host.discovery import get_plugin_manager
from volta_core.host.engine_quant import ENGINE_MIN_CAPABILITY, engine_refusal
from volta_core.host.manager import VoltaPluginManager
from volta_core.planner.model import describe_model, read_config
from volta_core.planner.plan import PlanOptions, make_plan
from volta_core.vllm.families import FAMILIES

AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def test_every_family_has_its_table() -> None:
    assert set(ENGINE_MIN_CAPABILITY) == {family.name for family in FAMILIES}


@pytest.mark.parametrize(
    ("method", "family", "refused", "fix"),
    [
        ("awq", "vLLM 0.19", True, "pip install vllm-volta-ct-wna16"),
        ("gptq", "vLLM 0.19", False, ""),
        ("gptq", "vLLM 0.32-0.33", True, "pip install vllm-volta-ct-wna16"),
        ("fp8", "vLLM 0.32-0.33", True, "pip install vllm-volta-fp8w"),
        ("awq", "1Cat-vLLM 1.2-1.3", False, ""),
        ("compressed-tensors", "1Cat-vLLM 1.2-1.3", True, "vllm-volta-ct-wna16"),
        ("awq", None, True, "or serve with 1Cat-vLLM 1.2-1.3"),
        ("bitsandbytes", None, False, ""),
    ],
)
def test_refusals_per_family_on_a_v100(method: str, family: str | None, refused: bool, fix: str):
    found = engine_refusal(method, (7, 0), family)
    assert (found is not None) == refused
    if found is not None:
        assert fix in found[1]
    assert engine_refusal(method, (8, 0), family) is None


def _model(quant: dict[str, Any]) -> Any:
    name, raw = read_config("qwen3-8b-fp8-kv-per-tensor")
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}
    return describe_model(name, {**raw, "quantization_config": quant})


def _plan(quant: dict[str, Any], manager: VoltaPluginManager, family: str | None) -> Any:
    options = PlanOptions(device=parse_device("sm70"), engine_family=family)
    return make_plan(_model(quant), options, manager)


def test_a_format_no_plugin_claims_is_a_problem_naming_its_fix() -> None:
    bare = VoltaPluginManager(strict=True)
    plan = _plan(AWQ, bare, "vLLM 0.19")
    [problem] = [p for p in plan.problems if "'awq'" in p]
    assert "model.layers.0.self_attn.q_proj" in problem
    assert "pip install vllm-volta-ct-wna16" in problem
    # The output head stays unquantized (AWQ quantizes it only with lm_head set): not counted.
    assert "lm_head" not in problem
    assert not [p for p in _plan(AWQ, bare, "1Cat-vLLM 1.2-1.3").problems if "'awq'" in p]
    assert not [p for p in _plan(GPTQ, bare, "vLLM 0.19").problems if "'gptq'" in p]
    assert [p for p in _plan(GPTQ, bare, "vLLM 0.32-0.33").problems if "'gptq'" in p]


@pytest.fixture
def fresh_plugin_manager() -> Iterator[None]:
    get_plugin_manager.cache_clear()
    yield
    get_plugin_manager.cache_clear()


@pytest.mark.usefixtures("fresh_plugin_manager")
@pytest.mark.needs("vllm-volta-attn-v100", "vllm-volta-ct-wna16")
def test_the_command_exits_1_until_the_plugin_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a new user would: an AWQ quantization_config on the bundled Qwen3-8B config."""
    name, raw = read_config("qwen3-8b-fp8-kv-per-tensor")
    del name
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}
    (tmp_path / "config.json").write_text(json.dumps({**raw, "quantization_config": AWQ}))
    monkeypatch.setenv("VLLM_VOLTA_PLUGINS", "attn_v100")
    assert main(["plan", str(tmp_path), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert any("pip install vllm-volta-ct-wna16" in p for p in problems), problems
    get_plugin_manager.cache_clear()
    monkeypatch.setenv("VLLM_VOLTA_PLUGINS", "attn_v100,ct_wna16")
    main(["plan", str(tmp_path), "--json"])
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert not any("'awq'" in p for p in problems), problems
