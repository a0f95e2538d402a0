"""The Qwen3-family reasoning parser: split generated text into reasoning and content, losing none.

Engine-independent on purpose (no vLLM import): the vLLM adapter in ``volta_core`` wraps this
class, and the same rules serve the non-streaming and the streaming path.

The grammar of one generated text ``T``, given whether the prompt left a think block open::

    T = [ws] [<think>] [ws] REASONING [ws </think> [ws] CONTENT]     (reasoning region present)
    T = CONTENT                                                       (no reasoning region)

- The reasoning region is present when the prompt left ``<think>`` open (``in_reasoning``) or
  when ``T`` itself opens with ``<think>`` after nothing but whitespace. Only that one leading
  opening tag is a tag; any other ``<think>`` is text.
- The first ``</think>`` inside the reasoning region closes it; every later tag is content text.
- Without ``</think>`` (generation stopped or was truncated inside the block) the region runs to
  the end: everything is reasoning and content is ``None`` (absent).
- Whitespace adjacent to a tag (the prompt's open tag included) is trimmed; nothing else is.
  ``None`` means a region is absent; ``""`` means present but empty.
"""

from __future__ import annotations

import enum

from volta_core import ReasoningSplit

#: Qwen chat templates start the assistant turn of the generation prompt with this marker.
ASSISTANT_TURN = "<|im_start|>assistant"


def _partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper, non-empty prefix of ``tag``.

    That suffix may still become ``tag`` with the next delta, so it is the only text a stream
    holds back (with the whitespace before it, which a tag would trim).
    """
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class Qwen3ReasoningParser:
    """Reasoning parser for Qwen3-family ``<think>...</think>`` output.

    Stateless and cheap to construct: one instance may serve every request; per-request
    streaming state lives in the :class:`ReasoningStream` that :meth:`stream` returns.
    """

    start_tag = "<think>"
    end_tag = "</think>"
    #: Tokens that end a Qwen chat turn or document: the host's adapter reports the finish
    #: reason ``"stop"`` to post-processors on the delta that carries one.
    end_markers = ("<|im_end|>", "<|endoftext|>")

    def starts_in_reasoning(self, prompt: str) -> bool:
        """Whether generation starts inside a think block, decided from the rendered prompt.

        True when the assistant turn being generated has an unclosed ``<think>`` (thinking
        templates end the prompt with ``<think>\\n``, or a prefill continues reasoning). False
        when thinking is disabled (the template already closed an empty block) or the template
        never opens one (Qwen3-Instruct-2507, or Qwen3 hybrid models with thinking on, which
        open the block themselves: :meth:`split` recognises that opening tag in the output).
        Only the text after the last assistant-turn marker counts, so think tags inside user
        messages or earlier turns cannot mislead it.
        """
        turn = prompt.rfind(ASSISTANT_TURN)
        tail = prompt[turn:] if turn >= 0 else prompt
        opened = tail.rfind(self.start_tag)
        return opened >= 0 and self.end_tag not in tail[opened:]

    def split(self, text: str, *, in_reasoning: bool) -> ReasoningSplit:
        """Split a whole generated text (non-streaming) by the module's grammar."""
        body = text.lstrip()
        if body.startswith(self.start_tag):
            body = body[len(self.start_tag) :]
        elif not in_reasoning:
            return ReasoningSplit(reasoning=None, content=text)
        reasoning, tag, content = body.lstrip().partition(self.end_tag)
        if not tag:
            return ReasoningSplit(reasoning=reasoning, content=None)
        return ReasoningSplit(reasoning=reasoning.rstrip(), content=content.lstrip())

    def stream(self, *, in_reasoning: bool) -> ReasoningStream:
        """A fresh incremental splitter for one request's output."""
        return ReasoningStream(self.start_tag, self.end_tag, in_reasoning=in_reasoning)


class _State(enum.Enum):
    START = "start"  # nothing but whitespace seen: an opening tag may still come
    REASONING_LEAD = "reasoning_lead"  # after an opening tag: trimming whitespace
    REASONING = "reasoning"
    CONTENT_LEAD = "content_lead"  # after the closing tag: trimming whitespace
    CONTENT = "content"


