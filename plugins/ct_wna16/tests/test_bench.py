"""The benchmark's CPU-side parts: its SM70 model, its sweep summary, and its refusal without
a GPU."""

from __future__ import annotations

from dataclasses import asdict

import ct_wna16_bench as bench
import pytest
import torch
from ct_wna16_checkpoints import fresh_checkpoint

from volta_core.kernel_api import V100_RATES
from volta_ct_wna16.dispatch import table_launch
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import DEQUANT_MATMUL, Launch


def test_sm70_estimate_follows_the_path_sm70_takes() -> None:
    n, k = 256, 512
    pw = fresh_checkpoint(n, k, WeightScheme(4, True, 128)).packed("b")
    seconds, bound = bench.sm70_estimate(1, n, k, pw)
    assert bound == "memory"
    assert seconds == pytest.approx((pw.nbytes() + 2 * k + 2 * n) / V100_RATES.bandwidth)
    assert bench.sm70_estimate(4, n, k, pw)[1] == "memory"
    # 8-256 tokens: the tensor cores (a V100 with NVRTC), bound by bytes, then by products.
    assert bench.sm70_estimate(8, n, k, pw)[1] == "memory (tensor cores)"
    seconds, bound = bench.sm70_estimate(256, n, k, pw)
    assert bound == "tensor cores"
    assert seconds == pytest.approx(2 * 256 * n * k / V100_RATES.tensor_flops)
    assert table_launch(2048, 256, None, 4, (7, 0)).path == DEQUANT_MATMUL
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


def test_moe_prefill_launcher_and_dense_reference_compute_the_layer(
    monkeypatch, kernel_device: str
) -> None:
    """The prefill benchmark's computations of the layer against float64: its launcher of the
    routed-blocks kernel with ``SLOT_DOTS`` off, unswapped and swapped (``Launch.swap``), each
    also with the scales loaded per word row (every buffer they and the routing allocate with
    ``torch.empty`` poisoned), and the library's launch of SM90's two tiles (the large one
    swapped), all inside the benchmark's step; and the padded per-expert rows its cuBLAS
    reference times."""
    from dataclasses import replace

    import ct_wna16_moe_prefill_bench as prefill
    from test_moe_gpu import SCHEMES, TOLERANCE, make_experts, reference

    from volta_ct_wna16.tables import SM90
    from volta_devkit.testing import assert_rel_close, poison_

    device = kernel_device
    experts, dense = make_experts(SCHEMES[0], experts=4, hidden=128, inter=128, device=device)
    gen = torch.Generator().manual_seed(5)
    tokens, top_k = 40, 2
    ids = torch.stack([torch.randperm(4, generator=gen)[:top_k] for _ in range(tokens)])
    w = torch.rand(tokens, top_k, generator=gen) + 0.1
    w, ids = (w / w.sum(-1, keepdim=True)).to(device), ids.to(torch.int32).to(device)
    x = torch.randn(tokens, 128, generator=gen).half().to(device)
    ref = reference(dense, x, w, ids)

    pair_at = prefill.pad_by_expert(ids, 4)
    counts = torch.bincount(ids.reshape(-1).long(), minlength=4)
    assert pair_at.shape == (4, int(counts.max()))
    assert sorted(pair_at[pair_at >= 0].tolist()) == list(range(tokens * top_k))
    owner = ids.reshape(-1).long()[pair_at.clamp_min(0)]
    assert bool(((owner == torch.arange(4, device=device)[:, None]) | (pair_at < 0)).all())
    assert_rel_close(
        prefill.dense_output(x, w, ids, *prefill.dense_stacks(experts)), ref, TOLERANCE, "bmm"
    )

    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison_(empty(*a, **k)))
    own = prefill.Candidate(prefill.tile(32, 64, 32, 4, 2))
    table = [prefill.Candidate(t, library=True) for t in (SM90.moe, SM90.moe_large)]
    swapped = prefill.Candidate(prefill.tile(32, 64, 32, 4, 2, swap=True))
    rows = [replace(c, scale_rows=True) for c in (own, swapped)]
    for cand in (own, *table, swapped, *rows):
        out = prefill.forward(x, w, ids, experts, cand)
        assert_rel_close(out, ref, TOLERANCE, cand.label)
    assert table[1].label == "m64n128k64w4s3*/swap/sr"
    with pytest.raises(ValueError, match="split the input"):
        prefill.Candidate(SM90.moe)
    with pytest.raises(ValueError, match="decides where scales load per row"):
        prefill.Candidate(SM90.moe_large, library=True, scale_rows=True)


