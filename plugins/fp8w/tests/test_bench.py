"""The benchmark's CPU-side parts (``benchmarks/fp8w_bench.py``): its correctness checks on tiny
layers under Triton's interpreter, vLLM's block-FP8 kernel taken from the venv's real
``fp8_utils.py`` by ``ast`` and run, the table's columns and targets, and the whole run on a
small layer with the GPU-only helpers swapped for CPU ones."""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
import types
from pathlib import Path

import fp8w_bench as bench
import pytest
import torch


def vllm_fp8_utils() -> Path | None:
    """The venv's vLLM ``fp8_utils.py``, found without importing vLLM (None without vLLM)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)))
    path = path / "model_executor" / "layers" / "quantization" / "utils" / "fp8_utils.py"
    return path if path.is_file() else None


needs_vllm = pytest.mark.skipif(vllm_fp8_utils() is None, reason="vLLM is not installed")
on_cpu = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the CPU interpreter run; the GPU runs the benchmark itself"
)


@needs_vllm
def test_vllm_kernel_and_default_config_come_from_the_file() -> None:
    """The kernel's source is the file's function with ``@triton.jit``; the default launch is
    the dict the file's launcher falls back to, the block sizes symbolic."""
    path = vllm_fp8_utils()
    assert path is not None
    text = path.read_text()
    src = bench.extract_kernel_source(text)
    assert src.startswith("@triton.jit\ndef _w8a8_triton_block_scaled_mm(")
    assert "accumulator += tl.dot(a, b)" in src
    config = bench.default_config_of(text)
    assert config["BLOCK_SIZE_N"] == "block_n"
    assert config["BLOCK_SIZE_K"] == "block_k"
    assert {"BLOCK_SIZE_M", "GROUP_SIZE_M", "num_warps", "num_stages"} <= set(config)
    vk = bench.load_vllm_kernel(path)
    assert vk.config_source.endswith("w8a8_triton_block_scaled_mm")
    assert not vk.notes
    # No tuned file for the benchmark's shapes: the default, with the checkpoint's block.
    launch, source = bench.vllm_config(vk, 16, 5120, 5120, (128, 128), "NVIDIA H200")
    assert source == "default"
    assert launch["BLOCK_SIZE_N"] == 128
    assert launch["BLOCK_SIZE_K"] == 128
    with pytest.raises(LookupError, match="no top-level function"):
        bench.extract_kernel_source("def f():\n    pass\n")
    with pytest.raises(LookupError, match=r"not a @triton\.jit"):
        bench.extract_kernel_source(f"def {bench.VLLM_KERNEL}():\n    pass\n")


def test_tuned_config_is_taken_beside_the_file(tmp_path: Path) -> None:
    """A tuned JSON in ``configs/`` beside the file wins, at the nearest token count."""
    vk = bench.VllmKernel(tmp_path / "fp8_utils.py", "0" * 64, None, {"BLOCK_SIZE_M": 64}, "t")
    (tmp_path / "configs").mkdir()
    name = "N=256,K=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    (tmp_path / "configs" / name).write_text(
        json.dumps({"1": {"BLOCK_SIZE_M": 16}, "64": {"BLOCK_SIZE_M": 64}})
    )
    assert bench.vllm_config(vk, 8, 256, 512, (128, 128), "NVIDIA H200") == (
        {"BLOCK_SIZE_M": 16},
        f"tuned {name}",
    )
    assert bench.vllm_config(vk, 50, 256, 512, (128, 128), "NVIDIA H200")[0]["BLOCK_SIZE_M"] == 64


@on_cpu
def test_self_check_runs_every_path_in_the_interpreter() -> None:
    """The benchmark's own checks on a tiny layer: ours (GEMV, GEMM, dequantize-then-cuBLAS),
    fp16, vLLM's kernel from the real file and ``_scaled_mm``, each against its reference;
    our dequantization is torch's bit for bit."""
    path = vllm_fp8_utils()
    result = bench.self_check("cpu", path, shapes=((192, 256),), ms=(1, 16, 40))
    assert result["failures"] == []
    for row in result["rows"]:
        assert row["dequant_exact"]
        for name in ("ours", "fp16", "deqmm", "smm") + (("vllm",) if path else ()):
            assert row[f"{name}_err"] <= bench.TOLERANCE, (name, row)


def test_checks_catch_a_wrong_or_unwritten_output() -> None:
    ref = torch.randn(4, 8)
    assert bench.rel_error(ref.half(), ref) < 1e-3
    assert bench.rel_error(bench.poisoned(4, 8, "cpu"), ref) == float("inf")
    assert bench.wrong({"ours_err": float("inf")}, "ours")
    assert bench.wrong({"ours_err": 0.5}, "ours")
    assert bench.wrong({"ours_error": "RuntimeError: x"}, "ours")
    assert not bench.wrong({"ours_err": 1e-4}, "ours")
    assert not bench.wrong({}, "vllm")  # not run is not wrong
    q, s = bench.quant_groups(torch.randn(3, 256).half())
    assert q.dtype == torch.float8_e4m3fn
    assert s.shape == (3, 2)


def _ctx(**kw) -> object:
    base = {
        "capability": (9, 0),
        "device_name": "NVIDIA H200",
        "copy_gbps": 4000.0,
        "vk": object(),
        "scaled": True,
        "mma": False,
        "notes": [],
    }
    return bench.Context(**{**base, **kw})


