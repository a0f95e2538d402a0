"""The plugin through the host: declarations, discovery of the installed entry point, and the
truncation post-processing rule (1Cat-vLLM's blanked answers, fixed by its PRs #47/#52)."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
from importlib import metadata

import pytest

import volta_reasoning
import volta_reasoning.plugin
from volta_core.host.discovery import discover
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import PluginStatus
from volta_core.host.resolution.reasoning import check_no_text_lost
from volta_core.host.types import ReasoningContext, ReasoningSplit
from volta_core.vllm.reasoning import ReasoningSession
from volta_reasoning.parser import Qwen3ReasoningParser


@pytest.fixture
def manager() -> VoltaPluginManager:
    manager = VoltaPluginManager(strict=True)
    manager.register(volta_reasoning.plugin, "reasoning")
    return manager


def test_registers_in_process_and_declares_its_parser(manager: VoltaPluginManager) -> None:
    record = manager.records["reasoning"]
    assert record.host_api == "1.0"
    assert record.provides == {"reasoning parser": ("qwen3-volta",)}
    assert set(record.hooks) == {"volta_reasoning_parsers", "volta_reasoning_postprocess"}
    [(plugin, spec)] = manager.reasoning_parsers()
    assert (plugin, spec.name) == ("reasoning", "qwen3-volta")
    module, _, name = spec.impl.partition(":")
    assert getattr(importlib.import_module(module), name) is Qwen3ReasoningParser


def test_installed_entry_point_is_discovered() -> None:
    manager = discover(environ={"VLLM_VOLTA_PLUGINS": "reasoning"})
    record = manager.records["reasoning"]
    assert record.status is PluginStatus.LOADED, record.error
    assert record.distribution == "vllm-volta-reasoning"
    assert record.version == metadata.version("vllm-volta-reasoning") == volta_reasoning.__version__
    assert record.provides == {"reasoning parser": ("qwen3-volta",)}


def test_loading_the_plugin_imports_no_engine() -> None:
    code = (
        "import sys, volta_reasoning.plugin; "
        "print(sorted({'torch', 'triton', 'vllm'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# A word-level vocabulary standing in for the tokenizer: enough to replay 1Cat-vLLM's decode.
VOCAB = {1: "The", 2: " answer", 3: " is", 4: "Step", 5: " one", 6: "</think>", 7: "Four"}


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def context(ids: list[int], finish_reason: str | None = "length") -> ReasoningContext:
    return ReasoningContext(
        parser="qwen3",
        text=decode(ids),
        token_ids=tuple(ids),
        finish_reason=finish_reason,
        streaming=False,
    )


def seed_004_split(ids: list[int], parser_split: ReasoningSplit) -> ReasoningSplit:
    """The fork's serving step: content re-decoded from the ids after ``</think>``.

    With no ``</think>`` (truncated) that id list is empty, and its decode blanks the content.
    """
    content_ids = ids[ids.index(6) + 1 :] if 6 in ids else []
    return ReasoningSplit(parser_split.reasoning, decode(content_ids))


def test_seed_004_blanked_answer_is_restored(manager: VoltaPluginManager) -> None:
    ids = [1, 2, 3]  # a non-thinking answer cut by max_tokens
    engine = seed_004_split(ids, ReasoningSplit(None, decode(ids)))
    assert engine == ReasoningSplit(None, "")
    result = manager.postprocess_reasoning(engine, context(ids))
    assert result == ReasoningSplit(None, "The answer is")
    check_no_text_lost(context(ids).text, result)


def test_seed_004_truncated_reasoning_gets_absent_content(manager: VoltaPluginManager) -> None:
    ids = [4, 5]  # a think block cut by max_tokens
    engine = seed_004_split(ids, ReasoningSplit("Step one", None))
    assert engine == ReasoningSplit("Step one", "")
    result = manager.postprocess_reasoning(engine, context(ids))
    assert result == ReasoningSplit("Step one", None)


def test_content_dropped_outside_the_think_block_is_restored(manager: VoltaPluginManager) -> None:
    ids = [4, 5, 6, 7]
    engine = ReasoningSplit("Step one", None)
    result = manager.postprocess_reasoning(engine, context(ids))
    assert result == ReasoningSplit("Step one", "Four")


@pytest.mark.parametrize(
    ("ids", "engine", "finish_reason", "streaming"),
    [
        pytest.param(
            [4, 5, 6, 7], ReasoningSplit("Step one", "Four"), "length", False, id="intact"
        ),
        pytest.param([1, 2, 3], ReasoningSplit(None, ""), "stop", False, id="not-truncated"),
        pytest.param([1, 2, 3], ReasoningSplit(None, ""), "length", True, id="streaming"),
    ],
)
def test_other_splits_are_left_to_the_engine(
    ids: list[int], engine: ReasoningSplit, finish_reason: str, streaming: bool
) -> None:
    ctx = ReasoningContext("qwen3", decode(ids), tuple(ids), finish_reason, streaming)
    assert volta_reasoning.plugin.volta_reasoning_postprocess(engine, ctx) is None


class _BlankingParser:
    """An engine parser with the seed-004 failure: content re-decoded from no ids."""

    def split(self, text: str, *, in_reasoning: bool) -> ReasoningSplit:
        return ReasoningSplit(text if in_reasoning else None, "")


@pytest.mark.parametrize("in_reasoning", [False, True])
def test_the_rule_runs_on_the_hosts_non_streaming_path(
    manager: VoltaPluginManager, in_reasoning: bool
) -> None:
    """The host's session, as vLLM's non-streaming path drives it: no finish reason (vLLM tells
    a reasoning parser none there) and the prompt's mode; a blanked answer is restored."""
    [(_, spec)] = manager.reasoning_parsers()
    session = ReasoningSession(spec, manager, in_reasoning=in_reasoning)
    session.parser = _BlankingParser()
    expected = ("Step one", None) if in_reasoning else (None, "Step one")
    assert session.split("Step one") == ReasoningSplit(*expected)


def test_blanked_truncated_reasoning_uses_the_prompts_mode(manager: VoltaPluginManager) -> None:
    """Both fields blanked: only the prompt (``in_reasoning``) says the text was reasoning."""
    ids = [4, 5]
    blanked = ReasoningSplit(None, "")
    opened = dataclasses.replace(context(ids), in_reasoning=True)
    assert manager.postprocess_reasoning(blanked, opened) == ReasoningSplit("Step one", None)
    closed = dataclasses.replace(context(ids), in_reasoning=False)
    assert manager.postprocess_reasoning(blanked, closed) == ReasoningSplit(None, "Step one")