def test_moe_prefill_sweep_and_rows_line_up() -> None:
    """The sweep: the table's two tiles first, then the large one unswapped, 30-45 distinct
    tiles, swapped ones among them;
    every printed row has as many columns as its heading, a case whose tiles all failed
    included."""
    from dataclasses import replace

    import ct_wna16_moe_prefill_bench as prefill

    from volta_ct_wna16.tables import SM90

    cands = prefill.candidates((9, 0))
    unswapped = replace(SM90.moe_large, swap=False)
    assert [c.launch for c in cands[:3]] == [SM90.moe, SM90.moe_large, unswapped]
    assert 30 <= len(cands) <= 45
    assert len({c.label.replace("*", "") for c in cands}) == len(cands)
    assert any(c.launch.swap and not c.library for c in cands)
    assert prefill.row_use([64, 65, 0], 64) == pytest.approx(129 / 192)
    row = {
        "case": "Qwen3.5-35B-A3B 2048", "flops": 1.03e11, "cube_flops": 7.0e14,
        "table_tile": "m64n128k64w4s3*", "table_us": 694.0, "best_tile": "m128n128k64w8s3",
        "best_us": 500.0, "bmm_us": 400.0, "mm_us": 200.0, "bmm_flops": 1.3e11,
    }  # fmt: skip
    assert len(prefill.line(row)) == len(prefill.HEADER)
    failed = {**row, "best_tile": "-", "best_us": float("nan"), "table_us": float("nan")}
    assert len(prefill.line(failed)) == len(prefill.HEADER)
    stages = {"case": row["case"], "tile": "m64n128k64w4s3*", "route": 5.0, "step": 700.0}
    assert len(prefill.stage_line(stages)) == len(prefill.STAGE_HEADER)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_moe_prefill_benchmark_refuses_to_run_without_cuda(tmp_path) -> None:
    import ct_wna16_moe_prefill_bench as prefill

    assert prefill.main(["--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_moe_prefill_benchmark_runs_whole_on_a_small_layer(monkeypatch, tmp_path, capsys) -> None:
    """The prefill benchmark end to end (the device's one call must not fail past its sweep)
    on a 4-expert layer under the interpreter: the GPU-only helpers (copy bandwidth, cuBLAS
    rate, CUDA routings and stack, graph timing) swapped for CPU ones; the table's two tiles
    and one tile of the benchmark's launcher each unswapped and swapped, every one checked
    against the float32 reference; the summary names the best tile and prints last."""
    import json
    import time
    import types

    import ct_wna16_moe_prefill_bench as prefill
    from test_moe_gpu import SCHEMES, make_experts

    if torch.cuda.is_available():
        pytest.skip("the CPU smoke run; the GPU runs the benchmark itself")

    def timed(fn, sets, replays):
        begin = time.perf_counter()
        for args in sets:
            fn(*args)
        return types.SimpleNamespace(median_ms=(time.perf_counter() - begin) * 1e3 / len(sets))

    def routings(m, experts, top_k, count, gen):
        out = []
        for _ in range(count):
            ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(m)])
            w = torch.rand(m, top_k, generator=gen) + 0.1
            out.append((None, w / w.sum(-1, keepdim=True), ids.to(torch.int32)))
        return out

    table = prefill.candidates((9, 0))[:2]
    own = prefill.Candidate(prefill.tile(32, 64, 32, 4, 2))
    swapped = prefill.Candidate(prefill.tile(32, 64, 32, 4, 2, swap=True))
    monkeypatch.setattr(prefill, "candidates", lambda _: [*table, own, swapped])
    monkeypatch.setattr(prefill, "MODELS", {"tiny": (4, 2, 128, 128)})
    monkeypatch.setattr(
        prefill, "stack", lambda e, h, i, _: make_experts(SCHEMES[0], e, h, i, "cpu")[0]
    )
    monkeypatch.setattr(prefill, "routings", routings)
    monkeypatch.setattr(prefill, "time_cuda_graph", timed)
    monkeypatch.setattr(prefill, "start", lambda out: out.mkdir() or 3e12)
    monkeypatch.setattr(prefill, "matmul_flops", lambda: 7e14)
    monkeypatch.setattr(prefill, "versions", lambda: {"device": "cpu", "versions": {"triton": "-"}})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    assert prefill.main(["--out", str(tmp_path / "out"), "--ms", "40", "--jobs", "0"]) == 0
    record = json.loads((tmp_path / "out" / "ct_wna16_moe_prefill_bench.json").read_text())
    assert len(record["sweep"]) == 4
    assert all(row["rel_error"] <= prefill.TOLERANCE for row in record["sweep"]), record["sweep"]
    (summary,) = record["summary"]
    assert summary["table_tile"] == table[1].label  # 80 pairs over 4 experts: the large tile
    assert summary["best_tile"] in {row["tile"] for row in record["sweep"]}
    assert {row["tile"] for row in record["stages"]} == {table[1].label, summary["best_tile"]}
    assert capsys.readouterr().out.splitlines()[-1].startswith("tiny 40")
