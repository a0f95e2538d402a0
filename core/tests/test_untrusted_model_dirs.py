"""``plan`` and ``doctor`` on a model directory or vLLM install built to hurt them.

Each hostile input of the README's "Reliability" section is one line on stderr and exit 2 (or,
for the doctor, a report row) within seconds: integers past their bounds, JSON past its size cap
or Python's integer limit, shard paths leaving the directory, patterns that backtrack without
end, FIFOs and corrupt ELF headers among vLLM's libraries, a vLLM package without metadata.
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from volta_core.cli import main
from volta_core.doctor import checks as doctor
from volta_core.doctor import fatbin
from volta_core.doctor.checks import GpuProbe, Status
from volta_core.errors import UsageError
from volta_core.host.checkpoint import ignore_match_budget, is_ignored
from volta_core.host.types import QuantConfig
from volta_core.planner.model_files import MAX_CONFIG_BYTES, MAX_INDEX_BYTES

BASE: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "tiny-qwen3.json").read_text())
NO_GPU = GpuProbe(None, reason="no NVML in this test")
#: How long any hostile input may take to be refused, in-process (CI is slow and shared).
SECONDS = 10


def plan_fails_fast(
    capsys: pytest.CaptureFixture[str], target: Path, code: int = 2, *argv: str
) -> str:
    """Run ``plan target``; assert one line on stderr, exit ``code``, and little time."""
    start = time.monotonic()
    result = main(["plan", str(target), *argv])
    elapsed = time.monotonic() - start
    out, err = capsys.readouterr()
    assert (result, out) == (code, ""), err
    assert err.count("\n") == 1, err
    assert "internal error" not in err
    assert elapsed < SECONDS
    return err


def write_config(folder: Path, text: str | None = None, **changes: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.json"
    config.write_text(text if text is not None else json.dumps({**BASE, **changes}))
    return folder


def safetensors(path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))


@pytest.mark.parametrize(
    ("changes", "raw", "message"),
    [
        ({"num_hidden_layers": 10**9}, None, "num_hidden_layers 1000000000 is above 1024"),
        ({"vocab_size": 2**40}, None, "vocab_size 1099511627776 is above 16777216"),
        ({}, '"num_hidden_layers": 1e1000', "num_hidden_layers must be an integer, got inf"),
        ({}, '"x": ' + "9" * 4400, "a JSON integer of 4400 digits"),
        ({}, '"x": ' + "[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
        ({"per_layer_config": {"layer": {}}}, None, "per_layer_config key 'layer' is not"),
        ({"vision_config": {"depth": 10**12}}, None, "vision_config.depth must be at most"),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": ["a", 1]}},
            None,
            "weight_block_size must be two positive integers",
        ),
        (
            {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": "x"}},
            None,
            "group_size must be an integer from -1",
        ),
        (
            {"quantization_config": {"quant_method": "fp8", "modules_to_not_convert": 5}},
            None,
            "modules_to_not_convert must be a list of strings",
        ),
    ],
)
def test_values_past_their_bounds_or_malformed_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    changes: dict[str, Any],
    raw: str | None,
    message: str,
) -> None:
    text = None
    if raw is not None:
        text = json.dumps({**BASE, "num_hidden_layers": 0}).replace('"num_hidden_layers": 0', raw)
    folder = write_config(tmp_path / "model", text, **changes)
    assert message in plan_fails_fast(capsys, folder)


def test_oversized_json_is_refused_unread(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    big = tmp_path / "big"
    big.mkdir()
    with (big / "config.json").open("wb") as handle:  # sparse: 8 GiB that take no disk
        handle.truncate(8 * 2**30)
    assert f"larger than {MAX_CONFIG_BYTES // 2**20} MiB" in plan_fails_fast(capsys, big)
    model = write_config(tmp_path / "model")
    safetensors(model / "model.safetensors")
    with (model / "model.safetensors.index.json").open("wb") as handle:
        handle.truncate(MAX_INDEX_BYTES + 1)
    assert f"larger than {MAX_INDEX_BYTES // 2**20} MiB" in plan_fails_fast(capsys, model)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "link.safetensors"])
def test_shards_outside_the_model_directory_are_never_opened(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, shard: str
) -> None:
    model = write_config(tmp_path / "model")
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    (model / "link.safetensors").symlink_to(outside)
    index = {"weight_map": {"w": shard}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    err = plan_fails_fast(capsys, model)
    assert "resolves outside the model directory" in err
    assert str(struct.unpack("<Q", b"root:x:0")[0]) not in err
    (model / "model.safetensors.index.json").unlink()  # no index: the links found are checked
    if shard == "link.safetensors":
        assert "resolves outside" in plan_fails_fast(capsys, model)


def test_a_hugging_face_cache_snapshot_reads_its_blobs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The hub cache links ``snapshots/<revision>/*`` to ``../../blobs``: that is allowed."""
    repo = tmp_path / "models--org--tiny"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (blobs / "c0ffee").write_text(json.dumps(BASE))
    safetensors(blobs / "beef")
    (snapshot / "config.json").symlink_to("../../blobs/c0ffee")
    (snapshot / "model.safetensors").symlink_to("../../blobs/beef")
    assert main(["plan", str(snapshot), "--json"]) in (0, 1)
    assert "checkpoint safetensors headers (1 tensors, 1 files)" in capsys.readouterr().out


