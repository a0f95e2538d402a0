"""Property-based tests: generated configs and plugin answers never take the host down.

For configs (valid, mutated field by field, and garbage JSON) ``vllm-volta plan`` never prints
a traceback nor an internal error, exits 0, 1 or 2, and a plan with "problems: none" is one the
engine accepts (checked against a small independent oracle of the engine's refusals). For plugin
answers (valid declarations and values of every wrong type) the manager never raises anything
but a :class:`PluginError` at registration, and a reference plugin keeps working unchanged.

Bounded (``max_examples``) so the whole file stays within a few tens of seconds on CI's two cores.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from volta_core import V100
from volta_core.cli import main
from volta_core.errors import PluginError
from volta_core.host.discovery import get_plugin_manager
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import PluginStatus
from volta_core.host.types import (
    AttentionBackendSpec,
    AttentionLayer,
    CheckpointKV,
    KernelConfig,
    KVRequest,
    KVVerdict,
    QuantClaim,
    QuantConfig,
    QuantDecline,
    QuantLayer,
    QuantMethodSpec,
    ReasoningContext,
    ReasoningParserSpec,
    ReasoningSplit,
)

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: A tiny valid Qwen3 config, shared by the CLI tests (``data/tiny-qwen3.json``).
BASE: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "tiny-qwen3.json").read_text())

FIELDS = [
    *BASE,
    "layer_types",
    "sliding_window",
    "quantization_config",
    "text_config",
    "num_kv_shared_layers",
    "attn_logit_softcapping",
]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=70),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=6),
    st.sampled_from(["qwen3", "llama", "gemma4", "full_attention", "sliding_attention", "re:["]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=8,
)
quant_sections = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"quant_method": st.sampled_from(["compressed-tensors", "fp8", "awq", "test-raising"])},
        optional={
            "ignore": st.lists(st.sampled_from(["lm_head", "re:.*gate$", "re:[", 3]), max_size=3),
            "config_groups": st.dictionaries(
                st.just("group_0"),
                st.fixed_dictionaries(
                    {
                        "weights": st.fixed_dictionaries(
                            {
                                "num_bits": st.sampled_from([3, 4, 8, "4"]),
                                "type": st.sampled_from(["int", "float", 1]),
                                "group_size": st.sampled_from([None, -1, 48, 128, "x"]),
                            }
                        )
                    }
                ),
                max_size=1,
            ),
            "kv_cache_scheme": st.one_of(
                st.none(),
                st.fixed_dictionaries(
                    {"strategy": st.sampled_from(["tensor", "attn_head", "bogus", 7])}
                ),
            ),
        },
    ),
)


@st.composite
def configs(draw: st.DrawFn) -> object:
    """A valid config with some fields changed or removed, or any JSON value at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    config: dict[str, Any] = dict(BASE)
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        action = draw(st.sampled_from(["delete", "value", "value", "quant"]))
        if action == "delete":
            config.pop(name, None)
        elif action == "quant":
            config["quantization_config"] = draw(quant_sections)
        else:
            config[name] = draw(json_values)
    return config


