"""Named cases of the split policy, non-streaming and streaming (README: "Policy")."""

from __future__ import annotations

import time

import pytest

from volta_core.host.types import ReasoningSplit
from volta_reasoning.parser import Qwen3ReasoningParser

PARSER = Qwen3ReasoningParser()


def streamed(text: str, chunks: list[str] | None = None, *, in_reasoning: bool) -> ReasoningSplit:
    """Feed ``chunks`` (default: one character at a time) and join the pieces as documented."""
    stream = PARSER.stream(in_reasoning=in_reasoning)
    pieces = [stream.feed(c) for c in (chunks if chunks is not None else list(text))]
    pieces.append(stream.finish())
    reasoning = [p.reasoning for p in pieces if p.reasoning is not None]
    content = [p.content for p in pieces if p.content is not None]
    return ReasoningSplit(
        "".join(reasoning) if reasoning else None, "".join(content) if content else None
    )


CASES = [
    pytest.param(
        "Two and two.\nThat is 4.\n</think>\n\nThe answer is 4.",
        True,
        ReasoningSplit("Two and two.\nThat is 4.", "The answer is 4."),
        id="finished-thinking-template",
    ),
    pytest.param(
        "<think>\nTwo and two.\n</think>\n\nThe answer is 4.",
        False,
        ReasoningSplit("Two and two.", "The answer is 4."),
        id="model-opens-think-itself",
    ),
    pytest.param(
        "\n<think>\nhm\n</think>\n\nok",
        False,
        ReasoningSplit("hm", "ok"),
        id="opening-tag-after-whitespace",
    ),
    pytest.param(
        "Step 1: add the units.\nStep 2: carry the",
        True,
        ReasoningSplit("Step 1: add the units.\nStep 2: carry the", None),
        id="truncated-inside-reasoning",
    ),
    pytest.param(
        "<think>\nStep 1: add the units.\n",
        False,
        ReasoningSplit("Step 1: add the units.\n", None),
        id="truncated-inside-self-opened-reasoning",
    ),
    pytest.param(
        "Step 1 </th",
        True,
        ReasoningSplit("Step 1 </th", None),
        id="truncated-inside-closing-tag",
    ),
    pytest.param(
        "The capital of France is Paris.",
        False,
        ReasoningSplit(None, "The capital of France is Paris."),
        id="no-think-block-all-content",
    ),
    pytest.param(
        "\n\nHello.  ",
        False,
        ReasoningSplit(None, "\n\nHello.  "),
        id="content-whitespace-not-next-to-a-tag-kept",
    ),
    pytest.param(
        "Qwen wraps reasoning in <think> and </think> tags.",
        False,
        ReasoningSplit(None, "Qwen wraps reasoning in <think> and </think> tags."),
        id="literal-tags-inside-content",
    ),
    pytest.param(
        "a</think>b</think>c<think>d",
        True,
        ReasoningSplit("a", "b</think>c<think>d"),
        id="first-closing-tag-wins-later-tags-are-content",
    ),
    pytest.param(
        "<think>\nagain\n</think>\nok",
        True,
        ReasoningSplit("again", "ok"),
        id="duplicated-opening-tag-after-open-prompt",
    ),
    pytest.param(
        "<think><think>x</think>y",
        False,
        ReasoningSplit("<think>x", "y"),
        id="only-one-opening-tag-is-a-tag",
    ),
    pytest.param("</think>\n\nanswer", True, ReasoningSplit("", "answer"), id="empty-reasoning"),
    pytest.param("thought</think>", True, ReasoningSplit("thought", ""), id="empty-content"),
    pytest.param("", True, ReasoningSplit("", None), id="empty-output-in-reasoning"),
    pytest.param("", False, ReasoningSplit(None, ""), id="empty-output-in-content"),
    pytest.param("  <thi", False, ReasoningSplit(None, "  <thi"), id="partial-opening-tag-is-text"),
    pytest.param(
        "x  \t\n</think>\t y \n",
        True,
        ReasoningSplit("x", "y \n"),
        id="whitespace-trimmed-only-next-to-tags",
    ),
]


@pytest.mark.parametrize(("text", "in_reasoning", "expected"), CASES)
def test_split(text: str, in_reasoning: bool, expected: ReasoningSplit) -> None:
    assert PARSER.split(text, in_reasoning=in_reasoning) == expected


@pytest.mark.parametrize(("text", "in_reasoning", "expected"), CASES)
def test_stream_char_by_char_and_whole(
    text: str, in_reasoning: bool, expected: ReasoningSplit
) -> None:
    assert streamed(text, in_reasoning=in_reasoning) == expected
    assert streamed(text, [text], in_reasoning=in_reasoning) == expected