def test_a_config_json_linked_out_of_its_directory_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    elsewhere = write_config(tmp_path / "elsewhere")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").symlink_to(elsewhere / "config.json")
    assert "resolves outside the model directory" in plan_fails_fast(capsys, model)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("re:(.+)+x", "a repetition of a group that itself repeats"),
        ("re:(a|ab)*c", "a repetition of a group that itself repeats or alternates"),
        ("re:.*.*.*.*x", "4 variable-length repetitions"),
        ("re:(\\w+)\\1", "a backreference"),
        ("re:" + "a" * 300, "longer than 256 characters"),
    ],
)
def test_patterns_that_backtrack_without_bound_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, pattern: str, why: str
) -> None:
    quant = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8}}},
        "ignore": ["lm_head", pattern],
    }
    folder = write_config(tmp_path / "model", quantization_config=quant)
    err = plan_fails_fast(capsys, folder)
    assert "quantization_config.ignore[1]" in err
    assert why in err


def test_pattern_matching_stops_at_the_commands_time_budget() -> None:
    config = QuantConfig("compressed-tensors", {"ignore": ["re:.*.*.*x"]})
    assert not is_ignored(config, "model.layers.0.mlp.down_proj")
    with ignore_match_budget(0.0), pytest.raises(UsageError, match="takes too long"):
        is_ignored(config, "model.layers.0.mlp.down_proj")


# -- doctor ---------------------------------------------------------------------------------


def elf_header(shoff: int, shnum: int = 1, shstrndx: int = 0) -> bytes:
    """A 64-bit little-endian ELF header pointing its section table at ``shoff``."""
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    head = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, shnum, 0)
    return head[:0x3E] + struct.pack("<H", shstrndx)


def hostile_libraries(package: Path) -> None:
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('the doctor must not import vllm')\n")
    os.mkfifo(package / "_fifo.so")
    (package / "_far.so").write_bytes(elf_header(2**63 + 64))
    # One section (the name table itself) claiming 2**62 bytes at offset 128.
    table = struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, 128, 2**62, 0, 0, 1, 0)
    (package / "_names.so").write_bytes(elf_header(64) + table)


@pytest.mark.timeout(60)
def test_doctor_survives_fifos_and_hostile_elf_headers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from volta_core.vllm import families

    hostile_libraries(tmp_path / "site" / "vllm")
    monkeypatch.setattr(families, "installed_vllm", lambda: ("vllm", "0.19.1"))
    monkeypatch.setattr(doctor, "package_dirs", lambda name: [tmp_path / "site" / "vllm"])
    start = time.monotonic()
    rows = doctor.check_vllm(NO_GPU)
    assert time.monotonic() - start < SECONDS
    kernels = next(r for r in rows if r.name == "vllm kernels")
    assert kernels.notes == (
        "_far.so: unreadable: truncated file: wanted 64 bytes at offset 9223372036854775872",
        "_names.so: unreadable: ELF section-name table of 4611686018427387904 bytes is corrupt",
    )
    with pytest.raises(fatbin.FatbinError, match="not a regular file"):
        fatbin.read_entries(tmp_path / "site" / "vllm" / "_fifo.so")


def test_doctor_reports_a_vllm_package_without_metadata(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from volta_core.vllm import families

    package = tmp_path / "site" / "vllm"
    package.mkdir(parents=True)
    monkeypatch.setattr(families, "installed_vllm", lambda: None)
    monkeypatch.setattr(doctor, "package_dirs", lambda name: [package])
    row = doctor.check_vllm(NO_GPU)[0]
    assert (row.name, row.status) == ("vllm", Status.INFO)
    assert "has no distribution metadata" in row.detail
    assert row.fix == doctor.SUPPORTED_VLLM_FIX


def test_doctor_model_is_read_as_plan_reads_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = write_config(tmp_path / "model", num_attention_heads=10**9)
    assert main(["doctor", "--model", str(folder)]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1
    assert "num_attention_heads 1000000000 is above 1024" in err
