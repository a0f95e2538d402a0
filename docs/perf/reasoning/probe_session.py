"""Host CPU time of one streamed request through the reasoning session (no vLLM, no GPU).

Run from the repository root with the dev environment:
``.venv/bin/python docs/perf/reasoning/probe_session.py``. The manager holds the reasoning
plugin (its post-processor included), as a server with ``qwen3-volta`` does. Two shapes:

- a 128K-token answer: ``<think>``, 64K reasoning tokens, ``</think>``, 64K content tokens, one
  token per delta (the vLLM default), each token ``" w"``;
- 200K deltas of one newline each inside the reasoning (a whitespace run the stream holds).

Each as vLLM 0.32/0.33 drive it (``finish`` at the end) and, with ``--flush``, as the adapter
drives it on vLLM 0.19 and 1Cat-vLLM (``flush`` after every delta; before that existed, the
plain form was the path of every family).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

import volta_reasoning.plugin
from volta_core.host.manager import VoltaPluginManager
from volta_core.vllm.reasoning import ReasoningSession


def run(deltas: Iterable[str], *, in_reasoning: bool, flush: bool) -> float:
    manager = VoltaPluginManager()
    manager.register(volta_reasoning.plugin, "reasoning")
    [(_, spec)] = manager.reasoning_parsers()
    session = ReasoningSession(spec, manager, in_reasoning=in_reasoning)
    start = time.perf_counter()
    for i, delta in enumerate(deltas):
        session.feed(delta, (i,), **({"flush": True} if flush else {}))
    session.finish()
    return time.perf_counter() - start


def answer(tokens: int) -> list[str]:
    half = tokens // 2
    return ["<think>", *[" w"] * half, "</think>", *[" w"] * half]


if __name__ == "__main__":
    flush = "--flush" in sys.argv[1:]
    print(f"128K-token answer: {run(answer(128 * 1024), in_reasoning=False, flush=flush):.2f} s")
    newlines = ["x", *["\n"] * 200_000]
    print(f"200K newline deltas: {run(newlines, in_reasoning=True, flush=flush):.2f} s")
