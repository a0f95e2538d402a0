"""A plugin that raises or answers garbage in any hook never changes what the others do.

In-process plugins (``fake_plugin``) answer each hook with a wrong type, raise in it, or clash
with another plugin's names; the manager must record the failure against that plugin (with the
hook), disable it, keep every other plugin working, and raise only in strict mode.
"""

from __future__ import annotations

from typing import Any

import pytest

from volta_core import V100
from volta_core.errors import DuplicateDeclarationError, PluginError
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import PluginStatus
from volta_core.host.types import (
    AttentionLayer,
    CheckpointKV,
    KernelConfig,
    KVRequest,
    KVVerdict,
    QuantClaim,
    QuantConfig,
    QuantLayer,
    QuantMethodSpec,
    ReasoningContext,
    ReasoningParserSpec,
    ReasoningSplit,
)

LAYER = AttentionLayer("l", 128, 8, 2, "float16", "auto")


def _garbage(backend: Any) -> list[object]:
    spec = backend("GOOD")
    return [
        "VOLTA_ATTN",
        7,
        {"name": "X"},
        spec,  # a bare spec, not a list
        [spec, "not a spec"],
        [None],
        (x for x in [spec]),  # a generator: read once, so refused
        [backend("P", priority="high")],
        [backend("C", min_capability=(7,))],
        [backend("R", min_capability=(8, 0), max_capability=(7, 0))],
        [backend("T", builtin=True)],
        [backend("has space")],
    ]


@pytest.mark.parametrize("index", range(12))
def test_wrong_type_declarations_fail_only_their_plugin(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any, index: int
) -> None:
    answer = _garbage(backend)[index]
    manager.register(fake_plugin(volta_attention_backends=[backend("FINE")]), "fine")
    with pytest.raises(PluginError, match=r"'bad'.*volta_attention_backends"):
        manager.register(fake_plugin(volta_attention_backends=answer), "bad", distribution="d")
    assert manager.pm.get_plugin("bad") is None
    assert [s.name for _, s in manager.attention_backends()] == ["FINE"]
    assert manager.select_attention(LAYER, V100).backend.name == "FINE"