def _int(config: dict[str, Any], name: str) -> int | None:
    value = config.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def engine_refuses(config: dict[str, Any]) -> str | None:
    """An independent oracle of a few refusals the engine makes (None: none of these)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers, heads = _int(text, "num_hidden_layers"), _int(text, "num_attention_heads")
    hidden, kv = _int(text, "hidden_size"), _int(text, "num_key_value_heads")
    if layers is None or layers < 1:
        return "layers"
    if heads is None or heads < 1 or hidden is None or hidden < 1:
        return "heads or hidden size"
    if kv is not None and (kv < 1 or heads % kv):
        return "kv heads"
    if _int(text, "head_dim") is None and hidden % heads:
        return "head size"
    quant = config.get("quantization_config")
    if (
        isinstance(quant, dict)
        and quant
        and quant.get("quant_method")
        not in (
            "compressed-tensors",
            "fp8",
            "awq",
            "test-raising",
            "test-quant",
            "test-garbage",
        )
    ):
        return "quant method"
    return None


@pytest.fixture(autouse=True)
def fresh_plugin_manager() -> Iterator[None]:
    get_plugin_manager.cache_clear()
    yield
    get_plugin_manager.cache_clear()


def _plan(path: Path) -> tuple[int, str, str]:
    get_plugin_manager.cache_clear()  # a plugin disabled by one example is back for the next
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["plan", str(path)])
    return code, out.getvalue(), err.getvalue()


@SETTINGS
@given(config=configs())
def test_plan_of_any_config_is_a_plan_or_one_line(tmp_path: Path, config: object) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = _plan(path)
    assert code in {0, 1, 2}
    assert "Traceback" not in out + err
    assert "internal error" not in err, err
    if code == 2:
        assert out == ""
        assert err.count("\n") == 1, err
        assert len(err) < 400, err
        return
    assert "problems:" in out
    if code == 0:
        assert "problems: none" in out
        assert isinstance(config, dict)
        assert engine_refuses(config) is None, (engine_refuses(config), out)
    else:
        assert "problems: none" not in out


# -- plugin answers -------------------------------------------------------------------------

REF_BACKEND = AttentionBackendSpec(
    "REF_ATTN",
    "ref.mod:Backend",
    5,
    (7, 0),
    (7, 5),
    frozenset({"float16"}),
    frozenset({"float16"}),
    frozenset({128}),
)
LAYER = AttentionLayer("l", 128, 8, 2, "float16", "auto")
REQUEST = KVRequest("fp8_e5m2", CheckpointKV(), V100)
CONTEXT = ReasoningContext("p", "<think>a</think>b", (), "stop", streaming=False)

names = st.sampled_from(["GEN_A", "GEN_B", "bad name", "", "TRITON_ATTN", "qwen3", "fp8"])
impls = st.sampled_from(["m.mod:X", "no_colon", ""])
backends = st.builds(
    AttentionBackendSpec,
    name=names,
    impl=impls,
    priority=st.one_of(st.integers(-10, 200), st.just("high")),
    min_capability=st.sampled_from([(7, 0), (9, 0), (7,)]),
    max_capability=st.sampled_from([(7, 5), (6, 0), (12, 0)]),
    dtypes=st.just(frozenset({"float16"})),
    kv_cache_dtypes=st.just(frozenset({"float16"})),
    head_sizes=st.sampled_from([frozenset(), frozenset({128}), frozenset({64})]),
)
declarations = st.one_of(
    backends,
    st.builds(QuantMethodSpec, name=names, impl=impls),
    st.builds(ReasoningParserSpec, name=names, impl=impls),
    st.builds(KernelConfig, name=names, kernel=impls, signature=st.just({"x": "*fp16"})),
)
answers = st.one_of(
    json_values,
    declarations,
    st.lists(declarations, max_size=3),
    st.lists(st.one_of(declarations, json_scalars), max_size=3),
    st.builds(KVVerdict.accept, st.text(max_size=5)),
    st.builds(KVVerdict.reject, st.text(max_size=5)),
    st.builds(QuantClaim, st.sampled_from(["gen-q", "ref-q"]), impls, st.integers(0, 20)),
    st.builds(QuantDecline, st.sampled_from(["gen-q", "ref-q"]), st.text(max_size=5)),
    st.builds(ReasoningSplit, st.sampled_from([None, "a", "", 1]), st.sampled_from([None, "b"])),
)
HOOKS = [
    "volta_attention_backends",
    "volta_quant_methods",
    "volta_reasoning_parsers",
    "volta_kernel_configs",
    "volta_quant_method",
    "volta_kv_cache_verdict",
    "volta_reasoning_postprocess",
]


def _reference(fake_plugin: Any) -> object:
    return fake_plugin(
        volta_attention_backends=[REF_BACKEND],
        volta_quant_methods=[QuantMethodSpec("ref-q", "ref.mod:Q")],
        volta_quant_method=QuantClaim("ref-q", "ref.mod:Q", priority=10),
        volta_kv_cache_verdict=KVVerdict.accept("ref"),
    )


@SETTINGS
@given(hook=st.sampled_from(HOOKS), answer=answers, raises=st.booleans())
def test_a_plugins_answer_never_changes_what_another_plugin_does(
    fake_plugin: Any, hook: str, answer: object, raises: bool
) -> None:
    def raising(**_: object) -> object:
        raise ValueError("generated failure")

    manager = VoltaPluginManager()
    manager.register(_reference(fake_plugin), "ref")
    generated = fake_plugin(**{hook: raising if raises else (lambda **_: answer)})
    try:
        manager.register(generated, "gen")
    except PluginError:
        assert manager.pm.get_plugin("gen") is None
    assert manager.records["ref"].status is PluginStatus.LOADED
    assert ("ref", REF_BACKEND) in manager.attention_backends()
    choice = manager.select_attention(LAYER, V100)
    assert choice.backend.name in {"REF_ATTN", "GEN_A", "GEN_B"}
    decision = manager.decide_kv_cache(REQUEST)
    assert ("ref", KVVerdict.accept("ref")) in decision.verdicts
    resolution = manager.resolve_quant(QuantConfig("ct"), QuantLayer("linear", "l"), V100)
    assert resolution.claim is not None
    assert resolution.claim.method in {"ref-q", "gen-q"}
    split = ReasoningSplit("a", "b")
    assert manager.postprocess_reasoning(split, CONTEXT) in {split, ReasoningSplit("a", "b")}
    manager.kernel_configs(V100)
    assert manager.records["ref"].status is PluginStatus.LOADED
