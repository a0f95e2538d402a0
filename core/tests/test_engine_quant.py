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
from volta_core.doctor import checks as doctor
from volta_core.doctor.checks import Status
from volta_core.host.discovery import get_plugin_manager
from volta_core.host.engine_quant import ENGINE_MIN_CAPABILITY, engine_refusal
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import (
    LayerKind,
    QuantClaim,
    QuantDecline,
    QuantLayer,
    QuantMethodSpec,
    TensorSplit,
)
from volta_core.planner.model import describe_model, read_config
from volta_core.planner.plan import PlanOptions, make_plan
from volta_core.vllm.families import FAMILIES, installed_family_name

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


#: Qwen3-30B-A3B's shape (its config.json's sizes): 128 experts of intermediate size 768.
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}


def _dense_config(quant: dict[str, Any]) -> dict[str, Any]:
    _, raw = read_config("qwen3-8b-fp8-kv-per-tensor")
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}
    return {**raw, "quantization_config": quant}


def _model(quant: dict[str, Any]) -> Any:
    return describe_model("qwen3-8b", _dense_config(quant))


def _plan(
    quant: dict[str, Any], manager: VoltaPluginManager, family: str | None, tp: int = 1
) -> Any:
    options = PlanOptions(
        device=parse_device("sm70"), engine_family=family, tensor_parallel_size=tp
    )
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


def test_a_declined_layer_is_a_problem_with_the_decline_not_an_install() -> None:
    """With the plugin installed and declining, installing it fixes nothing: the problem gives
    the plugin's reason, and the fix what runs the layer instead."""
    decline = "ct_wna16: ct-wna16: 3-bit weights (runs 4, 8)"
    problem, fix = engine_refusal("gptq", (7, 0), "vLLM 0.32-0.33", (decline,)) or ("", "")
    assert decline in problem
    assert "pip install" not in fix
    assert "serve with vLLM 0.19 or 1Cat-vLLM 1.2-1.3 or 1Cat-vLLM 1.4-1.5" in fix
    assert engine_refusal("gptq", (7, 0), "vLLM 0.19", (decline,)) is None
    _, nowhere = engine_refusal("awq", (6, 0), "vLLM 0.32-0.33", (decline,)) or ("", "")
    assert nowhere == "change what the decline names, so that the plugin serves them"


def test_claims_see_the_plans_tensor_parallel_split(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    """Each layer reaches the claims with the plan's tensor-parallel size and the dimension
    vLLM divides: the input of row-parallel layers, none of the router's; a plugin declining the
    row-parallel ones leaves them to the engine, which refuses AWQ on sm_70: a problem naming
    the decline."""
    seen: dict[str, QuantLayer] = {}

    def answer(config: Any, layer: QuantLayer, device: Any) -> Any:
        if layer.kind is LayerKind.ATTENTION:
            return None
        seen[layer.prefix] = layer
        if layer.splits_input:
            return QuantDecline("m", "a rank's inputs are not whole groups")
        return QuantClaim("m", "x:y")

    plugin = fake_plugin(
        volta_quant_methods=[QuantMethodSpec("m", "x:y")], volta_quant_method=answer
    )
    manager.register(plugin, "tp")
    options = PlanOptions(
        device=parse_device("sm70"), engine_family="vLLM 0.32-0.33", tensor_parallel_size=4
    )
    plan = make_plan(
        describe_model("moe", {**QWEN3_MOE, "quantization_config": AWQ}), options, manager
    )
    splits = {prefix.rsplit(".", 1)[-1]: layer.split for prefix, layer in seen.items()}
    assert splits == {
        "q_proj": TensorSplit.OUTPUT,
        "k_proj": TensorSplit.OUTPUT,
        "v_proj": TensorSplit.OUTPUT,
        "o_proj": TensorSplit.INPUT,
        "gate": TensorSplit.NONE,
        "experts": TensorSplit.OUTPUT,
    }
    assert {layer.tensor_parallel_size for layer in seen.values()} == {4}
    [problem] = [p for p in plan.problems if "'awq'" in p]
    assert problem.startswith("model.layers.0.self_attn.o_proj: ")
    assert "(tp: m: a rank's inputs are not whole groups)" in problem
    assert "pip install" not in problem


def _awq_rows(rows: list[doctor.Check]) -> list[doctor.Check]:
    return [r for r in rows if r.status is Status.PROBLEM and "'awq'" in r.detail]


def test_doctor_model_reports_an_awq_checkpoint_no_plugin_claims(tmp_path: Path) -> None:
    """``doctor --model`` on an AWQ checkpoint's config for sm_70, with no plugin: the plan's
    problem, naming the plugin to install (on the installed vLLM family, where it refuses AWQ
    below 7.5: every family but 1Cat-vLLM)."""
    (tmp_path / "config.json").write_text(json.dumps(_dense_config(AWQ)))
    rows = doctor.check_model(doctor.load_model(str(tmp_path)), VoltaPluginManager(strict=True))
    family = installed_family_name()
    if family is not None and family.startswith("1Cat"):
        assert _awq_rows(rows) == []
        return
    [row] = _awq_rows(rows)
    assert "pip install vllm-volta-ct-wna16" in row.detail


@pytest.mark.usefixtures("fresh_plugin_manager")
@pytest.mark.needs("vllm-volta-ct-wna16")
def test_doctor_model_has_no_problem_where_ct_wna16_claims_the_awq_layers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_dense_config(AWQ)))
    monkeypatch.setenv("VLLM_VOLTA_PLUGINS", "ct_wna16")
    rows = doctor.check_model(doctor.load_model(str(tmp_path)), get_plugin_manager())
    assert _awq_rows(rows) == []
    assert not [r for r in rows if "ct_wna16" in r.detail], rows


