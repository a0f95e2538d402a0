"""The plugin module the ``vllm_volta.plugins`` entry point names: declarations and hooks.

Light on purpose: discovery imports it in every vLLM process, and it pulls in nothing but the
parser and the host's declaration types.
"""

from __future__ import annotations

from collections.abc import Iterable

from volta_core import (
    ReasoningContext,
    ReasoningParserSpec,
    ReasoningSplit,
    ReasoningTextLost,
    check_no_text_lost,
    hookimpl,
)
from volta_reasoning.parser import Qwen3ReasoningParser

VOLTA_HOST_API = "1.0"

#: The name vLLM knows the parser by (``--reasoning-parser qwen3-volta``).
PARSER_NAME = "qwen3-volta"

_PARSER = Qwen3ReasoningParser()


@hookimpl
def volta_reasoning_parsers() -> Iterable[ReasoningParserSpec]:
    return [
        ReasoningParserSpec(
            PARSER_NAME,
            "volta_reasoning.parser:Qwen3ReasoningParser",
            "Qwen3-family <think> parser: mode decided from the prompt, truncated reasoning "
            "kept as reasoning, streaming equal to non-streaming, no text ever lost",
        )
    ]


def _loses_text(text: str, split: ReasoningSplit) -> bool:
    try:
        check_no_text_lost(text, split, (_PARSER.start_tag, _PARSER.end_tag))
    except ReasoningTextLost:
        return True
    return False


@hookimpl
def volta_reasoning_postprocess(
    split: ReasoningSplit, context: ReasoningContext
) -> ReasoningSplit | None:
    """Truncation policy: a non-streaming result cut by ``max_tokens`` never comes back blanked.

    An engine parser (1Cat-vLLM's; 1CatAI/1Cat-vLLM#47 and #52) re-decoded content from the
    empty content-id list of a truncated output and returned ``""``. For a non-streaming result
    whose ``finish_reason`` is ``"length"`` or unknown (``None``: vLLM tells a reasoning parser
    no finish reason on that path, so the host passes none), a split that loses text, or that
    blanks content to ``""`` where none exists, is replaced by this plugin's split of the whole
    text. The mode is the context's ``in_reasoning`` (decided from the prompt by the adapter);
    when the engine did not say, it is guessed from the incoming split (reasoning present means
    a think block was open). The output's own leading ``<think>`` is recognised either way.
    Anything else, and streaming deltas (a per-delta view cannot place held-back text), is left
    as it is.
    """
    if context.streaming or context.finish_reason not in ("length", None):
        return None
    in_reasoning = context.in_reasoning
    if in_reasoning is None:
        in_reasoning = split.reasoning is not None
    restored = _PARSER.split(context.text, in_reasoning=in_reasoning)
    blanked = split.content == "" and restored.content is None
    if blanked or _loses_text(context.text, split):
        return restored
    return None