@pytest.mark.parametrize(("text", "in_reasoning", "expected"), CASES)
def test_stream_every_two_chunk_cut(
    text: str, in_reasoning: bool, expected: ReasoningSplit
) -> None:
    for cut in range(len(text) + 1):
        chunks = [text[:cut], text[cut:]]
        assert streamed(text, chunks, in_reasoning=in_reasoning) == expected, cut


def test_stream_releases_reasoning_before_the_closing_tag_completes() -> None:
    stream = PARSER.stream(in_reasoning=True)
    assert stream.feed("Let me see") == ReasoningSplit("Let me see", None)
    assert stream.feed(" </th") == ReasoningSplit("", None)
    assert stream.held == " </th"
    assert stream.feed("ink>\n\nFour") == ReasoningSplit("", "Four")
    assert stream.feed(".") == ReasoningSplit(None, ".")
    assert stream.finish() == ReasoningSplit(None, "")


def test_stream_reports_when_content_begins() -> None:
    thinking = PARSER.stream(in_reasoning=True)
    thinking.feed("hm </think")
    assert not thinking.in_content
    thinking.feed(">")
    assert thinking.in_content
    plain = PARSER.stream(in_reasoning=False)
    plain.feed(" ")
    assert not plain.in_content  # an opening tag may still come
    plain.feed("Hi")
    assert plain.in_content


def test_stream_releases_a_partial_tag_once_it_cannot_be_one() -> None:
    stream = PARSER.stream(in_reasoning=True)
    assert stream.feed("a </thi").reasoning == "a"
    assert stream.feed("s is text") == ReasoningSplit(" </this is text", None)
    assert stream.held == ""


def test_stream_holds_leading_space_until_the_opening_tag_is_decided() -> None:
    stream = PARSER.stream(in_reasoning=False)
    assert stream.feed("\n<th") == ReasoningSplit(None, None)
    assert stream.feed("eory") == ReasoningSplit(None, "\n<theory")


def test_truncated_stream_keeps_held_text_as_reasoning() -> None:
    stream = PARSER.stream(in_reasoning=True)
    assert stream.feed("almost done\n</thi") == ReasoningSplit("almost done", None)
    assert stream.finish() == ReasoningSplit("\n</thi", None)


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        pytest.param(["a", " b", " \n\n"], ["a", " b", " \n\n"], id="cut-after-whitespace"),
        pytest.param(["a", " b", " </thi"], ["a", " b", " </thi"], id="cut-at-tag-prefix"),
        pytest.param(["a\n", "</think>", "x"], ["a\n", "", ""], id="space-before-a-later-tag"),
    ],
)
def test_flush_releases_everything_held(chunks: list[str], expected: list[str]) -> None:
    """Flushed after every piece (an engine with no final call), an output cut anywhere has
    released every character; whitespace released before a tag arrives stays untrimmed."""
    stream = PARSER.stream(in_reasoning=True)
    released = []
    for chunk in chunks:
        piece = stream.feed(chunk)
        rest = stream.flush()
        released.append((piece.reasoning or "") + (rest.reasoning or ""))
        assert stream.held == ""
    assert released == expected


def test_flush_keeps_an_opening_tag_possible_after_leading_whitespace() -> None:
    stream = PARSER.stream(in_reasoning=False)
    stream.feed("\n")
    assert stream.flush() == ReasoningSplit(None, "\n")
    assert stream.feed("<think>r</think>c") == ReasoningSplit("r", "c")
    thinking = PARSER.stream(in_reasoning=True)
    thinking.feed(" ")
    assert thinking.flush() == ReasoningSplit("", None)  # leading space of the reasoning
    assert thinking.feed("<think>r") == ReasoningSplit("r", None)


def test_a_long_whitespace_run_streams_in_linear_time() -> None:
    """100K one-newline pieces inside reasoning take about 0.4 s; rescanning the held run on
    every piece took about 6 s."""
    stream = PARSER.stream(in_reasoning=True)
    stream.feed("x")
    start = time.perf_counter()
    for _ in range(100_000):
        stream.feed("\n")
    assert time.perf_counter() - start < 2.0
    assert stream.finish() == ReasoningSplit("\n" * 100_000, None)


def test_stream_refuses_use_after_finish() -> None:
    stream = PARSER.stream(in_reasoning=False)
    stream.feed("x")
    stream.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        stream.feed("y")
    with pytest.raises(RuntimeError, match="twice"):
        stream.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        stream.flush()
