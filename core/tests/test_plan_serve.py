"""The serve command ``vllm-volta plan`` ends with, per vLLM family and option, and the speed
per stream at the concurrency it serves."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from volta_core.cli import main
from volta_core.host.discovery import get_plugin_manager
from volta_core.planner import serve as serve_module
from volta_core.planner.reserve import CUDA_GRAPH_BYTES_PER_SIZE, capture_sizes
from volta_core.vllm import families, quantization

ZERO_THREE = "vLLM 0.32-0.33"
ONECAT = "1Cat-vLLM 1.2-1.3"


@pytest.fixture(autouse=True)
def fresh_plugin_manager() -> Iterator[None]:
    get_plugin_manager.cache_clear()
    yield
    get_plugin_manager.cache_clear()


@pytest.fixture
def family(monkeypatch: pytest.MonkeyPatch) -> Callable[[str | None], None]:
    """Set the installed family the CLI passes the planner (None: no vLLM installed)."""

    def choose(name: str | None) -> None:
        monkeypatch.setattr(families, "installed_family_name", lambda: name)

    return choose


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(["plan", *argv, "--json"])
    out, err = capsys.readouterr()
    assert err == "", err
    return code, json.loads(out)


def commands(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The serve commands by family."""
    return {name: c for c in plan["serve"]["commands"] for name in c["families"]}


def flag(argv: list[str], name: str) -> list[str]:
    """The values after ``name`` up to the next flag ([] when it is there alone, absent:
    KeyError)."""
    if name not in argv:
        raise KeyError(name)
    rest = argv[argv.index(name) + 1 :]
    values = []
    for word in rest:
        if word.startswith("--"):
            break
        values.append(word)
    return values


@pytest.mark.needs("vllm-volta-fp8w")
def test_a_line_per_family_when_none_is_installed_with_pcie_nccl_settings(
    capsys: pytest.CaptureFixture[str], family: Any
) -> None:
    family(None)
    code, plan = plan_json(capsys, "qwen3.6-27b-fp8", "--gpus", "2", "--max-model-len", "32768")
    assert code == 0
    serve = plan["serve"]
    assert serve["interconnect"] == "pcie"
    assert serve["refused"] is None
    by_family = commands(plan)
    assert sorted(by_family) == sorted(d.family for d in serve_module.DIALECTS)
    # Upstream's families take one line; 1Cat-vLLM gives the FP8 layers to the plugin the plan
    # priced (its own SM70 FP8 path would run them otherwise).
    assert by_family["vLLM 0.19"] is by_family[ZERO_THREE]
    assert len(serve["commands"]) == 2
    assert by_family[ONECAT]["env"] == {"NCCL_P2P_DISABLE": "1", "VLLM_VOLTA_FP8_WEIGHTS": "plugin"}
    assert by_family[ZERO_THREE]["env"] == {"NCCL_P2P_DISABLE": "1"}
    for command in serve["commands"]:
        argv = command["argv"]
        assert argv[:3] == ["vllm", "serve", "qwen3.6-27b-fp8"]
        assert flag(argv, "--tensor-parallel-size") == ["2"]
        assert flag(argv, "--dtype") == ["float16"]
        assert flag(argv, "--max-model-len") == ["32768"]
        assert flag(argv, "--max-num-seqs") == ["256"]
        assert flag(argv, "--gpu-memory-utilization") == ["0.9"]
        assert flag(argv, "--reasoning-parser") == ["qwen3-volta"]
        assert flag(argv, "--disable-custom-all-reduce") == []
        assert "--kv-cache-dtype" not in argv
        assert "--attention-backend" not in argv
        sizes = [int(s) for s in flag(argv, "--cudagraph-capture-sizes")]
        assert sizes == plan["fit"]["cuda_graph_capture_sizes"]
        assert (sizes[0], sizes[-1]) == (1, 256)
        words = shlex.split(command["line"])
        assert words == [f"{k}={v}" for k, v in command["env"].items()] + argv
    assert any("bundled example" in note for note in serve["notes"])


def test_the_installed_family_gets_one_line_and_nvlink_keeps_nccl_defaults(
    capsys: pytest.CaptureFixture[str], family: Any
) -> None:
    family(ZERO_THREE)
    _, plan = plan_json(
        capsys, "qwen3-8b-fp8-kv-per-tensor", "--gpus", "2", "--interconnect", "nvlink"
    )
    (command,) = plan["serve"]["commands"]
    assert command["families"] == [ZERO_THREE]
    assert command["env"] == {}
    assert "--disable-custom-all-reduce" not in command["argv"]
    # One GPU: no tensor parallelism, nothing for NCCL.
    _, plan = plan_json(capsys, "qwen3-8b-fp8-kv-per-tensor")
    (command,) = plan["serve"]["commands"]
    assert command["env"] == {}
    assert "--tensor-parallel-size" not in command["argv"]
    assert "--disable-custom-all-reduce" not in command["argv"]


