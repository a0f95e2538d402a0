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


def _trailing_space_len(text: str) -> int:
    return len(text) - len(text.rstrip())


class Qwen3ReasoningParser:
    """Reasoning parser for Qwen3-family ``<think>...</think>`` output.

    Stateless and cheap to construct: one instance may serve every request; per-request
    streaming state lives in the :class:`ReasoningStream` that :meth:`stream` returns.
    """

    start_tag = "<think>"
    end_tag = "</think>"
    #: Tokens that end a Qwen chat turn or document: an engine that never says a stream is
    #: over (vLLM before 0.32) finishes the stream on the delta that carries one.
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
    tag would trim; :meth:`finish` releases them.
    """

    def __init__(self, start_tag: str, end_tag: str, *, in_reasoning: bool) -> None:
        self._start_tag = start_tag
        self._end_tag = end_tag
        self._in_reasoning = in_reasoning
        self._state = _State.START
        self._held = ""
        self._finished = False

    @property
    def held(self) -> str:
        """Text received but not yet released (a possible partial tag and its whitespace)."""
        return self._held

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
        self._held += delta
        return self._advance(final=False)

    def finish(self) -> ReasoningSplit:
        """End of output: release everything still held back. Call exactly once."""
        if self._finished:
            raise RuntimeError("ReasoningStream.finish called twice")
        result = self._advance(final=True)
        self._finished = True
        return result

    def _advance(self, *, final: bool) -> ReasoningSplit:
        reasoning_parts: list[str] = []
        content_parts: list[str] = []
        state = self._state
        reasoning_open = state in (_State.REASONING_LEAD, _State.REASONING) or (
            state is _State.START and self._in_reasoning
        )
        content_open = state in (_State.CONTENT_LEAD, _State.CONTENT)
        held = self._held
        while True:
            if state is _State.START:
                body = held.lstrip()
                if body.startswith(self._start_tag):
                    held, state, reasoning_open = (
                        body[len(self._start_tag) :],
                        _State.REASONING_LEAD,
                        True,
                    )
                    continue
                if not final and self._start_tag.startswith(body):
                    break  # only whitespace or a partial opening tag so far
                if self._in_reasoning:
                    held, state = body, _State.REASONING
                else:
                    state, content_open = _State.CONTENT, True
            elif state is _State.REASONING_LEAD:
                held = held.lstrip()
                if not held and not final:
                    break
                state = _State.REASONING
            elif state is _State.REASONING:
                before, tag, after = held.partition(self._end_tag)
                if tag:
                    reasoning_parts.append(before.rstrip())
                    held, state, content_open = after, _State.CONTENT_LEAD, True
                    continue
                keep = 0 if final else _partial_tag_len(held, self._end_tag)
                if not final:
                    keep += _trailing_space_len(held[: len(held) - keep])
                cut = len(held) - keep
                reasoning_parts.append(held[:cut])
                held = held[cut:]
                break
            elif state is _State.CONTENT_LEAD:
                held = held.lstrip()
                if not held and not final:
                    break
                state = _State.CONTENT
            else:
                content_parts.append(held)
                held = ""
                break
        self._state, self._held = state, held
        return ReasoningSplit(
            reasoning="".join(reasoning_parts) if reasoning_open else None,
            content="".join(content_parts) if content_open else None,
        )
