"""The vllm-volta command: plugins, plan on every bundled example, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from volta_core.cli import main
from volta_core.host.discovery import get_plugin_manager
from volta_core.planner.model import example_names

EXAMPLES = example_names()
#: The plugin that serves each example's quantized weights on compute capability 7.0: without
#: it the plan reports the engine's refusal and exits 1 (the core's own run installs no plugin).
WEIGHTS_PLUGIN = {
    "dense-40b-fp8": "vllm-volta-fp8w",
    "qwen3.6-27b-fp8": "vllm-volta-fp8w",
    "qwen3.5-27b-w4a16": "vllm-volta-ct-wna16",
    "qwen3-8b-fp8-kv-per-head": "vllm-volta-ct-wna16",
    "qwen3-8b-fp8-kv-per-tensor": "vllm-volta-ct-wna16",
}


def served(example: str) -> object:
    """``example`` as a parameter, skipped where the plugin serving its weights is missing."""
    needs = WEIGHTS_PLUGIN.get(example)
    return pytest.param(example, marks=[pytest.mark.needs(needs)] if needs else [])


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def fresh_plugin_manager() -> Iterator[None]:
    """Each test discovers the plugins anew: a plugin one test disables stays out of the next."""
    get_plugin_manager.cache_clear()
    yield
    get_plugin_manager.cache_clear()


def test_bundled_examples_cover_the_required_shapes() -> None:
    assert {
        "gemma-4-dual-head",
        "qwen3.5-27b-w4a16",
        "qwen3.6-27b-fp8",
        "qwen3-8b-fp8-kv-per-tensor",
        "qwen3-8b-fp8-kv-per-head",
    } <= set(EXAMPLES)


@pytest.mark.parametrize("example", [served(e) for e in EXAMPLES])
def test_plan_prints_a_complete_plan(capsys: pytest.CaptureFixture[str], example: str) -> None:
    code, out, _ = run_cli(capsys, "plan", example)
    assert code == 0, out
    assert out.startswith(f"vllm-volta plan: example {example}")
    for section in ("attention (", "kv cache: --kv-cache-dtype auto", "bytes per token:"):
        assert section in out
    assert "problems: none" in out
    assert "-> NONE" not in out


def test_plan_json_for_dual_head_size_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "plan", "gemma-4-dual-head", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["device"] == "sm_70"
    assert plan["dtype"] == "float16"
    layers = plan["attention"]
    assert len(layers) == 60
    sizes = {(row["type"], row["head_size"]) for row in layers}
    assert sizes == {("sliding_attention", 256), ("full_attention", 512)}
    assert all(row["backend"] for row in layers)
    kv = plan["kv_cache"]
    # 50 sliding layers x 16 KV heads x 2 x 256 + 10 global x 16 x 2 x 512, 2 bytes each.
    assert kv["bytes_per_token"] == (50 * 16 * 2 * 256 + 10 * 16 * 2 * 512) * 2


@pytest.mark.needs("vllm-volta-ct-wna16")
def test_plan_quantization_of_a_weight_only_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "plan", "qwen3.5-27b-w4a16", "--json")
    assert code == 0
    plan = json.loads(out)
    decisions = {row["module"].rsplit(".", 1)[-1]: row["decision"] for row in plan["quant"]}
    assert decisions["lm_head"] == "unquantized (in the checkpoint's ignore list)"
    assert decisions["in_proj_ba"] == "unquantized (in the checkpoint's ignore list)"
    assert decisions["attn"] == "no KV-cache method (weight-only checkpoint)"
    linear_layers = [row for row in plan["attention"] if row["type"] == "linear_attention"]
    assert len(linear_layers) == 48
    assert all(row["backend"] is None for row in linear_layers)
    assert plan["kv_cache"]["checkpoint_scales"] == "none"


@pytest.mark.parametrize(
    ("example", "scales"),
    [
        ("qwen3-8b-fp8-kv-per-tensor", "per_tensor"),
        ("qwen3-8b-fp8-kv-per-head", "per_attention_head"),
    ],
)
def test_plan_reads_kv_cache_schemes(
    capsys: pytest.CaptureFixture[str], example: str, scales: str
) -> None:
    _, out, _ = run_cli(capsys, "plan", example, "--json")
    kv = json.loads(out)["kv_cache"]
    assert kv["checkpoint_scales"] == scales
    assert kv["calibrated_for"] == "fp8_e4m3"


def test_fp8_kv_stores_half_the_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_cli(
        capsys, "plan", "qwen3.5-27b-w4a16", "--kv-cache-dtype", "fp8_e5m2", "--json"
    )
    kv = json.loads(out)["kv_cache"]
    # 16 full-attention layers x 4 KV heads x (256 + 256) bytes.
    assert kv["bytes_per_token"] == 16 * 4 * 512
    assert 2 * kv["bytes_per_token"] == kv["bytes_per_token_in_activation_dtype"]


def test_plan_of_a_model_directory_and_tensor_parallel(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = json.loads((Path(__file__).parent / "data" / "tiny-qwen3.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, _ = run_cli(capsys, "plan", str(tmp_path), "--json", "-tp", "2")
    assert code == 0
    plan = json.loads(out)
    assert plan["tensor_parallel_size"] == 2
    assert plan["kv_cache"]["bytes_per_token"] == 2 * 2 * 2 * 64 * 2
    code, out, _ = run_cli(capsys, "plan", str(tmp_path / "config.json"), "-tp", "3")
    assert code == 1
    assert "4 attention heads do not divide across 3 ranks" in out


@pytest.mark.needs("vllm-volta-test-healthy")
def test_plan_reports_unrunnable_layers_with_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    # A declared backend (the healthy test plugin's) that admits none of the model's layers.
    code, out, _ = run_cli(
        capsys, "plan", "gemma-4-dual-head", "--attention-backend", "TEST_HEALTHY_ATTN"
    )
    assert code == 1
    problems = out.split("problems:\n")[1].split("\n\n")[0].splitlines()
    assert len(problems) == 2
    assert problems[0].startswith("  - layers 0-4, 6-10, ")
    assert "no attention backend can run head size 256" in problems[0]
    assert problems[1].startswith("  - layers 5, 11, ")
    assert "no attention backend can run head size 512" in problems[1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "/no/such/dir"], "no such file or directory"),
        (["plan", "no-such-example"], "is not a path nor a bundled example"),
        (["plan", "gemma-4-dual-head", "--device", "volta"], "unknown device 'volta'"),
        (["plan", "gemma-4-dual-head", "--dtype", "fp17"], "unknown --dtype 'fp17'"),
        (["plan", "gemma-4-dual-head", "--kv-cache-dtype", "int3"], "unknown --kv-cache-dtype"),
        (
            ["plan", "gemma-4-dual-head", "--dtype", "bfloat16"],
            "bfloat16 is not supported on sm_70",
        ),
        (["plan"], "the following arguments are required: model"),
        (["frobnicate"], "invalid choice"),
        (
            ["plan", "gemma-4-dual-head", "--attention-backend", "NO_SUCH_BACKEND"],
            "unknown --attention-backend 'NO_SUCH_BACKEND' (one of: ",
        ),
        (["plan", "/dev/null"], "/dev/null: not a regular file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("vllm-volta: error: ")
    assert message in err


def test_malformed_and_non_object_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": ')
    code, _, err = run_cli(capsys, "plan", str(bad))
    assert code == 2
    assert "malformed JSON at line 1" in err
    bad.write_text("[1, 2]")
    code, _, err = run_cli(capsys, "plan", str(tmp_path))
    assert code == 2
    assert "must hold a JSON object" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "plan", str(tmp_path / "empty"))
    assert code == 2
    assert "has no config.json" in err


def test_console_script_bad_input_has_no_traceback() -> None:
    exe = Path(sys.executable).with_name("vllm-volta")
    done = subprocess.run([str(exe), "plan", "missing.json"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert (
        done.stderr.strip().splitlines()[-1]
        == "vllm-volta: error: missing.json: no such file or directory"
    )


@pytest.mark.needs("vllm-volta-test-healthy")
def test_plugins_lists_status_version_and_what_each_provides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "plugins", "--json")
    assert code == 0
    records = {r["name"]: r for r in json.loads(out)}
    healthy = records["test_healthy"]
    assert (healthy["status"], healthy["version"]) == ("loaded", "0.0.1")
    assert healthy["provides"]["attention backend"] == ["TEST_HEALTHY_ATTN"]
    assert "volta_kv_cache_verdict" in healthy["hooks"]
    assert records["test_broken"]["status"] == "failed"
    assert records["test_future_api"]["status"] == "refused"
    assert records["test_garbage_declarations"]["status"] == "failed"
    assert records["a_test_clash"]["status"] == records["zz_test_clash"]["status"] == "failed"
    code, out, err = run_cli(capsys, "plugins")
    assert code == 0
    assert "test_healthy  vllm-volta-test-healthy 0.0.1  loaded" in out
    assert "reason: import failed: ImportError" in out
    assert (
        "reason: failed in volta_attention_backends: volta_attention_backends returned str" in out
    )
    assert "Traceback" not in err


@pytest.mark.needs("vllm-volta-attn-v100")
def test_plan_judges_1cats_flash_attn_v100_when_named(capsys: pytest.CaptureFixture[str]) -> None:
    """1Cat-vLLM's own V100 backend is a name ``--attention-backend`` takes (not a typo): every
    layer goes to it where its kernels have the head size; Gemma-4's 512-dim layers are a
    problem naming it (1Cat's validation would let them reach a kernel without a 512 path)."""
    code, out, _ = run_cli(
        capsys, "plan", "gemma-4-dual-head", "--attention-backend", "FLASH_ATTN_V100", "--json"
    )
    plan = json.loads(out)
    assert code == 1
    backends = {(layer["head_size"], layer["backend"]) for layer in plan["attention"]}
    assert (256, "FLASH_ATTN_V100") in backends
    assert all(backend is None for size, backend in backends if size == 512)
    assert any("FLASH_ATTN_V100: head size 512" in p for p in plan["problems"])
    code, out, _ = run_cli(capsys, "plan", "gemma-4-dual-head", "--json")
    assert code == 0
    assert {layer["backend"] for layer in json.loads(out)["attention"]} == {"VOLTA_ATTN_V100"}