class ReasoningStream:
    """Incremental form of :meth:`Qwen3ReasoningParser.split` for streamed output.

    Each :meth:`feed` returns the part of the text released so far that is reasoning and the
    part that is content. A piece is ``None`` while its region is not open during that call and
    a string (possibly empty) while it is. Joining every call's non-None pieces (``None`` if all
    were ``None``), :meth:`finish` included, gives exactly ``split(whole_text)``, for any
    chunking. Held back are only a suffix that could still become a tag and the whitespace a
    tag would trim; :meth:`finish` releases them, and :meth:`flush` releases them mid-stream.

    Held whitespace is kept as a list of pieces, joined once when released, and each call scans
    only the new piece and the partial tag before it, so a stream costs time linear in its text
    however long a whitespace run it holds.
    """

    def __init__(self, start_tag: str, end_tag: str, *, in_reasoning: bool) -> None:
        self._start_tag = start_tag
        self._end_tag = end_tag
        self._in_reasoning = in_reasoning
        self._state = _State.START
        self._space: list[str] = []  # held whitespace, before any partial tag
        self._tail = ""  # held text after that whitespace: at most a partial tag
        self._finished = False

    @property
    def held(self) -> str:
        """Text received but not yet released (a possible partial tag and its whitespace)."""
        return "".join(self._space) + self._tail

    @property
    def in_content(self) -> bool:
        """Whether the content region has begun (the think block closed, or there is none).

        What an engine asks as "has reasoning ended" (for example before tool-call parsing).
        """
        return self._state in (_State.CONTENT_LEAD, _State.CONTENT)

    def feed(self, delta: str) -> ReasoningSplit:
        """Take the next piece of generated text; return what can be released now."""
        if self._finished:
            raise RuntimeError("ReasoningStream.feed called after finish()")
        return self._advance(delta, final=False)

    def flush(self) -> ReasoningSplit:
        """Release what is held now, as :meth:`finish` would, and go on taking text.

        For an engine that never says the output ended (vLLM 0.19, 1Cat-vLLM): flushing after
        every piece holds nothing back, so an output cut anywhere loses no text. What is
        released cannot be taken back: whitespace later followed by a tag stays untrimmed in
        its region, and a tag counts only if one piece after a flush holds it whole (a Qwen3
        tag is one token, which an engine streams in one piece). Only leading whitespace is
        released without deciding the region: as content, or dropped where the prompt opened
        the block, and an opening tag after it still opens the reasoning.
        """
        if self._finished:
            raise RuntimeError("ReasoningStream.flush called after finish()")
        if not self._space and not self._tail:
            return self._advance("", final=False)
        if self._state is _State.START and not self._tail:
            space = self._take_space()
            if self._in_reasoning:  # leading whitespace of the reasoning region: trimmed
                return ReasoningSplit(reasoning="", content=None)
            return ReasoningSplit(reasoning=None, content=space)
        return self._advance("", final=True)

    def finish(self) -> ReasoningSplit:
        """End of output: release everything still held back. Call exactly once."""
        if self._finished:
            raise RuntimeError("ReasoningStream.finish called twice")
        result = self._advance("", final=True)
        self._finished = True
        return result

    def _hold_space(self, space: str) -> None:
        if space:
            self._space.append(space)

    def _take_space(self) -> str:
        space = "".join(self._space)
        self._space = []
        return space

    def _advance(self, delta: str, *, final: bool) -> ReasoningSplit:
        reasoning_parts: list[str] = []
        content_parts: list[str] = []
        state = self._state
        reasoning_open = state in (_State.REASONING_LEAD, _State.REASONING) or (
            state is _State.START and self._in_reasoning
        )
        content_open = state in (_State.CONTENT_LEAD, _State.CONTENT)
        # ``text`` is the held partial tag and the new piece; held whitespace stays in
        # ``self._space`` (only START and REASONING hold any), so no call rescans it.
        text = self._tail + delta
        while True:
            if state is _State.START:
                body = text.lstrip()
                self._hold_space(text[: len(text) - len(body)])
                if body.startswith(self._start_tag):
                    self._take_space()  # whitespace before the opening tag is trimmed
                    text, state, reasoning_open = (
                        body[len(self._start_tag) :],
                        _State.REASONING_LEAD,
                        True,
                    )
                    continue
                if not final and self._start_tag.startswith(body):
                    text = body
                    break  # only whitespace or a partial opening tag so far
                if self._in_reasoning:
                    self._take_space()  # leading whitespace of the reasoning region
                    text, state = body, _State.REASONING
                else:
                    text, state, content_open = self._take_space() + body, _State.CONTENT, True
            elif state is _State.REASONING_LEAD:
                text = text.lstrip()
                if not text and not final:
                    break
                state = _State.REASONING
            elif state is _State.REASONING:
                # A tag never starts inside held whitespace, so ``text`` is where it can be.
                before, tag, after = text.partition(self._end_tag)
                if tag:
                    kept = before.rstrip()
                    space = self._take_space()
                    reasoning_parts.append(space + kept if kept else "")
                    text, state, content_open = after, _State.CONTENT_LEAD, True
                    continue
                keep = 0 if final else _partial_tag_len(text, self._end_tag)
                body = text[: len(text) - keep]
                stripped = body if final else body.rstrip()
                if stripped:
                    reasoning_parts.append(self._take_space() + stripped)
                self._hold_space(body[len(stripped) :])
                text = text[len(body) :]
                if final:
                    reasoning_parts.append(self._take_space())
                break
            elif state is _State.CONTENT_LEAD:
                text = text.lstrip()
                if not text and not final:
                    break
                state = _State.CONTENT
            else:
                content_parts.append(text)
                text = ""
                break
        self._state, self._tail = state, text
        return ReasoningSplit(
            reasoning="".join(reasoning_parts) if reasoning_open else None,
            content="".join(content_parts) if content_open else None,
        )
