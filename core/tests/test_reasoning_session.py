"""The host's reasoning session (what the vLLM parser wrapper drives), with the Qwen3 parser:
what post-processors see, flushing for engines without a final call, and linear cost."""

from __future__ import annotations

import logging
import time
import types
from typing import Any

import pytest

from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import ReasoningContext, ReasoningParserSpec, ReasoningSplit
from volta_core.vllm.reasoning import ReasoningSession

pytestmark = pytest.mark.needs("vllm-volta-reasoning")

SPEC = ReasoningParserSpec("qwen3-volta", "volta_reasoning.parser:Qwen3ReasoningParser")


def recording(manager: VoltaPluginManager, fake_plugin: Any) -> list[ReasoningContext]:
    """Register an identity post-processor that keeps every context it is shown."""
    seen: list[ReasoningContext] = []

    def identity(split: ReasoningSplit, context: ReasoningContext) -> ReasoningSplit:
        seen.append(context)
        return split

    manager.register(fake_plugin(volta_reasoning_postprocess=identity), "identity")
    return seen


def test_streaming_contexts_hold_the_output_so_far_and_the_mode(
    manager: VoltaPluginManager, fake_plugin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    seen = recording(manager, fake_plugin)
    session = ReasoningSession(SPEC, manager, in_reasoning=True)
    deltas = [("Let me see", [1]), (" </th", [2, 3]), ("ink>\n\nFour", [4, 5]), (".", [6])]
    with caplog.at_level(logging.ERROR, logger="volta_core"):
        pieces = [session.feed(text, ids) for text, ids in deltas[:-1]]
        pieces.append(session.feed(*deltas[-1], finish_reason="stop"))
        pieces.append(session.finish())
    # The identity is accepted although the held-back " </th" makes splits differ from deltas.
    assert caplog.text == ""
    assert [(p.reasoning, p.content) for p in pieces] == [
        ("Let me see", None),
        ("", None),
        ("", "Four"),
        (None, "."),
        (None, ""),
    ]
    # Read after the whole stream, each context still holds the output up to its own delta.
    texts = ["Let me see", "Let me see </th", "Let me see </think>\n\nFour"]
    texts += ["Let me see </think>\n\nFour."] * 2
    assert [c.text for c in seen] == texts
    ids = [(1,), (1, 2, 3), (1, 2, 3, 4, 5), (1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 5, 6)]
    assert [c.token_ids for c in seen] == ids
    assert [c.delta for c in seen] == [*(text for text, _ in deltas), ""]
    assert [c.finish_reason for c in seen] == [None, None, None, "stop", "stop"]
    assert all(c.streaming and c.in_reasoning is True for c in seen)


def test_non_streaming_context_has_the_mode_and_the_finish_reason(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    seen = recording(manager, fake_plugin)
    session = ReasoningSession(SPEC, manager, in_reasoning=False)
    assert session.split("plain", (7,), finish_reason="length") == ReasoningSplit(None, "plain")
    [context] = seen
    assert (context.text, context.token_ids, context.streaming) == ("plain", (7,), False)
    assert (context.finish_reason, context.in_reasoning) == ("length", False)


@pytest.mark.parametrize(
    ("deltas", "expected"),
    [
        pytest.param(["a", " b", " \n\n"], "a b \n\n", id="cut-after-whitespace"),
        pytest.param(["a", " b", " </thi"], "a b </thi", id="cut-at-tag-prefix"),
    ],
)
def test_flushing_streams_hold_nothing_back(
    manager: VoltaPluginManager, deltas: list[str], expected: str
) -> None:
    """An engine with no final call (vLLM 0.19, 1Cat-vLLM) cut by ``max_tokens`` or a stop
    string: every character was already released when the last delta was fed."""
    session = ReasoningSession(SPEC, manager, in_reasoning=True)
    released = [session.feed(delta, flush=True).reasoning for delta in deltas]
    assert "".join(r or "" for r in released) == expected


class _NoFlush:
    """A parser whose streams cannot flush, as vllm-volta-reasoning's before 0.2."""

    def __init__(self, parser: Any) -> None:
        self._parser = parser

    def stream(self, *, in_reasoning: bool) -> Any:
        stream = self._parser.stream(in_reasoning=in_reasoning)
        return types.SimpleNamespace(feed=stream.feed, finish=stream.finish)


def test_a_stream_that_cannot_flush_is_finished_by_the_last_delta(
    manager: VoltaPluginManager,
) -> None:
    session = ReasoningSession(SPEC, manager, in_reasoning=True)
    session.parser = _NoFlush(session.parser)
    assert session.feed("a \n", flush=True) == ReasoningSplit("a", None)
    assert session.feed("", flush=True, finish_reason="stop") == ReasoningSplit(" \n", None)


def test_a_long_answer_costs_linear_time(manager: VoltaPluginManager) -> None:
    """64K one-token deltas take about 0.5 s; copying the output into every delta's context
    took about 5 s."""
    session = ReasoningSession(SPEC, manager, in_reasoning=True)
    start = time.perf_counter()
    for i in range(64 * 1024):
        session.feed(" w", (i,))
    assert time.perf_counter() - start < 2.0
