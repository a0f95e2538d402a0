"""The AWQ/GPTQ benchmark's CPU-side parts (``benchmarks/ct_wna16_awq_bench.py``): the rounds'
rotation, the medians and per-round ratios, the rows and tables it builds from them, and each
variant's weights and calls on a small layer, checked against float64 as the GPU run checks
them (the kernels under the Triton interpreter, vLLM's ``awq_triton.py`` read from the dev
venv's vLLM wheel without importing vLLM)."""

from __future__ import annotations

import ast
import importlib.util
import statistics
from pathlib import Path
from typing import Any

import ct_wna16_awq_bench as bench
import pytest
import torch

from volta_core.kernel_api import interpreting
from volta_ct_wna16.layout import dequantize


def test_rounds_rotate_every_variant_through_every_place() -> None:
    variants = bench.VARIANTS
    assert bench.rotated(variants, 0) == list(variants)
    orders = [bench.rotated(variants, r) for r in range(len(variants))]
    for order in orders:
        assert sorted(order) == sorted(variants)
    for place in range(len(variants)):
        assert {order[place] for order in orders} == set(variants)
    assert bench.rotated(variants, len(variants) + 2) == orders[2]


def test_ratios_are_medians_of_per_round_pairs_not_ratios_of_medians() -> None:
    # The clock drifts between rounds, moving both times of a round alike; ours is 2x faster in
    # every round but the last (slowed alone): the per-round median says 2, the medians 1.69.
    times = {"base": [100.0, 130.0, 90.0, 160.0, 110.0], "ours": [50.0, 65.0, 45.0, 80.0, 70.0]}
    assert bench.round_ratio(times, "base", "ours") == 2.0
    assert statistics.median(times["base"]) / statistics.median(times["ours"]) == 110 / 65
    spread = bench.spread(times["base"])
    assert spread["us"] == pytest.approx(110.0)
    assert (spread["min_us"], spread["max_us"]) == (90.0, 160.0)
    assert spread["rounds_us"] == times["base"]
    with pytest.raises(ValueError, match="longer"):
        bench.round_ratio({"base": [1.0], "ours": [1.0, 2.0]}, "base", "ours")


def _fake_run(capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, list[float]], list[Any]]:
    calls: list[str] = []
    readings = iter(range(100))

    def clock() -> dict[str, float | None]:
        return {"sm_mhz": 1000.0 + next(readings), "temp_c": 40.0, "power_w": None}

    def timer(fn: Any, count: int) -> float:
        assert count == 3
        calls.append(fn)
        return 10.0 * len(calls)

    run = {v: v for v in bench.VARIANTS}
    times, log = bench.time_rounds("5120x5120 M=1", run, 3, 2, clock, timer)  # type: ignore[arg-type]
    assert calls == bench.rotated(bench.VARIANTS, 0) + bench.rotated(bench.VARIANTS, 1)
    assert [r["order"] for r in log] == [bench.rotated(bench.VARIANTS, r) for r in range(2)]
    assert [(r["before"]["sm_mhz"], r["after"]["sm_mhz"]) for r in log] == [
        (1000.0, 1001.0),
        (1002.0, 1003.0),
    ]
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith("5120x5120 M=1 round 2/2 [1002 MHz 40C ? -> 1003 MHz 40C ?]")
    assert printed[1].endswith("fp16 130.0 AWQ 140.0")
    return times, log


def test_rounds_time_each_variant_once_between_two_clock_readings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    times, _ = _fake_run(capsys)
    n = len(bench.VARIANTS)
    assert times["awq"] == [10.0, 10.0 * (2 * n)]  # first in round 1, last in round 2
    assert times["ct"] == [20.0, 10.0 * (n + 1)]


def test_rows_keep_the_earlier_keys_and_gate_on_the_plugins_variants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    times, log = _fake_run(capsys)
    errors = dict.fromkeys(bench.VARIANTS, 1e-4) | {"vllm_awq": 3e-3}
    row = bench.summarize(5120, 5120, 1, times, errors, log)
    earlier = ("n", "k", "m", "ours_us", "vllm_awq_us", "fp16_us", "vs_vllm", "vs_fp16")
    assert set(earlier) | {"ours_rel_error", "vllm_rel_error", "correct"} <= set(row)
    assert row["ours_us"] == statistics.median(times["awq"])
    assert row["vs_vllm"] == bench.round_ratio(times, "vllm_awq", "awq")
    assert row["speedups"]["gptq_act"]["fp16"] == bench.round_ratio(times, "fp16", "gptq_act")
    assert row["awq_vs_ct"] == bench.round_ratio(times, "ct", "awq")
    assert row["act_order_vs_sym"] == bench.round_ratio(times, "gptq_sym", "gptq_act")
    assert set(row["times"]) == set(row["rel_errors"]) == set(bench.VARIANTS)
    assert set(row["speedups"]) == set(bench.PLUGIN)
    assert row["correct"]  # vLLM's own error is reported, not judged
    assert row["vllm_rel_error"] == 3e-3
    bad = bench.summarize(5120, 5120, 1, times, errors | {"gptq_act": float("nan")}, log)
    assert not bad["correct"]
    text = bench.table([row, bad]).splitlines()
    times_head, ratios_head = text[1], text[6]
    for label in bench.LABELS.values():
        assert label in times_head
    assert "AWQ/CT" in ratios_head
    assert "act/sym" in ratios_head
    assert text[2].startswith("  5120x5120       1 ")
    assert text[2].endswith(" 1000-1003   40-40")
    assert text[7].endswith("yes")
    assert text[8].endswith("NO")