def test_unknown_interconnect_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "qwen3-8b-fp8-kv-per-tensor", "--interconnect", "infiniband"]) == 2
    assert "--interconnect" in capsys.readouterr().err


def test_knobs_the_plan_chose_are_on_the_line(
    capsys: pytest.CaptureFixture[str], family: Any
) -> None:
    family(ZERO_THREE)
    args = ["dense-40b-fp8", "--gpus", "2", "--max-model-len", "65536", "--max-num-seqs", "6"]
    _, plan = plan_json(
        capsys,
        *args,
        "--kv-cache-dtype",
        "fp8_e5m2",
        "--block-size",
        "32",
        "--speculative-tokens",
        "2",
    )
    assert plan["fit"]["fits"] is True
    (command,) = plan["serve"]["commands"]
    argv = command["argv"]
    assert flag(argv, "--kv-cache-dtype") == ["fp8_e5m2"]
    assert flag(argv, "--block-size") == ["32"]
    assert flag(argv, "--max-num-seqs") == ["6"]
    (config,) = flag(argv, "--speculative-config")
    assert json.loads(config) == {"method": "mtp", "num_speculative_tokens": 2}
    # Three tokens per sequence per decode step: the sizes cover 1 to 6 such sequences.
    sizes = [int(s) for s in flag(argv, "--cudagraph-capture-sizes")]
    assert sizes == [3, 6, 12, 18]


def test_gemma_gets_no_qwen3_parser(capsys: pytest.CaptureFixture[str], family: Any) -> None:
    family(ZERO_THREE)
    _, plan = plan_json(capsys, "gemma-4-dual-head", "--gpus", "4", "--max-model-len", "8192")
    (command,) = plan["serve"]["commands"]
    assert "--reasoning-parser" not in command["argv"]


def test_a_family_only_backend_is_named_for_that_family_alone(
    capsys: pytest.CaptureFixture[str], family: Any
) -> None:
    family(None)
    _, plan = plan_json(
        capsys, "qwen3-8b-fp8-kv-per-tensor", "--attention-backend", "FLASH_ATTN_V100"
    )
    (command,) = plan["serve"]["commands"]
    assert ONECAT in command["families"]
    assert ZERO_THREE not in command["families"]
    assert flag(command["argv"], "--attention-backend") == ["FLASH_ATTN_V100"]
    family(ZERO_THREE)
    _, plan = plan_json(
        capsys, "qwen3-8b-fp8-kv-per-tensor", "--attention-backend", "FLASH_ATTN_V100"
    )
    assert plan["serve"]["commands"] == []
    assert "FLASH_ATTN_V100" in plan["serve"]["refused"]


def test_a_plan_that_fits_only_shorter_serves_the_longest_that_fits(
    capsys: pytest.CaptureFixture[str], family: Any
) -> None:
    family(ZERO_THREE)
    _, plan = plan_json(capsys, "dense-40b-fp8", "--gpus", "2", "--max-model-len", "177408")
    fit = plan["fit"]
    assert fit["fits"] is False
    (longest,) = [s for s in fit["suggestions"] if s.startswith("--max-model-len ")]
    (command,) = plan["serve"]["commands"]
    assert flag(command["argv"], "--max-model-len") == [longest.split()[-1]]
    _, again = plan_json(capsys, "dense-40b-fp8", "--gpus", "2", *shlex.split(longest))
    assert again["fit"]["fits"] is True


def test_a_model_that_fits_nowhere_gets_no_command(
    capsys: pytest.CaptureFixture[str], family: Any
) -> None:
    family(ZERO_THREE)
    code, plan = plan_json(capsys, "qwen3.6-27b-fp8", "--gpu-memory", "1GiB")
    assert code == 1
    assert plan["serve"]["commands"] == []
    assert plan["serve"]["refused"] == "the model fits at no setting (see the memory fit)"


@pytest.mark.needs("vllm-volta-ct-wna16")
def test_text_output_ends_with_the_json_line(
    capsys: pytest.CaptureFixture[str], family: Any
) -> None:
    family(ZERO_THREE)
    args = ["qwen3-8b-fp8-kv-per-head", "--gpus", "2", "--max-num-seqs", "8"]
    _, plan = plan_json(capsys, *args)
    assert main(["plan", *args]) == 0
    text = capsys.readouterr().out.rstrip().splitlines()
    serve_at = text.index("serve (run where the GPUs are, after vllm-volta doctor):")
    assert text[serve_at + 2].strip() == plan["serve"]["commands"][0]["line"]
    assert all(line.startswith("  note: ") for line in text[serve_at + 3 :])


