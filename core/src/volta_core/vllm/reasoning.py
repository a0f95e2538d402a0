"""One request's reasoning split, as the vLLM reasoning-parser wrapper drives it; free of vLLM.

A plugin declares an engine-independent parser (``ReasoningParserSpec.impl``) with
``starts_in_reasoning(prompt)``, ``split(text, in_reasoning=...)`` and
``stream(in_reasoning=...)``, whose streams have ``feed(delta)``, ``finish()``, ``held``,
``in_content`` and optionally ``flush()`` (release what is held and go on).
:class:`ReasoningSession` holds what one request needs: whether the prompt left a think block
open, the streaming state, and the text and token ids seen so far, and it runs the host's
post-processing hook (:meth:`~volta_core.host.manager.VoltaPluginManager.postprocess_reasoning`)
on every split it returns, non-streaming and streaming alike.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import ReasoningContext, ReasoningParserSpec, ReasoningSplit

#: Environment variable naming extra vLLM names for Volta parsers: ``qwen3=qwen3-volta,...``.
ENV_ALIASES = "VLLM_VOLTA_REASONING_ALIASES"


def load_object(path: str) -> Any:
    """Import ``package.module:Name`` (the form declarations use)."""
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"{path!r} is not of the form 'package.module:Name'")
    return getattr(importlib.import_module(module), name)


@functools.cache
def parser_instance(impl: str) -> Any:
    """One engine-independent parser per implementation (they are stateless)."""
    return load_object(impl)()


def aliases(value: str | None, known: Sequence[str]) -> dict[str, str]:
    """Parse ``alias=name,...``; an entry naming an unknown parser is an error naming it."""
    result: dict[str, str] = {}
    for entry in (value or "").split(","):
        if not entry.strip():
            continue
        alias, sep, name = (part.strip() for part in entry.partition("="))
        if not sep or not alias or not name:
            raise ValueError(f"{ENV_ALIASES} entry {entry!r} is not of the form alias=parser")
        if name not in known:
            raise ValueError(
                f"{ENV_ALIASES} maps {alias!r} to {name!r}, which no Volta plugin declares "
                f"(declared: {', '.join(known) or 'none'})"
            )
        result[alias] = name
    return result


def default_in_reasoning(chat_template_kwargs: Mapping[str, Any] | None) -> bool:
    """The mode to assume when vLLM never showed the prompt (see :class:`ReasoningSession`)."""
    return bool((chat_template_kwargs or {}).get("enable_thinking", True))


#: The context fields a streaming delta's context joins only when read, and the defaults of the
#: others.
_LAZY = ("text", "token_ids")
_DEFAULTS = {
    field.name: field.default
    for field in dataclasses.fields(ReasoningContext)
    if field.name not in _LAZY and field.default is not dataclasses.MISSING
}


class _SoFarContext(ReasoningContext):
    """A streaming :class:`ReasoningContext` whose ``text`` and ``token_ids`` (the output up to
    and including its delta) are joined from the session's buffers only when a post-processor
    reads them.

    Building one per delta then costs constant time, so a request costs the host time linear
    in its output; copying the whole output into every delta's context made it quadratic.
    """

    @classmethod
    def of(cls, parts: list[str], token_ids: list[int], **fields: Any) -> ReasoningContext:
        context = cls.__new__(cls)
        # The buffers only grow, so their lengths now mark this delta's end for good.
        so_far = (parts, len(parts), token_ids, len(token_ids))
        context.__dict__.update(_DEFAULTS, **fields, _so_far=so_far)
        return context

    def __getattr__(self, name: str) -> Any:
        so_far = self.__dict__.get("_so_far")
        if so_far is None or name not in _LAZY:
            raise AttributeError(name)
        parts, n_parts, token_ids, n_ids = so_far
        value = "".join(parts[:n_parts]) if name == "text" else tuple(token_ids[:n_ids])
        object.__setattr__(self, name, value)
        return value


class ReasoningSession:
    """The reasoning split of one generated output.

    The mode (did the prompt leave ``<think>`` open?) comes from the rendered prompt whenever
    vLLM shows it: :meth:`set_prompt`. vLLM 0.33's servers show it to every parser before parsing
    (``ReasoningParser.set_prompt_token_ids``). vLLM 0.32 shows it on the streaming path and,
    for a non-streaming request, through its reasoning-end check before generation; where
    neither happened there (``n > 1`` choices after the first, ``include_reasoning`` false,
    structured-output grammars from the parser) the session falls back to the request's
    ``enable_thinking`` template argument.

    Post-processors see the mode as ``in_reasoning`` and the finish reason the adapter knows
    (``"stop"`` once an end-of-sequence token arrived; vLLM tells a reasoning parser no other).
    """

    def __init__(
        self,
        spec: ReasoningParserSpec,
        manager: VoltaPluginManager,
        *,
        in_reasoning: bool = True,
    ) -> None:
        self.spec = spec
        self.manager = manager
        self.parser = parser_instance(spec.impl)
        self.in_reasoning = in_reasoning
        self.prompt_seen = False
        self._stream: Any = None
        self._parts: list[str] = []
        self._token_ids: list[int] = []
        self._finish_reason: str | None = None
        self._content_started = False

    def set_prompt(self, prompt: str) -> None:
        self.in_reasoning = bool(self.parser.starts_in_reasoning(prompt))
        self.prompt_seen = True

    def split(
        self, text: str, token_ids: Sequence[int] = (), finish_reason: str | None = None
    ) -> ReasoningSplit:
        """Non-streaming: split the whole output."""
        split = self.parser.split(text, in_reasoning=self.in_reasoning)
        context = ReasoningContext(
            parser=self.spec.name,
            text=text,
            token_ids=tuple(token_ids),
            finish_reason=finish_reason,
            streaming=False,
            in_reasoning=self.in_reasoning,
        )
        return self.manager.postprocess_reasoning(split, context)

    def feed(
        self,
        delta: str,
        token_ids: Sequence[int] = (),
        *,
        flush: bool = False,
        finish_reason: str | None = None,
    ) -> ReasoningSplit:
        """Streaming: the part of this delta (and anything held back before) released now.

        ``flush`` releases everything the stream holds, for engines that never say the output
        ended: then no text waits for a call that may never come (a parser's stream without
        ``flush`` is finished instead by the delta that has a ``finish_reason``).
        ``finish_reason`` is the output's, when this delta ended it.
        """
        if self._stream is None:
            self._stream = self.parser.stream(in_reasoning=self.in_reasoning)
        self._parts.append(delta)
        self._token_ids.extend(token_ids)
        self._finish_reason = finish_reason or self._finish_reason
        split = self._stream.feed(delta)
        if flush:
            split = _joined(split, self._flush(finish_reason))
        if split.content and split.content.strip():
            self._content_started = True
        return self._post_stream(split, delta)

    def _flush(self, finish_reason: str | None) -> ReasoningSplit:
        stream = self._stream
        if hasattr(stream, "flush"):
            return stream.flush()  # type: ignore[no-any-return]
        # A stream that cannot flush (vllm-volta-reasoning before 0.2) is finished by the delta
        # that ends the output, the one end an engine with no final call shows a parser.
        if finish_reason is None:
            return ReasoningSplit(reasoning=None, content=None)
        self._stream = None
        return stream.finish()  # type: ignore[no-any-return]

    def finish(self) -> ReasoningSplit | None:
        """Streaming: release what the stream still holds; None if nothing was streamed."""
        if self._stream is None:
            return None
        stream, self._stream = self._stream, None
        return self._post_stream(stream.finish(), "")

    def _post_stream(self, split: ReasoningSplit, delta: str) -> ReasoningSplit:
        context = _SoFarContext.of(
            self._parts,
            self._token_ids,
            parser=self.spec.name,
            finish_reason=self._finish_reason,
            streaming=True,
            delta=delta,
            in_reasoning=self.in_reasoning,
        )
        return self.manager.postprocess_reasoning(split, context)

    @property
    def in_content(self) -> bool:
        """Whether the streamed output has reached content that is passed through verbatim.

        True only once content other than the whitespace a tag trims has been released and the
        stream holds nothing back: from there on the parser passes text through unchanged, so
        vLLM may stream the rest itself (as content, or into a tool-call parser) and the
        concatenated deltas still equal the non-streaming split.
        """
        stream = self._stream
        return (
            stream is not None and self._content_started and stream.in_content and not stream.held
        )


def _joined(first: ReasoningSplit, second: ReasoningSplit) -> ReasoningSplit:
    """Two consecutive pieces of one stream as one (``None`` where both are absent)."""
    return ReasoningSplit(
        reasoning=_concat(first.reasoning, second.reasoning),
        content=_concat(first.content, second.content),
    )


def _concat(first: str | None, second: str | None) -> str | None:
    if first is None and second is None:
        return None
    return (first or "") + (second or "")
