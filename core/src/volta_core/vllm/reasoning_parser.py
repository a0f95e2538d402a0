"""The vLLM ``ReasoningParser`` subclass built for each parser a plugin declares, and its
registration with ``ReasoningParserManager``.

The subclass drives the plugin's engine-independent parser through a
:class:`~volta_core.vllm.reasoning.ReasoningSession` (vLLM-free), streaming the way the installed
family's chat server does (:attr:`volta_core.vllm.families.Family.streaming`). vLLM is imported
lazily, inside the functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import ReasoningParserSpec, ReasoningSplit
from volta_core.vllm.families import Streaming, family
from volta_core.vllm.reasoning import ReasoningSession, default_in_reasoning, load_object


def delta_message_cls() -> type:
    """The ``DeltaMessage`` class the family's chat server streams."""
    return load_object(f"{family().delta_message_module}:DeltaMessage")  # type: ignore[no-any-return]


def make_reasoning_parser(spec: ReasoningParserSpec, manager: VoltaPluginManager) -> type:
    """A vLLM ``ReasoningParser`` that drives the plugin's engine-independent parser.

    Streaming follows the family's protocol (:attr:`Family.streaming
    <volta_core.vllm.families.Family.streaming>`):

    - ``ENGINE`` (``engine_based_streaming``): every delta goes through the plugin's stream
      until content is passed through verbatim, and the final flush (``finish_streaming``)
      releases what the stream held back; the concatenated deltas equal the non-streaming
      split.
    - ``DELTA``: vLLM calls nothing after the last delta, and a parser is not told that a
      delta is the last (an output cut by ``max_tokens``, a stop string or an abort ends
      without an end-of-sequence token), so the stream is flushed after every delta and holds
      nothing back: no text is ever lost. The concatenated deltas equal the non-streaming split
      but where released text cannot be taken back (:meth:`ReasoningStream.flush
      <volta_reasoning.parser.ReasoningStream.flush>`): whitespace before a closing tag that
      comes in a later delta stays in the reasoning. ``is_reasoning_end_streaming`` says the
      reasoning ended once content is passed through verbatim, since vLLM then streams the
      rest itself.

    Token-id checks (``is_reasoning_end``...) keep vLLM's meaning for structured outputs and
    tool parsing. Post-processors are told the finish reason ``"stop"`` by the delta that
    carries an end-of-sequence token (the tokenizer's and the parser's ``end_markers``).
    """
    from vllm.reasoning import ReasoningParser

    delta_message = delta_message_cls()

    def to_delta(split: ReasoningSplit | None) -> Any:
        if split is None or not (split.reasoning or split.content):
            return None
        return delta_message(reasoning=split.reasoning or None, content=split.content or None)

    engine_streaming = family().streaming is Streaming.ENGINE

    class VoltaReasoningParser(ReasoningParser):
        engine_based_streaming = engine_streaming
        volta_spec = spec

        def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(tokenizer, *args, **kwargs)
            self._session = ReasoningSession(
                spec,
                manager,
                in_reasoning=default_in_reasoning(kwargs.get("chat_template_kwargs")),
            )
            parser = self._session.parser
            self._start_tag: str = parser.start_tag
            self._end_tag: str = parser.end_tag
            vocab = self.vocab
            self._start_id: int | None = vocab.get(self._start_tag)
            self._end_id: int | None = vocab.get(self._end_tag)
            self._output_seen = False
            markers = [vocab.get(m) for m in getattr(parser, "end_markers", ())]
            eos = getattr(self.model_tokenizer, "eos_token_id", None)
            self._eos_ids = frozenset(i for i in [*markers, eos] if isinstance(i, int))

        @property
        def reasoning_start_str(self) -> str:
            return self._start_tag

        @property
        def reasoning_end_str(self) -> str:
            return self._end_tag

        def _decode(self, token_ids: Sequence[int]) -> str:
            text: str = self.model_tokenizer.decode(list(token_ids), skip_special_tokens=False)
            return text

        def _see_prompt(self, prompt_token_ids: Sequence[int]) -> None:
            # The mode is read from the prompt once: vLLM 0.33's streaming path hands it over
            # three times per request (set_prompt_token_ids, the reasoning-end check,
            # adjust_initial_state_from_prompt), and each reading decodes the whole prompt.
            # Parsers are per choice, so the first prompt seen is the only one.
            if not self._session.prompt_seen and prompt_token_ids:
                self._session.set_prompt(self._decode(prompt_token_ids))

        def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
            # Before any output, vLLM 0.32 calls this with the rendered prompt (streaming, and
            # the non-streaming reasoning-end check): there the only place it reaches a parser.
            if not self._output_seen:
                self._see_prompt(input_ids)
            for token in reversed(input_ids):
                if token == self._start_id:
                    return False
                if token == self._end_id:
                    return True
            return False

        def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Any) -> bool:
            if not engine_streaming:
                return self._session.in_content
            return self._end_id is not None and self._end_id in list(delta_ids)

        def extract_content_ids(self, input_ids: list[int]) -> list[int]:
            if self._end_id is None or self._end_id not in input_ids[:-1]:
                return []
            return input_ids[input_ids.index(self._end_id) + 1 :]

        def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
            inside = self._session.in_reasoning
            count = 0
            for token in token_ids:
                if token == self._start_id:
                    inside = True
                elif token == self._end_id:
                    inside = False
                elif inside:
                    count += 1
            return count

        def set_prompt_token_ids(self, prompt_token_ids: Sequence[int]) -> None:
            # vLLM 0.33 hands every parser the rendered prompt here before parsing (each choice
            # of a chat request, streaming or not, batch and Responses requests), also where
            # the reasoning-end check never runs (n > 1, include_reasoning false); without it a
            # non-thinking answer would be taken for reasoning. vLLM 0.32 never calls it.
            self._see_prompt(prompt_token_ids)

        def adjust_initial_state_from_prompt(self, prompt_token_ids: Sequence[int]) -> None:
            self._see_prompt(prompt_token_ids)

        def extract_reasoning(self, model_output: str, request: Any) -> tuple[Any, Any]:
            self._output_seen = True
            split = self._session.split(model_output)
            return split.reasoning, split.content

        def extract_reasoning_streaming(
            self,
            previous_text: str,
            current_text: str,
            delta_text: str,
            previous_token_ids: Sequence[int],
            current_token_ids: Sequence[int],
            delta_token_ids: Sequence[int],
        ) -> Any:
            self._output_seen = True
            ended = not self._eos_ids.isdisjoint(delta_token_ids)
            split = self._session.feed(
                delta_text,
                delta_token_ids,
                flush=not engine_streaming,
                finish_reason="stop" if ended else None,
            )
            return to_delta(split)

        def has_engine_confirmed_reasoning_end(self) -> bool:
            return self._session.in_content

        def finish_streaming(self) -> Any:
            return to_delta(self._session.finish())

    VoltaReasoningParser.__name__ = VoltaReasoningParser.__qualname__ = (
        "VoltaReasoningParser_" + "".join(c if c.isalnum() else "_" for c in spec.name)
    )
    return VoltaReasoningParser


def register_reasoning_parser(names: Sequence[str], parser_cls: type) -> None:
    """Register eagerly: overrides a lazily registered built-in of the same name."""
    from vllm.reasoning import ReasoningParserManager

    ReasoningParserManager.register_module(list(names), force=True, module=parser_cls)
