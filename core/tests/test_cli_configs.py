"""``vllm-volta plan`` on malformed configs and misbehaving plugins: never a traceback.

Bad input (a config of the wrong types, unreadable, or not a file) is one line on stderr and
exit 2; a config the engine would refuse is a plan whose problems name the field and the file,
exit 1; a plugin failing in a hook is a problem line naming the plugin and the hook, exit 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from volta_core.cli import main
from volta_core.host.discovery import get_plugin_manager

#: A tiny valid Qwen3 config, shared by the CLI tests (``data/tiny-qwen3.json``).
BASE: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "tiny-qwen3.json").read_text())

CT_W4: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
        }
    },
    "ignore": ["lm_head"],
}


@pytest.fixture(autouse=True)
def fresh_plugin_manager() -> Iterator[None]:
    get_plugin_manager.cache_clear()
    yield
    get_plugin_manager.cache_clear()


def _config(tmp_path: Path, **changes: Any) -> Path:
    config = {k: v for k, v in {**BASE, **changes}.items() if v is not ...}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def _ct(**weights: Any) -> dict[str, Any]:
    group = {**CT_W4["config_groups"]["group_0"]}
    group["weights"] = {**group["weights"], **weights}
    return {**CT_W4, "config_groups": {"group_0": group}}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_hidden_layers": "two"}, "num_hidden_layers must be an integer, got 'two'"),
        ({"num_attention_heads": 4.5}, "num_attention_heads must be an integer"),
        ({"num_key_value_heads": True}, "num_key_value_heads must be an integer"),
        ({"head_dim": "64"}, "head_dim must be an integer"),
        ({"quantization_config": "fp8"}, "quantization_config must be a JSON object"),
        ({"quantization_config": {**CT_W4, "ignore": ["re:["]}}, "'re:[' is refused: not a valid"),
        ({"quantization_config": {**CT_W4, "ignore": "lm_head"}}, "ignore must be a list"),
        ({"quantization_config": {**CT_W4, "config_groups": []}}, "config_groups must be"),
        ({"layer_types": "full_attention"}, "layer_types must be a list of strings"),
        ({"sliding_window": "4096"}, "sliding_window must be an integer or null"),
        ({"text_config": [1]}, "text_config must be a JSON object"),
        ({"architectures": "Qwen3ForCausalLM"}, "architectures must be a list of strings"),
        ({"model_type": "qwen33"}, "unknown model_type 'qwen33' (closest: qwen3"),
        ({"model_type": 3}, "model_type must be a string"),
    ],
)
def test_config_of_the_wrong_types_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    path = _config(tmp_path, **changes)
    code, out, err = run_cli(capsys, "plan", str(path))
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1, err
    assert err.startswith(f"vllm-volta: error: {path}: ")
    assert message in err
    assert len(err) < 300


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"num_attention_heads": 0}, "num_attention_heads must be at least 1, got 0"),
        ({"num_attention_heads": -4}, "num_attention_heads must be at least 1, got -4"),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide num_attention_heads 4"),
        ({"num_key_value_heads": 0}, "num_key_value_heads must be at least 1"),
        ({"num_attention_heads": ...}, "num_attention_heads is missing"),
        ({"hidden_size": ...}, "hidden_size is missing"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be at least 1, got 0"),
        ({"head_dim": ..., "num_attention_heads": 3, "num_key_value_heads": 1}, "not divisible"),
        ({"layer_types": ["full_attention"]}, "layer_types has 1 entries for 2 layers"),
        ({"quantization_config": {"quant_method": "frobnicate"}}, "quant_method 'frobnicate'"),
        ({"quantization_config": {"bits": 4}}, "quantization_config has no quant_method"),
        ({"quantization_config": _ct(num_bits=3)}, "3-bit int weights"),
        ({"quantization_config": _ct(group_size=48)}, "group size 48"),
    ],
)
def test_config_the_engine_refuses_is_a_problem_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, changes: dict[str, Any], problem: str
) -> None:
    path = _config(tmp_path, **changes)
    code, out, err = run_cli(capsys, "plan", str(path))
    assert code == 1, out + err
    assert err == ""
    problems = out.split("problems:\n")[1]
    assert problem in problems
    assert str(path) in problems


def test_a_sliding_window_of_null_plans_as_full_attention(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _config(
        tmp_path, layer_types=["sliding_attention", "full_attention"], sliding_window=None
    )
    code, out, err = run_cli(capsys, "plan", str(path))
    assert (code, err) == (0, ""), out + err
    assert "sliding_window is null" in out


@pytest.mark.needs("vllm-volta-ct-wna16")
def test_valid_compressed_tensors_config_has_no_problem(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run_cli(capsys, "plan", str(_config(tmp_path, quantization_config=CT_W4)))
    assert code == 0, out
    assert "problems: none" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe\x00{", "not UTF-8 text"),
        (bytes(range(256)), "not UTF-8 text"),
        (b"", "malformed JSON"),
    ],
)
def test_unreadable_config_bytes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    code, out, err = run_cli(capsys, "plan", str(path))
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert message in err


def test_symlink_loop_and_fifo_get_accurate_messages(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    code, _, err = run_cli(capsys, "plan", str(loop))
    assert code == 2
    assert "symbolic link loop" in err
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    code, _, err = run_cli(capsys, "plan", str(fifo))
    assert code == 2
    assert "not a regular file" in err
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "config.json").symlink_to(tmp_path / "dir" / "config.json")
    code, _, err = run_cli(capsys, "plan", str(tmp_path / "dir"))
    assert code == 2
    assert "symbolic link loop" in err


@pytest.mark.needs("vllm-volta-test-raising", "vllm-volta-test-garbage")
@pytest.mark.parametrize("method", ["test-raising", "test-garbage"])
def test_a_plugin_failing_at_plan_time_is_a_problem_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, method: str
) -> None:
    """The test plugin raises (or answers garbage) in its KV verdict for this checkpoint."""
    path = _config(tmp_path, quantization_config={"quant_method": method})
    code, out, err = run_cli(capsys, "plan", str(path))
    assert code == 1, out
    plugin = "test_raising" if method == "test-raising" else "test_garbage_answers"
    problems = out.split("problems:\n")[1]
    assert f"plugin {plugin!r}" in problems
    assert "volta_kv_cache_verdict" in problems
    # The rest of the plan is there: every layer has its backend.
    assert "attention (2 layers)" in out
    assert "-> NONE" not in out
    assert "Traceback" not in err


@pytest.mark.needs("vllm-volta-test-raising")
def test_strict_plugin_failure_at_plan_time_is_an_error_naming_plugin_and_hook(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_VOLTA_STRICT", "1")
    monkeypatch.setenv("VLLM_VOLTA_PLUGINS", "test_raising")
    path = _config(tmp_path, quantization_config={"quant_method": "test-raising"})
    code, _, err = run_cli(capsys, "plan", str(path))
    assert code == 1
    assert "'test_raising'" in err
    assert "volta_kv_cache_verdict" in err


@pytest.mark.parametrize(("value", "code"), [(",", 2), ("reasoning,nope", 0)])
def test_plugin_filter_naming_nothing_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: str, code: int
) -> None:
    monkeypatch.setenv("VLLM_VOLTA_PLUGINS", value)
    got, _, err = run_cli(capsys, "plugins")
    assert got == code, err
    monkeypatch.setenv("VLLM_VOLTA_STRICT", "1")
    get_plugin_manager.cache_clear()
    got, _, err = run_cli(capsys, "plugins")
    assert got == 2 if value == "," else got == 1, err
    assert err.count("\n") == 1


def test_torch_free_plan_prints_nothing_on_stderr() -> None:
    """transformers' "PyTorch was not found" advice is not the project's line to print."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from volta_core.cli import main\n"
        "sys.exit(main(['plan', 'gemma-4-dual-head']))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_VOLTA")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_a_vllm_backend_the_host_does_not_declare_is_a_problem_not_a_typo(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(
        capsys, "plan", "qwen3-8b-fp8-kv-per-head", "--attention-backend", "FLASH_ATTN"
    )
    assert (code, err) == (1, "")
    assert "'FLASH_ATTN' is not declared" in out