def test_rows_get_ratios_ceilings_estimate_and_targets() -> None:
    ctx = _ctx()
    shape = {"weight_bytes": 1000, "read_floor_gbps": 1200.0}
    row = {"n": 10, "k": 20, "m": 1, "path": "splitk", "ours_err": 1e-4, "ours_us": 1e-3}
    row.update(fp16_us=2e-3, vllm_us=4e-3, vllm_err=1e-3, smm_us=1e-3, smm_err=1e-3)
    bench.finish_row(row, shape, ctx)
    assert row["ours_x"] == pytest.approx(2.0)
    assert row["vllm_x"] == pytest.approx(0.5)
    assert row["bytes"] == 1000 + 2 * 20 + 2 * 10
    assert row["ours_gbps"] == pytest.approx(1060.0)  # 1060 bytes in 1e-3 us
    assert row["of_floor"] == pytest.approx(1060.0 / 1200.0)
    assert row["of_copy"] == pytest.approx(1060.0 / 4000.0)
    assert row["target_ok"]  # 2x fp16 and 88% of the floor
    assert row["sm70_path"] == "splitk"
    assert row["sm70_bound"] == "HBM"
    slow = {**row, "ours_us": 1.5e-3}
    del slow["target_ok"]
    bench.finish_row(slow, shape, ctx)
    assert slow["target_ok"] is False  # 1.33x fp16
    far = {**row}
    del far["target_ok"]
    bench.finish_row(far, {**shape, "read_floor_gbps": 1400.0}, ctx)
    assert far["target_ok"] is False  # 2x fp16, but 76% of the floor
    wrong = {**row, "ours_err": 0.5}
    bench.finish_row(wrong, shape, ctx)
    assert wrong["target_ok"] is False  # fast but wrong does not pass
    big = {"n": 10, "k": 20, "m": 2048, "path": "dequant_matmul", "ours_us": 1.0, "fp16_us": 0.9}
    bench.finish_row(big, shape, ctx)
    assert "of_floor" not in big  # only at M <= 8
    assert big["target_ok"]  # 0.9x >= 0.85x
    mid = {"n": 10, "k": 20, "m": 64, "path": "gemm", "ours_us": 1.0, "fp16_us": 1.0}
    bench.finish_row(mid, shape, ctx)
    assert "target" not in mid
    for c in (ctx, _ctx(vk=None, scaled=False)):
        lines = bench.table([row, slow, far, wrong, big, mid], c).splitlines()
        assert len({len(line) for line in lines}) == 1  # every column lines up
        md = bench.markdown_table([row, mid], c).splitlines()
        assert len({line.count("|") for line in md}) == 1
    line = bench.row_line(wrong, ctx)
    assert "!" in line
    assert line.split()[-1] == "FAIL"
    assert "vllm us" not in bench.table([row], _ctx(vk=None))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_refuses_to_run_without_cuda(tmp_path: Path) -> None:
    assert bench.main(["--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


@on_cpu
def test_whole_run_on_a_small_layer(monkeypatch, tmp_path: Path, capsys) -> None:
    """``run`` end to end on one small layer under the interpreter, as on a Hopper GPU (the
    GPU-only helpers swapped for CPU ones): every path checked and timed, the JSON and the
    markdown written, the table printed last."""
    import volta_devkit.bench as harness
    import volta_devkit.read_floor as floor_mod

    def timed(fn, sets):
        begin = time.perf_counter()
        for args in sets:
            fn(*args)
        return (time.perf_counter() - begin) * 1e6 / len(sets)

    floor = types.SimpleNamespace(median_ms=0.01, gbps=100.0, best="b")
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "timed_us", timed)
    monkeypatch.setattr(bench, "rotation", lambda nbytes: 2)
    monkeypatch.setattr(floor_mod, "read_floor", lambda srcs: floor)
    monkeypatch.setattr(harness, "measure_copy_bandwidth", lambda: (3000.0, None))
    env = {"driver": "-", "torch": torch.__version__, "triton": "-", "cuda_runtime": None}
    monkeypatch.setattr(harness, "environment", lambda: dict(env))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H200")
    args = argparse.Namespace(out=tmp_path, vllm_fp8_utils=vllm_fp8_utils(), mma=False)
    assert bench.run(((160, 256),), (1, 16), args) == 0
    record = json.loads((tmp_path / "fp8w_bench.json").read_text())
    assert [r["m"] for r in record["rows"]] == [1, 16]
    paths = ("ours", "fp16", "deqmm", "smm") + (("vllm",) if args.vllm_fp8_utils else ())
    for row in record["rows"]:
        for name in paths:
            assert row[f"{name}_err"] <= bench.TOLERANCE, (name, row)
            assert row[f"{name}_us"] > 0, (name, row)
    assert record["shapes"][0]["dequant_exact"]
    assert "all paths correct" in record["summary"]
    assert (tmp_path / "fp8w_bench.md").read_text().startswith("# fp8w benchmark, NVIDIA H200")
    out = capsys.readouterr().out.splitlines()
    assert out[-1].split()[:3] == ["160", "256", "16"]


def test_sweep_times_prefill_tiles_alone_from_prefill_m() -> None:
    """From ``PREFILL_M`` tokens the sweep times the tiled GEMM's prefill tiles only (the
    rivals of dequantize-then-cuBLAS), each once; below it no tile of more than 32 rows."""
    from volta_fp8w.tables import GEMM

    prefill = bench.sweep_candidates(bench.PREFILL_M)
    assert prefill
    assert len(set(prefill)) == len(prefill)
    assert {launch.path for launch in prefill} == {GEMM}
    assert min(launch.block_m for launch in prefill) >= 64
    assert {launch.num_stages for launch in prefill} == {3, 4}
    assert max(launch.block_m for launch in bench.sweep_candidates(bench.PREFILL_M - 1)) == 32
