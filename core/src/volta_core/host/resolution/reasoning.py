"""The no-loss rule for reasoning splits."""

from __future__ import annotations

from volta_core.errors import ReasoningTextLost
from volta_core.host.types import ReasoningSplit


def _letters(text: str, tags: tuple[str, ...]) -> str:
    for tag in tags:
        text = text.replace(tag, "")
    return "".join(text.split())


def check_no_text_lost(
    text: str, split: ReasoningSplit, tags: tuple[str, ...] = ("<think>", "</think>")
) -> ReasoningSplit:
    """Return ``split`` if reasoning + content hold every character of ``text`` but the tags.

    Whitespace around the tags is the parser's to trim, so it is not counted. Raises
    :class:`ReasoningTextLost` naming how much was lost otherwise.
    """
    expected = _letters(text, tags)
    got = _letters((split.reasoning or "") + (split.content or ""), tags)
    if got != expected:
        raise ReasoningTextLost(
            f"reasoning/content split keeps {len(got)} of {len(expected)} non-space characters "
            "of the generated text"
        )
    return split