@pytest.mark.usefixtures("fresh_plugin_manager")
@pytest.mark.needs("vllm-volta-ct-wna16")
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_tensor_parallel_split_the_plugin_declines_is_a_problem(
    tp: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen3-30B-A3B in AWQ g128: each rank's experts get 768 / tp intermediate rows, whole
    groups of 128 at 1 and 2 ranks (768, 384), not at 4 (192): ct_wna16's loader would refuse
    it, so its claim declines, the plan shows the reason, and the engine (vLLM 0.32's AWQ needs
    7.5) refuses the experts: a problem with the decline, not 'install the plugin'."""
    monkeypatch.setenv("VLLM_VOLTA_PLUGINS", "ct_wna16")
    model = describe_model("qwen3-30b-a3b-awq", {**QWEN3_MOE, "quantization_config": AWQ})
    options = PlanOptions(
        device=parse_device("sm70"), engine_family="vLLM 0.32-0.33", tensor_parallel_size=tp
    )
    plan = make_plan(model, options, get_plugin_manager())
    [experts] = [q for q in plan.quant if q.kind == "fused_moe"]
    problems = [p for p in plan.problems if "'awq'" in p]
    if tp < 4:
        assert experts.plugin == "ct_wna16"
        assert problems == []
        return
    reason = "intermediate size per TP rank 192 is not a multiple of the group size 128"
    assert experts.plugin is None
    assert any(reason in d for d in experts.declines), experts.declines
    [problem] = problems
    assert problem.startswith("model.layers.0.mlp.experts: ")
    assert reason in problem
    assert "pip install" not in problem


def test_the_adapter_passes_vllms_tensor_parallel_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """At run time the claims see what the plan assumed: vLLM's tensor-parallel world size (a
    linear layer's own ``tp_size`` is set only after vLLM asks for its method) and the split of
    its parallel class; routed experts their ``moe_config``'s sizes and ranks."""
    pytest.importorskip("vllm", reason="the adapter reads vLLM's layer classes")
    from types import SimpleNamespace

    from vllm.distributed import parallel_state
    from vllm.model_executor.layers import linear

    from volta_core.vllm import quantization

    monkeypatch.setattr(parallel_state, "model_parallel_is_initialized", lambda: True)
    monkeypatch.setattr(parallel_state, "get_tensor_model_parallel_world_size", lambda: 4)
    expected = {
        linear.RowParallelLinear: TensorSplit.INPUT,
        linear.QKVParallelLinear: TensorSplit.OUTPUT,
        linear.MergedColumnParallelLinear: TensorSplit.OUTPUT,
        linear.ReplicatedLinear: TensorSplit.NONE,
    }
    for cls, split in expected.items():
        layer = object.__new__(cls)  # the attributes vLLM sets before it asks for the method
        vars(layer).update(input_size=768, output_size=2048)
        seen = quantization._quant_layer(LayerKind.LINEAR, layer, "p")
        assert (seen.split, seen.tensor_parallel_size) == (split, 4), cls
        assert (seen.input_size, seen.output_size) == (768, 2048)
    replicated = object.__new__(linear.ReplicatedLinear)
    vars(replicated).update(input_size=768, output_size=2048, tp_size=1)
    assert quantization._quant_layer(LayerKind.LINEAR, replicated, "p").tensor_parallel_size == 1
    moe = SimpleNamespace(
        hidden_dim=2048,
        intermediate_size_per_partition=192,
        tp_size=4,
        num_experts=128,
        experts_per_token=8,
    )
    experts = quantization._quant_layer(
        LayerKind.FUSED_MOE, SimpleNamespace(moe_config=moe), "model.layers.0.mlp.experts"
    )
    assert experts == QuantLayer(
        LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 2048, 768, 128, 8, 4, TensorSplit.OUTPUT
    )


def test_a_layer_says_what_one_rank_holds() -> None:
    """The sizes a rank holds follow the split: a row-parallel layer's inputs and fused
    experts' intermediate size are divided, the other side is whole, and a size the ranks do
    not divide (vLLM's own refusal) or an unknown one is 0."""
    row = QuantLayer(LayerKind.LINEAR, "o_proj", 4096, 5120, tensor_parallel_size=4,
                     split=TensorSplit.INPUT)  # fmt: skip
    assert (row.inputs_per_rank, row.outputs_per_rank) == (1024, 5120)
    experts = QuantLayer(LayerKind.FUSED_MOE, "experts", 2048, 768, experts=128, top_k=8,
                         tensor_parallel_size=4)  # fmt: skip
    assert (experts.inputs_per_rank, experts.outputs_per_rank) == (2048, 192)
    assert QuantLayer(LayerKind.LINEAR, "o_proj", 1000, 8, tensor_parallel_size=3,
                      split=TensorSplit.INPUT).inputs_per_rank == 0  # fmt: skip
    assert QuantLayer(LayerKind.LINEAR, "router", 2048, 128, tensor_parallel_size=4,
                      split=TensorSplit.NONE).outputs_per_rank == 128  # fmt: skip
