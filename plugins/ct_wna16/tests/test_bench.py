"""The benchmark's CPU-side parts: its SM70 model, its sweep summary, and its refusal without
a GPU."""

from __future__ import annotations

from dataclasses import asdict

import ct_wna16_bench as bench
import pytest
import torch
from ct_wna16_checkpoints import fresh_checkpoint

from volta_ct_wna16.launch import DEQUANT_MATMUL, Launch
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import choose


def test_sm70_estimate_follows_the_path_sm70_takes() -> None:
    n, k = 256, 512
    pw = fresh_checkpoint(n, k, WeightScheme(4, True, 128)).packed("b")
    seconds, bound = bench.sm70_estimate(1, n, k, pw)
    assert bound == "memory"
    assert seconds == pytest.approx((pw.nbytes() + 2 * k + 2 * n) / bench.V100_BANDWIDTH)
    assert bench.sm70_estimate(4, n, k, pw)[1] == "memory"
    # 8-256 tokens: the tensor cores (a V100 with NVRTC), bound by bytes, then by products.
    assert bench.sm70_estimate(8, n, k, pw)[1] == "memory (tensor cores)"
    seconds, bound = bench.sm70_estimate(256, n, k, pw)
    assert bound == "tensor cores"
    assert seconds == pytest.approx(2 * 256 * n * k / bench.V100_TENSOR_FLOPS)
    assert choose(2048, 256, (7, 0), 4).path == DEQUANT_MATMUL
    assert bench.sm70_estimate(2048, n, k, pw)[1] == "dequant+cuBLAS"


def test_mma_benchmark_rows_set_the_estimates_side_by_side() -> None:
    import ct_wna16_mma_bench as mma_bench

    n, k = 27648, 5120
    pw_bytes = fresh_checkpoint(64, k, WeightScheme(4, True, 128)).packed("b").nbytes() * n // 64
    for m, table_path in ((16, "splitk"), (64, "dequant_matmul")):
        est = mma_bench.estimates(m, n, k, pw_bytes)
        assert est["sm70_table_path"] == table_path
        assert est["sm70_mma_us"] <= 0.5 * est["sm70_dot_us"]
        assert est["sm70_mma_us"] < est["sm70_table_us"]
    row = {
        "n": n,
        "k": k,
        "m": 16,
        "symmetric": True,
        "mma_us": 900.0,
        "mma_max_rel_error": 1e-4,
        "triton_us": 40.0,
        "triton_path": "splitk",
        "fp16_us": 100.0,
        **mma_bench.estimates(16, n, k, pw_bytes),
    }
    assert len(mma_bench.line(row)) == len(mma_bench.HEADER)  # one column per heading


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_mma_benchmark_refuses_to_run_without_cuda(tmp_path) -> None:
    import ct_wna16_mma_bench as mma_bench

    assert mma_bench.main(["--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_refuses_to_run_without_cuda(tmp_path) -> None:
    assert bench.main(["--out", str(tmp_path)]) == 2


def _row(us: float, err: float, table: bool, launch: Launch) -> dict:
    return {
        "n": 256,
        "k": 512,
        "m": 1,
        "symmetric": True,
        "table": table,
        "launch": asdict(launch),
        "fp16_us": 20.0,
        "max_rel_error": err,
        "us": us,
        "speedup": 20.0 / us,
        "copy_fraction": 0.5,
        "correct": err <= bench.SWEEP_TOLERANCE,
    }


def test_best_of_sweep_takes_the_fastest_correct_launch() -> None:
    shipped, fast, wrong = bench.sweep_candidates(1)[:3]
    rows = [_row(10.0, 1e-3, True, shipped), _row(8.0, 2e-3, False, fast)]
    rows.append(_row(2.0, 0.5, False, wrong))
    assert "WRONG" in bench.sweep_line(rows[2])
    best = bench.best_of_sweep(rows).splitlines()[-1]
    assert bench.launch_label(fast) in best
    assert "10.0" in best  # the table's launch, beside the best
    assert "2.5" in best  # 20 us of fp16 over 8 us


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_moe_benchmark_refuses_to_run_without_cuda(tmp_path) -> None:
    import ct_wna16_moe_bench as bench_moe

    assert bench_moe.main(["--out", str(tmp_path)]) == 2
    assert not list(tmp_path.iterdir())


def test_moe_benchmark_rows_put_the_read_floor_beside_the_kernels() -> None:
    """A decode row prints its two-launch and one-launch read floors and the kernels' time over
    the two-launch floor; a row without floors (more than 16 tokens) prints dashes there."""
    import ct_wna16_moe_bench as bench_moe

    row = {
        "model": "Qwen3.5-35B-A3B", "symmetric": True, "m": 1, "launch": "rows",
        "distinct_experts": 8.0, "routed_bytes": 13.0e6, "step_us": 23.1, "kernels_us": 17.4,
        "copy_fraction": 0.248, "step_copy_fraction": 0.187, "tflops": 0.1,
        "cublas_fraction": 0.0, "sm70_estimate_us": 14.4, "floor2_us": 8.7, "floor1_us": 6.2,
    }  # fmt: skip
    columns = bench_moe.line(row).split()
    assert columns[-3:] == ["8.7", "6.2", "2.00"]
    assert len(bench_moe.line(row)) == len(bench_moe.HEADER)  # the columns line up
    del row["floor2_us"], row["floor1_us"]
    assert bench_moe.line(row).split()[-3:] == ["-", "-", "-"]