def test_declaration_hook_that_raises_fails_only_its_plugin(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    def boom() -> list[object]:
        raise KeyError("kaput")

    with pytest.raises(PluginError, match=r"'bad'.*volta_reasoning_parsers.*KeyError"):
        manager.register(fake_plugin(volta_reasoning_parsers=boom), "bad")
    assert manager.pm.get_plugin("bad") is None


def _raise(**_: object) -> None:
    raise RuntimeError("kaput")


def test_kv_verdict_hook_that_raises_is_isolated_and_recorded(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    manager.register(fake_plugin(volta_kv_cache_verdict=_raise), "bad", distribution="dist-bad")
    manager.register(fake_plugin(volta_kv_cache_verdict=KVVerdict.accept("fine")), "good")
    decision = manager.decide_kv_cache(KVRequest("fp8_e5m2", CheckpointKV(), V100))
    assert decision.accepted is True
    assert [name for name, _ in decision.verdicts] == ["good"]
    record = manager.records["bad"]
    assert record.status is PluginStatus.FAILED
    assert record.hook == "volta_kv_cache_verdict"
    assert "RuntimeError: kaput" in record.error
    (fault,) = manager.faults
    assert (fault.plugin, fault.distribution, fault.hook) == (
        "bad",
        "dist-bad",
        "volta_kv_cache_verdict",
    )
    # Disabled: not asked again.
    assert manager.pm.get_plugin("bad") is None


@pytest.mark.parametrize(
    "answer", ["accept", 1, {"status": "accept"}, [KVVerdict.accept("x")], QuantClaim("m", "a:b")]
)
def test_kv_verdict_of_the_wrong_type_is_isolated(
    manager: VoltaPluginManager, fake_plugin: Any, answer: object
) -> None:
    manager.register(fake_plugin(volta_kv_cache_verdict=answer), "bad")
    decision = manager.decide_kv_cache(KVRequest("fp8_e5m2", CheckpointKV(), V100))
    assert decision.accepted is None
    assert manager.records["bad"].status is PluginStatus.FAILED
    assert "volta_kv_cache_verdict returned" in manager.records["bad"].error


def test_strict_mode_turns_an_answer_failure_into_an_error_naming_plugin_and_hook(
    fake_plugin: Any,
) -> None:
    manager = VoltaPluginManager(strict=True)
    manager.register(fake_plugin(volta_kv_cache_verdict=_raise), "bad")
    with pytest.raises(PluginError, match=r"'bad'.*volta_kv_cache_verdict.*kaput"):
        manager.decide_kv_cache(KVRequest("fp8_e5m2", CheckpointKV(), V100))


@pytest.mark.parametrize("answer", [_raise, "x", 3, QuantClaim("ghost", "m:G"), ["list"]])
def test_quant_hook_failure_keeps_the_other_plugins_claims(
    manager: VoltaPluginManager, fake_plugin: Any, answer: object
) -> None:
    good = fake_plugin(
        volta_quant_methods=[QuantMethodSpec("w4", "m:W4")],
        volta_quant_method=QuantClaim("w4", "m:W4"),
    )
    manager.register(good, "good")
    manager.register(fake_plugin(volta_quant_method=answer), "bad")
    resolution = manager.resolve_quant(QuantConfig("ct"), QuantLayer("linear", "l"), V100)
    assert (resolution.source, resolution.claim) == ("good", QuantClaim("w4", "m:W4"))
    assert manager.records["bad"].status is PluginStatus.FAILED


@pytest.mark.parametrize("answer", [_raise, "abc", ReasoningSplit(1, None)])  # type: ignore[arg-type]
def test_reasoning_postprocessor_failure_keeps_the_parsers_split(
    manager: VoltaPluginManager, fake_plugin: Any, answer: object
) -> None:
    manager.register(fake_plugin(volta_reasoning_postprocess=answer), "bad")
    split = ReasoningSplit("abc", "answer")
    context = ReasoningContext("p", "<think>abc</think>answer", (), "stop", streaming=False)
    assert manager.postprocess_reasoning(split, context) is split
    assert manager.records["bad"].hook == "volta_reasoning_postprocess"


def test_kernel_config_hook_failure_keeps_the_others(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    cfg = KernelConfig("k", "pkg.mod:kernel", {"x": "*fp16"})
    manager.register(fake_plugin(volta_kernel_configs=[cfg]), "good")
    manager.register(fake_plugin(volta_kernel_configs=_raise), "bad")
    assert manager.kernel_configs(V100) == [("good", cfg)]
    assert manager.records["bad"].status is PluginStatus.FAILED


@pytest.mark.parametrize("order", [("real", "a_dup"), ("a_dup", "real"), ("zz", "real")])
def test_a_name_clash_fails_both_plugins_whatever_the_order(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any, order: tuple[str, str]
) -> None:
    first, second = order
    manager.register(
        fake_plugin(volta_attention_backends=[backend("VOLTA_ATTN_V100")]), first, distribution="d1"
    )
    with pytest.raises(DuplicateDeclarationError) as info:
        manager.register(
            fake_plugin(volta_attention_backends=[backend("VOLTA_ATTN_V100")]),
            second,
            distribution="d2",
        )
    assert "d1" in str(info.value)
    assert "d2" in str(info.value)
    # Neither wins: both are disabled, and the one registered first is recorded as failed.
    assert manager.attention_backends() == []
    assert manager.records[first].status is PluginStatus.FAILED
    assert "d2" in manager.records[first].error
    # A third declarer of the contested name does not win either.
    with pytest.raises(DuplicateDeclarationError):
        manager.register(fake_plugin(volta_attention_backends=[backend("VOLTA_ATTN_V100")]), "c")
    assert manager.attention_backends() == []


@pytest.mark.parametrize(
    ("hook", "declaration"),
    [
        ("volta_attention_backends", "TRITON_ATTN"),
        ("volta_quant_methods", QuantMethodSpec("fp8", "m:Q")),
        ("volta_reasoning_parsers", ReasoningParserSpec("qwen3", "m:P")),
    ],
)
def test_vllm_builtin_names_are_reserved_unless_replaced(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any, hook: str, declaration: Any
) -> None:
    if isinstance(declaration, str):
        declaration = backend(declaration)
    with pytest.raises(PluginError, match="vLLM's own"):
        manager.register(fake_plugin(**{hook: [declaration]}), "shadow")
    assert manager.pm.get_plugin("shadow") is None
    replacing = type(declaration)(**{**declaration.__dict__, "replaces_builtin": True})
    manager.register(fake_plugin(**{hook: [replacing]}), "replacer")
    assert manager.replacements() == [("replacer", hook, declaration.name)]


def test_a_replaced_builtin_backend_is_not_also_a_fallback(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any
) -> None:
    mine = backend("TRITON_ATTN", head_sizes={64}, replaces_builtin=True)
    manager.register(fake_plugin(volta_attention_backends=[mine]), "mine")
    with pytest.raises(Exception, match="head size 128"):
        manager.select_attention(LAYER, V100)


def test_the_plan_says_when_a_plugin_replaces_a_vllm_name(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    from volta_core.planner.model import describe_model, read_config
    from volta_core.planner.plan import PlanOptions, make_plan

    parser = ReasoningParserSpec("qwen3", "m:P", replaces_builtin=True)
    manager.register(fake_plugin(volta_reasoning_parsers=[parser]), "mine")
    name, raw = read_config("qwen3-8b-fp8-kv-per-tensor")
    plan = make_plan(describe_model(name, raw), PlanOptions(device=V100), manager)
    assert "plugin 'mine' replaces vLLM's own reasoning parser 'qwen3'" in plan.notes