@pytest.mark.parametrize("seqs", [1, 3, 4, 9, 64, 255, 256, 300])
@pytest.mark.parametrize("query", [1, 2])
def test_capture_sizes_cover_every_decode_batch_up_to_max_num_seqs(seqs: int, query: int) -> None:
    sizes = capture_sizes(seqs, query, 8192)
    assert sizes == tuple(sorted(set(sizes)))
    assert all(s % query == 0 for s in sizes)
    assert (sizes[0], sizes[-1]) == (query, seqs * query)
    # Every batch pads to the next captured size: never more than 16 sequences of padding.
    for batch in range(1, seqs + 1):
        assert next(s for s in sizes if s >= batch * query) - batch * query <= 16 * query


def test_capture_sizes_stop_at_max_num_batched_tokens() -> None:
    assert capture_sizes(256, 1, 100)[-1] == 96
    assert capture_sizes(4, 3, 7) == (3, 6)


def test_cuda_graph_memory_follows_the_capture_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    _, four = plan_json(capsys, "qwen3-8b-fp8-kv-per-tensor", "--max-num-seqs", "4")
    _, many = plan_json(capsys, "qwen3-8b-fp8-kv-per-tensor", "--max-num-seqs", "256")
    graphs = [p["fit"]["per_rank_bytes"]["reserve"]["cuda_graphs"] for p in (four, many)]
    counts = [len(p["fit"]["cuda_graph_capture_sizes"]) for p in (four, many)]
    assert counts == [3, 35]
    assert graphs[1] - graphs[0] == (counts[1] - counts[0]) * CUDA_GRAPH_BYTES_PER_SIZE


@pytest.mark.needs("vllm-volta-fp8w")
def test_speed_per_stream_at_one_and_at_max_num_seqs(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["qwen3.6-27b-fp8", "--gpus", "2", "--max-model-len", "8192", "--max-num-seqs", "16"]
    _, plan = plan_json(capsys, *args, "--context", "2048")
    streams = plan["streams"]
    assert (streams["context"], streams["max_num_seqs"]) == (2048, 16)
    one, sixteen = streams["streams"]
    assert (one["streams"], sixteen["streams"]) == (1, 16)
    assert one["tokens_per_second"] == one["tokens_per_second_per_stream"]
    assert sixteen["tokens_per_second"] == pytest.approx(
        16 * sixteen["tokens_per_second_per_stream"], rel=1e-3
    )
    # Decode reads the weights once a step for every stream: slower per stream, faster in all.
    assert sixteen["tokens_per_second_per_stream"] < one["tokens_per_second_per_stream"]
    assert sixteen["tokens_per_second"] > 8 * one["tokens_per_second"]
    # The requested batch's own estimate is the same machinery at that batch.
    assert plan["speed"]["step_ms"] == one["step_ms"]
    assert main(["plan", *args, "--context", "2048"]) == 0
    text = capsys.readouterr().out
    assert "16 streams:" in text
    assert "tokens/s per stream" in text


@pytest.mark.needs("vllm-volta-fp8w")
def test_streams_past_the_kv_cache_wait_and_the_figures_are_for_those_that_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """At 128K context the KV cache of 2 x V100-32GB holds fewer sequences than --max-num-seqs
    8: the aggregate is for the sequences that decode together, not for 8."""
    args = ["qwen3.6-27b-fp8", "--gpus", "2", "--max-model-len", "131072"]
    _, plan = plan_json(capsys, *args, "--max-num-seqs", "8")
    streams = plan["streams"]
    held = streams["kv_sequences_at_context"]
    assert 1 < held < 8
    assert streams["served_streams"] == held
    assert [s["streams"] for s in streams["streams"]] == [1, held]
    # The same figures as planning with --max-num-seqs at what the cache holds.
    _, fitting = plan_json(capsys, *args, "--max-num-seqs", str(held))
    assert fitting["streams"]["streams"][-1]["tokens_per_second"] == pytest.approx(
        streams["streams"][-1]["tokens_per_second"], rel=0.02
    )
    assert main(["plan", *args, "--max-num-seqs", "8"]) == 0
    text = capsys.readouterr().out
    assert f"{held} streams:" in text
    assert "8 streams:" not in text
    assert (
        f"of --max-num-seqs 8 streams {held} decode together and the rest wait, so the figures "
        f"are for {held}, not 8"
    ) in text


def test_dialects_follow_the_adapters_families() -> None:
    """The planner names the families and the adapter's variables without importing the
    adapter: the same names, and a variable for each format a family runs itself on SM70."""
    dialects = {d.family: d for d in serve_module.DIALECTS}
    assert len(dialects) == len(serve_module.DIALECTS)
    for fam in families.FAMILIES:
        assert fam.name in dialects, f"no serve dialect for {fam.name}"
        env = dialects[fam.name].plugin_weights_env
        assert (env.get("fp8") == quantization.ENV_FP8_WEIGHTS) is fam.fp8_weights_on_sm70
        for method in quantization.AWQ_GPTQ_METHODS:
            assert (env.get(method) == quantization.ENV_AWQ_GPTQ_WEIGHTS) is fam.awq_gptq_on_sm70