def _peer() -> Any:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed here (its awq_triton.py is the peer)")
    path = Path(spec.origin).parent / "model_executor/layers/quantization/awq_triton.py"
    return bench.load_peer(path)


@pytest.fixture(scope="module")
def layer() -> tuple[bench.Layer, Any]:
    if not torch.cuda.is_available() and not interpreting():
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    peer = _peer()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return bench.build_layer(64, 2 * bench.GROUP, 2, peer, device), peer


def test_each_variant_runs_its_checkpoint_and_passes_the_float64_check(
    layer: tuple[bench.Layer, Any],
) -> None:
    built, peer = layer
    assert set(built.packed) == set(bench.PLUGIN)
    assert all(len(copies) == 2 for copies in built.packed.values())
    awq, ct = built.packed["awq"][0].weights, built.packed["ct"][0].weights
    # The compressed-tensors checkpoint loads to the AWQ repack's tensors, bit for bit.
    for name in ("qweight", "scales", "zeros", "zeros8"):
        assert torch.equal(getattr(awq, name), getattr(ct, name)), name
    for name in ("gptq_sym", "gptq_asym", "gptq_act"):
        repacked = built.packed[name][0]
        assert (repacked.perm is not None) == (name == "gptq_act")
        assert (repacked.weights.zeros is None) == bench.SCHEMES[name].symmetric
        dense = dequantize(repacked.weights, torch.float64).t()
        if repacked.perm is not None:
            dense = dense[torch.argsort(repacked.perm)]
        assert torch.equal(dense, bench.reference_weight(built, name, peer)), name
    g_idx = built.checkpoints["gptq_act"]["g_idx"]
    assert not torch.equal(g_idx, torch.sort(g_idx).values)  # groups spread over the input
    assert torch.equal(torch.bincount(g_idx.long()), torch.full((2,), bench.GROUP))


def test_a_shape_is_checked_then_timed_in_rounds(
    layer: tuple[bench.Layer, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    built, peer = layer
    device = str(built.packed["awq"][0].weights.qweight.device)
    timed: list[int] = []

    def timer(fn: Any, count: int) -> float:
        assert count == bench.copies_for(built.n, built.k)
        assert callable(fn)  # each was run by the checks already (interpreted: slow here)
        timed.append(count)
        return 1.0

    clock = dict.fromkeys(bench.CLOCK_KEYS)
    (row,) = bench.measure(built.n, built.k, peer, 2, lambda: clock, (1,), device, timer)
    assert len(timed) == 2 * len(bench.VARIANTS)
    assert row["correct"]
    assert all(error < bench.TOLERANCE for error in row["rel_errors"].values()), row
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert "?" in bench.table([row]).splitlines()[2]  # no clock readings


def test_main_refuses_without_a_gpu_and_rounds_below_one(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--peer", "x.py", "--rounds", "0"])
    if not torch.cuda.is_available():
        assert bench.main(["--out", str(tmp_path), "--peer", "x.py"]) == 2


def test_the_timed_call_mirrors_the_layers_apply() -> None:
    """``layer_apply`` stands in for ``linear.apply_packed`` (which imports vLLM): the gather and
    the operator call it mirrors are still what ``apply_packed`` runs."""
    source = (Path(bench.__file__).parents[1] / "src/volta_ct_wna16/linear.py").read_text()
    tree = ast.parse(source)
    (apply,) = (f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                and f.name == "apply_packed")  # fmt: skip
    body = [ast.unparse(stmt) for stmt in apply.body[1:]]
    assert body == [
        "perm, (qweight, scales, zeros, zeros8), (k, bits, group) = layer.ct_wna16_operands",
        "if perm is not None:\n    x = x.index_select(-1, perm)",
        "return ops.linear_op(x, qweight, scales, zeros, zeros8, bias, k, bits, group)",
    ]
