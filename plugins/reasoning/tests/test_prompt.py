"""``starts_in_reasoning`` on prompts as Qwen3-family chat templates render them.

The prompts are the exact text the official templates produce for the messages shown
(``apply_chat_template(..., tokenize=False, add_generation_prompt=True)``):
- Qwen3 hybrid (Qwen3-8B ...): thinking on adds nothing after ``<|im_start|>assistant\\n`` (the
  model opens ``<think>`` itself); ``enable_thinking=False`` appends an empty closed block.
- Qwen3-Thinking-2507 and Qwen3.5 with thinking on: the prompt ends with ``<think>\\n``.
- Qwen3-Instruct-2507: never opens a think block.
"""

from __future__ import annotations

import pytest

from volta_reasoning.parser import Qwen3ReasoningParser

PARSER = Qwen3ReasoningParser()

SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
USER = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
ASSISTANT = "<|im_start|>assistant\n"
TOOL_ROUND = (
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nI should call the weather tool.\n</think>\n\n"
    '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n18 C, clear\n</tool_response><|im_end|>\n"
)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        pytest.param(USER + ASSISTANT, False, id="qwen3-hybrid-thinking-on-model-opens"),
        pytest.param(
            USER + ASSISTANT + "<think>\n\n</think>\n\n", False, id="qwen3-hybrid-thinking-off"
        ),
        pytest.param(SYSTEM + USER + ASSISTANT + "<think>\n", True, id="qwen3-thinking-2507"),
        pytest.param(
            USER + ASSISTANT + "<think>\n\n</think>\n\n", False, id="qwen3.5-thinking-off"
        ),
        pytest.param(SYSTEM + USER + ASSISTANT, False, id="qwen3-instruct-2507"),
        pytest.param(TOOL_ROUND + ASSISTANT + "<think>\n", True, id="tool-round-thinking-on"),
        pytest.param(TOOL_ROUND + ASSISTANT, False, id="tool-round-no-think"),
        pytest.param(
            "<|im_start|>user\nWhy does Qwen print <think> first?<|im_end|>\n" + ASSISTANT,
            False,
            id="think-tag-inside-user-message",
        ),
        pytest.param(
            USER + ASSISTANT + "<think>\nLet me count", True, id="prefilled-reasoning-continues"
        ),
        pytest.param(
            USER + ASSISTANT + "<think>\nok\n</think>\n\nThe answer", False, id="prefilled-answer"
        ),
        pytest.param("Q: 2+2?\n<think>\n", True, id="raw-prompt-without-chat-markers"),
        pytest.param("", False, id="empty-prompt"),
    ],
)
def test_starts_in_reasoning(prompt: str, expected: bool) -> None:
    assert PARSER.starts_in_reasoning(prompt) is expected


def test_prompt_decides_the_split_of_the_same_output() -> None:
    """One output, three templates: the prompt, not a guess, decides what is reasoning."""
    output = "The sum is 4."
    thinking = PARSER.starts_in_reasoning(USER + ASSISTANT + "<think>\n")
    instruct = PARSER.starts_in_reasoning(USER + ASSISTANT)
    disabled = PARSER.starts_in_reasoning(USER + ASSISTANT + "<think>\n\n</think>\n\n")
    assert PARSER.split(output, in_reasoning=thinking).reasoning == output
    assert PARSER.split(output, in_reasoning=instruct).content == output
    assert PARSER.split(output, in_reasoning=disabled).content == output
