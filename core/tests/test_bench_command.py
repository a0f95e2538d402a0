"""``vllm-volta bench`` on CPU: what it times, how a report pairs and judges, the hook's rules.

The timing itself needs a GPU; here it is stood in by timings made from each call's own
estimate times a factor per kernel family, so the ratios and verdicts are known.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from volta_core import V100, AttentionLayer, Device, UsageError
from volta_core.bench import run as bench_run
from volta_core.bench.cases import QUICK, Family, Planned, plan_cases, unmeasured_paths
from volta_core.bench.machine import nvlink_links, smi_facts
from volta_core.bench.report import Ceilings, Measured, assemble, render_text
from volta_core.bench.run import load_plugins, time_planned
from volta_core.cli import main
from volta_core.host.discovery import get_plugin_manager
from volta_core.host.manager import VoltaPluginManager
from volta_core.kernel_api import BenchCall, BenchCase, Timing, Workload
from volta_core.planner.model import describe_model, read_config
from volta_core.planner.plan import PlanOptions, make_plan

MODEL = "qwen3.5-27b-w4a16"
#: The plugins that answer MODEL's bench cases (attention, KV write, linear).
BENCHED_PLUGINS = pytest.mark.needs(
    "vllm-volta-attn-v100", "vllm-volta-ct-wna16", "vllm-volta-fp8kv"
)
CEILINGS = Ceilings(copy_gbps=800.0, read_gbps=850.0, fp16_tflops=100.0, fp32_tflops=14.0)
#: Measured time over estimate, per family: one of each verdict.
FACTORS = {
    Family.ATTENTION_DECODE: 1.1,
    Family.ATTENTION_PREFILL: 0.5,
    Family.LINEAR: 1.5,
    Family.KV_WRITE: 3.0,
}
VERDICTS = {
    "attention decode": "as estimated (1.10x)",
    "attention prefill": "faster than estimated (0.50x): the cost model counts more work "
    "than the kernel does",
    "linear": "slower than estimated (1.50x): the roofline is optimistic here",
    "KV-cache write": "far slower than estimated (3.00x): worth an issue with this report",
}
DEVICE = {
    "name": "Tesla V100-SXM2-32GB",
    "capability": "7.0",
    "sm_count": 80,
    "memory_gib": 31.74,
    "l2_bytes": 6291456,
    "driver": "550.54.15",
    "sm_clock_max_mhz": "1530",
    "memory_clock_max_mhz": "877",
    "pcie_gen_max": "3",
    "pcie_width_max": "16",
    "power_limit_w": "300.00",
    "gpus": 2,
    "interconnect": "PCIe gen 3 x16; NVLink 6 links x 25.781 GB/s",
}
SOFTWARE = {
    "vllm_volta_core": "0.9.0",
    "python": "3.12.3",
    "torch": "2.10.0+cu128",
    "cuda_runtime": "12.8",
    "triton": "3.6.0",
    "nvrtc": "12.9",
    "vllm_family": "vllm-0.19",
    "vllm": "0.19.1",
    "plugins": {"attn_v100": "vllm-volta-attn-v100 0.6.2 (loaded)"},
}


def _planned() -> tuple[list[Planned], Any]:
    get_plugin_manager.cache_clear()
    manager = get_plugin_manager()
    name, raw = read_config(MODEL)
    options = PlanOptions(device=V100, kv_cache_dtype="fp8_e5m2")
    plan = make_plan(describe_model(name, raw), options, manager)
    return plan_cases(manager, plan, name, QUICK), plan


def _report(planned: list[Planned], plan: Any) -> dict[str, Any]:
    rates = CEILINGS.rates(DEVICE["name"])
    measured = []
    for p in planned:
        assert p.estimate is not None, p
        ms = p.estimate.serving(True).seconds(rates) * 1e3 * FACTORS[p.family]
        timing = Timing(ms, 0.99 * ms, 1.01 * ms, 100, 4)
        measured.append(Measured(p, timing, "CUDA graph"))
    return assemble(
        models=[MODEL],
        quick=True,
        device=DEVICE,
        software=SOFTWARE,
        ceilings=CEILINGS,
        measured=measured,
        unmeasured=unmeasured_paths(plan, planned),
        seconds=12.0,
        calibrated=False,
    )


@BENCHED_PLUGINS
def test_the_report_pairs_every_planned_kernel_with_its_estimate_and_judges_each_family(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    planned, plan = _planned()
    assert {p.family for p in planned} == set(FACTORS)
    report = json.loads(json.dumps(_report(planned, plan)))
    assert report["schema"] == "vllm-volta-bench/1"
    assert report["calibration"] == {
        "device": DEVICE["name"],
        "bandwidth_gbps": 800.0,
        "tensor_tflops": 100.0,
        "fma_tflops": 14.0,
        "source": "vllm-volta bench (quick), vllm-volta-core 0.9.0",
    }
    assert report["calibrated"] is False
    for row in report["kernels"]:
        assert row["ratio"] == pytest.approx(FACTORS[Family(row["family"])], rel=1e-3), row
        assert row["notes"] == [], row
        assert row["kernel"] == row["estimate_kernel"], row
        assert row["plan_v100_estimate_ms"] > 0
    assert {v["family"]: v["verdict"] for v in report["verdicts"]} == VERDICTS
    # Every kernel the plan prints for a plugin-served layer is measured or listed as not.
    printed = {
        path.kernel for lp in plan.layers if lp.plugin is not None for path in lp.kernel_paths
    } | {path.kernel for q in plan.quant if q.plugin is not None for path in q.kernel_paths}
    reported = {r["kernel"] for r in report["kernels"]} | {
        r["kernel"] for r in report["not_measured"]
    }
    assert printed <= reported
    text = render_text(report)
    assert "Tesla V100-SXM2-32GB (sm 7.0, 80 SMs" in text
    assert "ceilings: copy 800.0 GB/s, read 850.0 GB/s, fp16 cuBLAS 100.0 TFLOP/s" in text
    assert all(f"  {family}: " in text for family in VERDICTS)

    monkeypatch.setattr(bench_run, "run_bench", lambda *_, **__: report)
    assert main(["bench", MODEL, "--quick", "--out", f"{tmp_path}/"]) == 0
    assert capsys.readouterr().out.strip() == text
    assert json.loads((tmp_path / "bench.json").read_text()) == report
    assert (tmp_path / "bench.txt").read_text().strip() == text
    assert main(["bench", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == report


def test_without_a_gpu_bench_says_so_in_one_line_and_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--quick"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert "bench needs a CUDA GPU" in err


def _one(make_call: Any) -> Planned:
    work = Workload(4)
    return Planned("m", Family.LINEAR, "x", "p", "method", work, None, "s", "k", make_call)


def _timing(*_: Any, **__: Any) -> Timing:
    return Timing(1.0, 0.9, 1.1, 10, 1)


def test_a_call_is_timed_on_the_sets_that_fit_and_eagerly_where_capture_fails() -> None:
    built: list[int] = []

    def make_inputs() -> tuple[int]:
        built.append(1)
        return (len(built),)

    call = BenchCall(make_inputs, lambda _: None, 10 << 20)

    def no_graph(*_: Any, **__: Any) -> Timing:
        raise RuntimeError("operation not permitted when stream is capturing")

    released: list[bool] = []
    args = (6 << 20, no_graph, _timing, lambda: released.append(True))
    rotated = time_planned(_one(lambda: call), 64 << 20, 5, *args)
    assert (rotated.timing, len(built)) == (_timing(), 2)  # 2 x 10 MiB exceed 3 x 6 MiB of L2
    assert rotated.timed_in.startswith("eagerly (graph capture failed: operation not permitted")
    built.clear()
    capped = time_planned(_one(lambda: call), 15 << 20, 5, 6 << 20, _timing, _timing, args[3])
    assert (capped.timed_in, len(built)) == ("CUDA graph", 1)
    refused = time_planned(_one(lambda: call), 5 << 20, 5, *args)
    assert refused.timing is None
    assert refused.error.startswith("not run: one input set needs 0.01 GiB")

    def broken() -> BenchCall:
        raise ImportError("no module named volta_x")

    failed = time_planned(_one(broken), 64 << 20, 5, *args)
    assert failed.error == "failed: ImportError: no module named volta_x"
    assert released == [True] * 4


LAYER = AttentionLayer("model.layers.0.self_attn", 128, 32, 8, "float16", "fp8_e5m2")


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ("fast", "expected BenchCase or None"),
        (BenchCase("", "Triton", "pkg.mod:call"), "empty stage"),
        (BenchCase("decode", "Triton", "pkg/mod.py"), "'pkg/mod.py' that is not"),
    ],
)
def test_a_wrong_bench_case_disables_the_plugin(
    manager: VoltaPluginManager, fake_plugin: Any, answer: Any, error: str
) -> None:
    manager.register(fake_plugin(volta_bench_case=answer), "wrong")
    assert manager.bench_case("wrong", LAYER, "VOLTA", V100, None, Workload(1)) is None
    (fault,) = manager.faults
    assert (fault.plugin, fault.hook) == ("wrong", "volta_bench_case")
    assert error in fault.error


def test_only_the_serving_plugin_is_asked_for_a_bench_case(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    case = BenchCase("decode", "Triton", "pkg.mod:call")
    manager.register(fake_plugin(volta_bench_case=case), "owner")
    manager.register(fake_plugin(volta_bench_case=lambda **_: 1 / 0), "bystander")
    assert manager.bench_case("owner", LAYER, "VOLTA", V100, None, Workload(1)) == case
    assert manager.faults == []


def test_the_device_facts_come_from_nvidia_smi_without_identifiers() -> None:
    facts = smi_facts("550.54.15, 1530, 877, 3, 16, [N/A]\nother GPU\n")
    assert facts == {
        "driver": "550.54.15",
        "sm_clock_max_mhz": "1530",
        "memory_clock_max_mhz": "877",
        "pcie_gen_max": "3",
        "pcie_width_max": "16",
        "power_limit_w": None,
    }
    assert smi_facts(None)["driver"] is None
    status = "GPU 0: Tesla V100 (UUID: GPU-x)\n\t Link 0: 25.781 GB/s\n\t Link 1: <inactive>\n"
    assert nvlink_links(status) == ["25.781 GB/s"]


@BENCHED_PLUGINS
def test_a_source_checkout_benches_its_plugins_without_entry_points() -> None:
    """``--plugin MODULE``: the plugins registered from their modules, as on a GPU box where
    the checkout is on PYTHONPATH and nothing is installed; at fp16 an H100/H200 plan puts
    attention on the Volta backend too."""
    manager = load_plugins(
        ["volta_fp8kv.plugin", "volta_attn_v100.plugin", "volta_ct_wna16.plugin"]
    )
    assert sorted(manager.records) == ["attn_v100", "ct_wna16", "fp8kv"]
    name, raw = read_config(MODEL)
    options = PlanOptions(device=Device((9, 0)), dtype="float16")
    planned = plan_cases(
        manager, make_plan(describe_model(name, raw), options, manager), name, QUICK
    )
    assert {p.family for p in planned} == set(FACTORS)
    assert all(p.make_call is not None for p in planned)
    with pytest.raises(UsageError, match=r"--plugin volta_nothing\.plugin: cannot be imported"):
        load_plugins(["volta_nothing.plugin"])


@BENCHED_PLUGINS
def test_the_command_measures_the_ceilings_then_each_planned_call(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_bench``'s glue with the GPU stood in: ceilings, plans, every call timed once."""
    cuda = SimpleNamespace(
        get_device_capability=lambda _: (7, 0),
        mem_get_info=lambda _: (30 << 30, 32 << 30),
        empty_cache=lambda: None,
    )
    monkeypatch.setattr(bench_run, "require_gpu", lambda: SimpleNamespace(cuda=cuda))
    for name, value in (
        ("measure_copy_bandwidth", 800.0),
        ("measure_read_bandwidth", 850.0),
    ):
        monkeypatch.setattr(bench_run, name, lambda _bytes, v=value: (v, _timing()))
    monkeypatch.setattr(
        bench_run,
        "measure_matmul",
        lambda _n, dtype: (100.0 if dtype == "float16" else 14.0, _timing()),
    )
    monkeypatch.setattr(bench_run, "l2_bytes", lambda: 6 << 20)
    monkeypatch.setattr(bench_run, "describe_device", lambda: DEVICE)
    timed: list[tuple[Planned, int]] = []

    def stand_in(planned: Planned, budget: int, replays: int, l2: int) -> Measured:
        timed.append((planned, budget))
        assert (replays, l2) == (5, 6 << 20)
        return Measured(planned, _timing(), "CUDA graph")

    monkeypatch.setattr(bench_run, "time_planned", stand_in)
    get_plugin_manager.cache_clear()
    assert main(["bench", "--quick", "--json", "--kv-cache-dtype", "fp8_e5m2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["models"] == [MODEL]
    assert report["ceilings"] == {
        "copy_gbps": 800.0,
        "read_gbps": 850.0,
        "fp16_cublas_tflops": 100.0,
        "fp32_fma_tflops": 14.0,
    }
    assert report["software"]["plugins"]["attn_v100"].startswith("vllm-volta-attn-v100 ")
    assert len(report["kernels"]) == len(timed) > 0
    assert {budget for _, budget in timed} == {15 << 30}  # half of what was free
    assert {r["family"] for r in report["kernels"]} == {f.value for f in FACTORS}
