"""Registration rules of the plugin manager, with in-process plugins."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

from volta_core import V100, Device, hookimpl
from volta_core.errors import DuplicateDeclarationError, IncompatiblePluginError, PluginError
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import HOST_API_VERSION, PluginStatus, is_compatible
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


def test_register_records_hooks_and_declarations(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any
) -> None:
    plugin = fake_plugin(
        volta_attention_backends=[backend("A")],
        volta_reasoning_parsers=[ReasoningParserSpec("p", "m:P")],
    )
    record = manager.register(plugin, "one", distribution="dist-one", version="1.2")
    assert record.hooks == ("volta_attention_backends", "volta_reasoning_parsers")
    assert record.provides == {"attention backend": ("A",), "reasoning parser": ("p",)}
    assert [d.name for _, d in manager.attention_backends()] == ["A"]
    manager.unregister("one")
    assert manager.attention_backends() == []
    assert "one" not in manager.records


@pytest.mark.parametrize(
    ("plugin_api", "ok"),
    [("1.0", True), ("1.1", False), ("0.9", False), ("2.0", False), ("one", False)],
)
def test_host_api_compatibility(plugin_api: str, ok: bool) -> None:
    assert is_compatible(plugin_api, "1.0") is ok
    assert is_compatible("1.0", "1.3")


def test_incompatible_plugin_is_refused_naming_both_versions(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    speaks = re.escape(f"host API 2.0; this host speaks API {HOST_API_VERSION}")
    with pytest.raises(IncompatiblePluginError, match=speaks):
        manager.register(fake_plugin(api="2.0"), "future", distribution="d", version="9")
    assert manager.pm.get_plugin("future") is None


def test_plugin_without_api_version_is_refused(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    with pytest.raises(PluginError, match="does not state VOLTA_HOST_API"):
        manager.register(fake_plugin(api=None), "anon")


def test_unknown_hook_name_is_an_error_and_leaves_nothing_registered(
    manager: VoltaPluginManager,
) -> None:
    class Typo:
        VOLTA_HOST_API = "1.0"

        @hookimpl
        def volta_attention_backend(self) -> list[object]:  # missing final "s"
            return []

    with pytest.raises(PluginError, match="volta_attention_backend"):
        manager.register(Typo(), "typo")
    assert manager.pm.get_plugin("typo") is None
    assert "typo" not in manager.records


@pytest.mark.parametrize(
    ("hook", "declaration", "label"),
    [
        ("volta_attention_backends", "SAME", "attention backend"),
        ("volta_quant_methods", QuantMethodSpec("same", "m:Q"), "quant method"),
        ("volta_reasoning_parsers", ReasoningParserSpec("same", "m:P"), "reasoning parser"),
    ],
)
def test_duplicate_names_across_plugins_name_both_distributions(
    manager: VoltaPluginManager,
    hook: str,
    declaration: object,
    label: str,
    fake_plugin: Any,
    backend: Any,
) -> None:
    if isinstance(declaration, str):
        declaration = backend(declaration)
    manager.register(fake_plugin(**{hook: [declaration]}), "first", distribution="dist-first")
    with pytest.raises(DuplicateDeclarationError) as info:
        manager.register(fake_plugin(**{hook: [declaration]}), "second", distribution="dist-second")
    message = str(info.value)
    assert label in message
    assert "dist-first" in message
    assert "dist-second" in message
    # Neither wins: the second is refused and the first, which held the name, is disabled.
    assert manager.pm.get_plugin("second") is None
    assert manager.pm.get_plugin("first") is None
    assert manager.records["first"].status is PluginStatus.FAILED
    assert (
        manager.attention_backends() == manager.quant_methods() == manager.reasoning_parsers() == []
    )


def test_duplicate_name_within_one_plugin(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any
) -> None:
    with pytest.raises(DuplicateDeclarationError, match="twice"):
        manager.register(fake_plugin(volta_attention_backends=[backend("X"), backend("X")]), "p")


def test_hook_failure_is_isolated_and_names_the_plugin_and_hook(fake_plugin: Any) -> None:
    """Registered like any plugin (not behind the manager's back), a raising hook is isolated."""

    def boom() -> None:
        raise RuntimeError("kaput")

    cfg = KernelConfig("k", "pkg.mod:kernel", {"x": "*fp16"})
    manager = VoltaPluginManager()
    manager.register(fake_plugin(volta_kernel_configs=[cfg]), "fine")
    manager.register(fake_plugin(volta_kernel_configs=lambda device: boom()), "bad")
    assert manager.kernel_configs(V100) == [("fine", cfg)]
    record = manager.records["bad"]
    assert (record.status, record.hook) == (PluginStatus.FAILED, "volta_kernel_configs")
    assert "RuntimeError: kaput" in record.error

    strict = VoltaPluginManager(strict=True)
    strict.register(fake_plugin(volta_kernel_configs=lambda device: boom()), "bad")
    with pytest.raises(PluginError, match=r"'bad'.* failed in volta_kernel_configs.*kaput"):
        strict.kernel_configs(V100)


def test_quant_answer_for_undeclared_method_disables_the_plugin(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    manager.register(fake_plugin(volta_quant_method=QuantClaim("ghost", "m:G")), "q")
    resolution = manager.resolve_quant(QuantConfig("x"), QuantLayer("linear", "l"), V100)
    assert resolution.claim is None
    assert manager.records["q"].status is PluginStatus.FAILED
    assert "'ghost'" in manager.records["q"].error


def test_reasoning_postprocess_result_is_used_when_it_keeps_the_text(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    text = "<think>abc</think>answer"
    fixed = ReasoningSplit("abc", "answer")
    manager.register(fake_plugin(volta_reasoning_postprocess=fixed), "fixer")
    context = ReasoningContext("p", text, (), "stop", streaming=False)
    assert manager.postprocess_reasoning(ReasoningSplit("abc", None), context) == fixed


def test_reasoning_postprocess_that_drops_text_is_refused(
    manager: VoltaPluginManager, caplog: pytest.LogCaptureFixture, fake_plugin: Any
) -> None:
    text = "<think>abc</think>answer"
    parser_split = ReasoningSplit("abc", "answer")
    manager.register(fake_plugin(volta_reasoning_postprocess=ReasoningSplit("abc", "")), "blanker")
    context = ReasoningContext("p", text, (1, 2), "length", streaming=False)
    with caplog.at_level(logging.ERROR, logger="volta_core"):
        assert manager.postprocess_reasoning(parser_split, context) == parser_split
    assert "dropped text" in caplog.text


def test_reasoning_postprocess_streaming_checks_the_parsers_split(
    manager: VoltaPluginManager, fake_plugin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A delta's split is not its text: the stream released the `` </th`` it held before and
    trimmed the whitespace after the tag. An answer keeping the split's text is taken."""
    manager.register(fake_plugin(volta_reasoning_postprocess=lambda split, context: split), "id")
    context = ReasoningContext(
        "p", "hm </think>\n\nFour", (), None, streaming=True, delta="ink>\n\nFour"
    )
    parser_split = ReasoningSplit("", "Four")
    with caplog.at_level(logging.ERROR, logger="volta_core"):
        assert manager.postprocess_reasoning(parser_split, context) == parser_split
    assert caplog.text == ""
    manager.register(fake_plugin(volta_reasoning_postprocess=ReasoningSplit(None, "Fo")), "cut")
    assert manager.postprocess_reasoning(parser_split, context) == parser_split
    assert "dropped text" in caplog.text


def test_no_postprocess_plugin_keeps_the_split(manager: VoltaPluginManager) -> None:
    split = ReasoningSplit("r", "c")
    context = ReasoningContext("p", "<think>r</think>c", (), "stop", streaming=False)
    assert manager.postprocess_reasoning(split, context) is split


def test_select_attention_uses_plugin_backends_then_builtins(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any
) -> None:
    manager.register(
        fake_plugin(volta_attention_backends=[backend("VOLTA", head_sizes={256})]), "a"
    )
    layer = AttentionLayer("l", 256, 8, 2, "float16", "auto")
    assert manager.select_attention(layer, V100).backend.name == "VOLTA"
    wide = AttentionLayer("g", 512, 8, 2, "float16", "auto")
    choice = manager.select_attention(wide, V100)
    assert choice.backend.name == "TRITON_ATTN"
    assert [r.backend for r in choice.refusals] == ["VOLTA"]


def test_decide_kv_cache_combines_every_plugin(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    def no_e4m3(request: KVRequest) -> KVVerdict | None:
        if request.kv_cache_dtype == "fp8" and not request.device.has_fp8_e4m3:
            return KVVerdict.reject("no e4m3 below sm_89")
        return None

    manager.register(fake_plugin(volta_kv_cache_verdict=no_e4m3), "rule")
    manager.register(fake_plugin(volta_kv_cache_verdict=KVVerdict.accept("fine")), "easy")
    rejected = manager.decide_kv_cache(KVRequest("fp8", CheckpointKV(), V100))
    assert rejected.accepted is False
    assert rejected.reasons == ("rule: no e4m3 below sm_89",)
    accepted = manager.decide_kv_cache(KVRequest("fp8_e5m2", CheckpointKV(), V100))
    assert accepted.accepted is True
    assert [name for name, _ in accepted.verdicts] == ["easy"]


def test_kernel_configs_are_attributed(manager: VoltaPluginManager, fake_plugin: Any) -> None:
    cfg = KernelConfig("k", "pkg.mod:kernel", {"x": "*fp16"}, {"BLOCK": 64})
    manager.register(
        fake_plugin(volta_kernel_configs=lambda device: [cfg] if device == V100 else []), "k"
    )
    assert manager.kernel_configs(V100) == [("k", cfg)]
    assert manager.kernel_configs(Device((9, 0))) == []


def test_resolve_quant_through_hooks(manager: VoltaPluginManager, fake_plugin: Any) -> None:
    def claim(config: QuantConfig, layer: QuantLayer, device: Device) -> QuantClaim | None:
        return QuantClaim("w4", "m:W4", detail=layer.prefix) if config.method == "ct" else None

    manager.register(
        fake_plugin(volta_quant_methods=[QuantMethodSpec("w4", "m:W4")], volta_quant_method=claim),
        "q",
    )
    layer = QuantLayer("linear", "model.layers.0.mlp.up_proj", 10, 20)
    resolution = manager.resolve_quant(QuantConfig("ct"), layer, V100)
    assert (resolution.source, resolution.claim and resolution.claim.detail) == ("q", layer.prefix)
    assert manager.resolve_quant(QuantConfig("other"), layer, V100).claim is None


@pytest.mark.parametrize(
    ("name", "impl"), [("has space", "m:C"), ("", "m:C"), ("ok", "no_colon"), ("ok", "m:")]
)
def test_malformed_declarations_are_refused(
    manager: VoltaPluginManager, fake_plugin: Any, name: str, impl: str
) -> None:
    plugin = fake_plugin(volta_reasoning_parsers=[ReasoningParserSpec(name, impl)])
    with pytest.raises(PluginError, match=r"'bad'.*volta_reasoning_parsers.*names are letters"):
        manager.register(plugin, "bad")
    assert manager.pm.get_plugin("bad") is None


class _VerdictWrapper:
    """A plugin whose only implementation wraps every plugin's KV verdict (pluggy new-style)."""

    VOLTA_HOST_API = "1.0"

    def __init__(self, *, breaks: bool = False) -> None:
        self.seen: list[object] = []
        self.breaks = breaks

    @hookimpl(wrapper=True)
    def volta_kv_cache_verdict(self, request: KVRequest) -> Any:
        answers = yield
        if self.breaks:
            raise RuntimeError("wrapper exploded")
        self.seen.append(answers)
        return answers


def test_hooks_run_through_pluggy_so_wrappers_and_monitoring_see_each_plugin(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    manager.register(fake_plugin(volta_kv_cache_verdict=KVVerdict.reject("no")), "strict")
    manager.register(fake_plugin(volta_kv_cache_verdict=KVVerdict.accept("fine")), "easy")
    wrapper = _VerdictWrapper()
    manager.register(wrapper, "watcher")
    called: list[list[str]] = []
    manager.pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: called.append([i.plugin_name for i in impls]),
        lambda outcome, name, impls, kwargs: None,
    )

    decision = manager.decide_kv_cache(KVRequest("fp8_e5m2", CheckpointKV(), V100))

    # One pluggy call per plugin, each holding that plugin and the wrapper; answers attributed.
    assert sorted(map(sorted, called)) == [["easy", "watcher"], ["strict", "watcher"]]
    assert sorted(str(seen) for seen in wrapper.seen) == sorted(
        str([v]) for v in (KVVerdict.reject("no"), KVVerdict.accept("fine"))
    )
    assert decision.accepted is False
    assert decision.reasons == ("strict: no",)


def test_a_wrapper_that_breaks_calls_is_disabled_and_answers_are_kept(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    manager.register(fake_plugin(volta_kv_cache_verdict=KVVerdict.accept("fine")), "easy")
    manager.register(_VerdictWrapper(breaks=True), "breaker")

    decision = manager.decide_kv_cache(KVRequest("fp8_e5m2", CheckpointKV(), V100))

    assert decision.accepted is True
    assert [name for name, _ in decision.verdicts] == ["easy"]
    assert manager.records["breaker"].status is PluginStatus.FAILED
    assert "wrapper exploded" in manager.records["breaker"].error
    assert manager.records["easy"].status is PluginStatus.LOADED


@pytest.mark.parametrize(
    ("value", "strict"), [("1", True), ("yes", True), ("On", True), ("0", False), ("", False)]
)
def test_strict_mode_reads_the_switch_one_way(value: str, strict: bool) -> None:
    from volta_core import strict_mode

    assert strict_mode({"VLLM_VOLTA_STRICT": value}) is strict
    assert strict_mode({}) is False
