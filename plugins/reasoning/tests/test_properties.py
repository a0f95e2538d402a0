"""Property tests: no text is lost, and streaming equals non-streaming for any chunking."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from volta_core.host.resolution.reasoning import check_no_text_lost
from volta_core.host.types import ReasoningSplit
from volta_reasoning.parser import Qwen3ReasoningParser

PARSER = Qwen3ReasoningParser()
START, END = PARSER.start_tag, PARSER.end_tag

#: Fragments that stress the tag logic: whole, duplicated and partial tags, lookalikes, spaces.
FRAGMENTS = [
    START,
    END,
    START[:3],
    END[:4],
    END[1:],
    "<",
    "</",
    ">",
    "/",
    "think",
    "<thin",
    "</thinker>",
    " ",
    "\n",
    "\n\n",
    "\t",
    "\u00a0",
    "a",
    "Answer: 4.",
    "é",
]

texts = st.one_of(
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=14).map("".join),
    st.text(alphabet="<>/thinkabc \n", max_size=40),
    st.text(max_size=30),
)

SETTINGS = settings(max_examples=400, deadline=None)


def join(pieces: list[ReasoningSplit]) -> ReasoningSplit:
    """Concatenate streamed pieces as the README documents (None only if every piece was None)."""
    reasoning = [p.reasoning for p in pieces if p.reasoning is not None]
    content = [p.content for p in pieces if p.content is not None]
    return ReasoningSplit(
        "".join(reasoning) if reasoning else None, "".join(content) if content else None
    )


def chunked(text: str, cuts: list[int]) -> list[str]:
    """Cut ``text`` at the sorted positions ``cuts`` (empty chunks included)."""
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def rebuilds(text: str, split: ReasoningSplit, in_reasoning: bool) -> bool:
    """``text`` is exactly the grammar's layout of the split, up to trimmed whitespace."""
    if split.reasoning is None:
        return split.content == text
    opening = rf"(?:{re.escape(START)}\s*)?" if in_reasoning else rf"{re.escape(START)}\s*"
    pattern = r"\s*" + opening + re.escape(split.reasoning)
    if split.content is not None:
        pattern += r"\s*" + re.escape(END) + r"\s*" + re.escape(split.content)
    return re.fullmatch(pattern, text, flags=re.DOTALL) is not None


@SETTINGS
@given(text=texts, in_reasoning=st.booleans())
def test_no_text_lost(text: str, in_reasoning: bool) -> None:
    split = PARSER.split(text, in_reasoning=in_reasoning)
    assert rebuilds(text, split, in_reasoning), split
    check_no_text_lost(text, split)
    # Only whitespace next to a tag is trimmed, and the first closing tag closes the block.
    if split.reasoning is not None:
        assert split.reasoning == split.reasoning.lstrip()
        assert END not in split.reasoning
        if split.content is not None:
            assert split.reasoning == split.reasoning.rstrip()
            assert split.content == split.content.lstrip()
    # The reasoning region exists exactly when the prompt or the output's first tag opens it.
    opened = in_reasoning or text.lstrip().startswith(START)
    assert (split.reasoning is not None) == opened
    assert split.content is not None or END not in text.lstrip().removeprefix(START)


@SETTINGS
@given(data=st.data(), text=texts, in_reasoning=st.booleans())
def test_streaming_equals_non_streaming(data: st.DataObject, text: str, in_reasoning: bool) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12), label="cuts"))
    chunks = chunked(text, cuts)
    stream = PARSER.stream(in_reasoning=in_reasoning)
    pieces = []
    for chunk in chunks:
        pieces.append(stream.feed(chunk))
        # Held back: at most whitespace and a suffix that could still become a tag.
        assert len("".join(stream.held.split())) < max(len(START), len(END))
    pieces.append(stream.finish())
    assert join(pieces) == PARSER.split(text, in_reasoning=in_reasoning)


@SETTINGS
@given(
    data=st.data(),
    reasoning=st.text(alphabet="ab <>/\n", max_size=12),
    content=st.text(alphabet="ab <>/\n", max_size=12),
    in_reasoning=st.booleans(),
)
def test_tags_split_across_chunks(
    data: st.DataObject, reasoning: str, content: str, in_reasoning: bool
) -> None:
    """Every cut lands inside a tag: the chunks end and start in the middle of ``</think>``."""
    text = ("" if in_reasoning else START) + reasoning + END + content
    tag_at = text.index(END, len(START) if not in_reasoning else 0)
    inside = st.integers(tag_at + 1, tag_at + len(END) - 1)
    cuts = sorted(data.draw(st.lists(inside, min_size=1, max_size=4), label="cuts"))
    chunks = chunked(text, cuts)
    stream = PARSER.stream(in_reasoning=in_reasoning)
    pieces = [stream.feed(c) for c in chunks]
    pieces.append(stream.finish())
    assert join(pieces) == PARSER.split(text, in_reasoning=in_reasoning)
    assert join(pieces).content is not None


def _squeezed(region: str | None) -> str:
    return "".join((region or "").split())


@SETTINGS
@given(data=st.data(), text=texts, in_reasoning=st.booleans())
def test_flushing_after_every_piece_loses_no_text(
    data: st.DataObject, text: str, in_reasoning: bool
) -> None:
    """What an engine with no final call gets (the host flushes after every delta): nothing is
    held, no text is lost, and where no cut falls inside a tag each region holds the whole
    split's text but for whitespace a tag in a later piece could no longer trim."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12), label="cuts"))
    stream = PARSER.stream(in_reasoning=in_reasoning)
    pieces = []
    for chunk in chunked(text, cuts):
        pieces += [stream.feed(chunk), stream.flush()]
        assert stream.held == ""
    flushed = join(pieces)
    check_no_text_lost(text, flushed)
    tags = [m.span() for tag in (START, END) for m in re.finditer(re.escape(tag), text)]
    if not any(a < cut < b for cut in cuts for a, b in tags):
        whole = PARSER.split(text, in_reasoning=in_reasoning)
        assert _squeezed(flushed.reasoning) == _squeezed(whole.reasoning)
        assert _squeezed(flushed.content) == _squeezed(whole.content)
