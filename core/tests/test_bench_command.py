"""``vllm-volta bench`` on CPU: what it times, how a report pairs and judges, the hook's rules.

The timing itself needs a GPU; here it is stood in by timings made from each call's own
estimate times a factor per kernel family, so the ratios and verdicts are known. The report's
keys are pinned here (:data:`REPORT_KEYS` and the others): a tool reading ``--json`` may rely
on them, so a change of them is a change of the schema.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from volta_core import V100, AttentionLayer, Device, UsageError
from volta_core.bench import machine
from volta_core.bench import run as bench_run
from volta_core.bench.cases import (
    FULL,
    QUICK,
    Family,
    Planned,
    attention_module,
    plan_cases,
    stage_counts,
    unmeasured_paths,
)
from volta_core.bench.machine import describe_device, describe_software, nvlink_links, smi_facts
from volta_core.bench.report import Ceilings, Measured, assemble, render_text
from volta_core.bench.run import load_plugins, public_name, require_gpu, run_bench, time_planned
from volta_core.cli import main
from volta_core.host.discovery import get_plugin_manager
from volta_core.host.manager import VoltaPluginManager
from volta_core.kernel_api import BenchCall, BenchCase, Timing, Workload
from volta_core.planner.model import describe_model, read_config
from volta_core.planner.plan import Plan, PlanOptions, make_plan

MODEL = "qwen3.5-27b-w4a16"
#: The plugins that answer the models' bench cases (attention, KV write, linear, experts).
BENCHED_PLUGINS = pytest.mark.needs(
    "vllm-volta-attn-v100", "vllm-volta-ct-wna16", "vllm-volta-fp8kv", "vllm-volta-fp8w"
)
CEILINGS = Ceilings(copy_gbps=800.0, read_gbps=850.0, fp16_tflops=100.0, fp32_tflops=14.0)
#: Measured time over estimate, per family: one of each verdict.
FACTORS = {
    Family.ATTENTION_DECODE: 1.1,
    Family.ATTENTION_PREFILL: 0.5,
    Family.LINEAR: 1.5,
    Family.MOE: 1.0,
    Family.KV_WRITE: 3.0,
}
VERDICTS = {
    "attention decode": "as estimated (1.10x)",
    "attention prefill": "faster than estimated (0.50x): the cost model counts more work "
    "than the kernel does",
    "linear": "slower than estimated (1.50x): the roofline is optimistic here",
    "MoE experts": "as estimated (1.00x)",
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

# -- the report's schema: its keys, pinned ----------------------------------------------------

REPORT_KEYS = {
    "schema",
    "models",
    "quick",
    "device",
    "software",
    "ceilings",
    "calibration",
    "calibrated",
    "kernels",
    "not_measured",
    "verdicts",
    "seconds",
}
KERNEL_KEYS = {
    "model",
    "family",
    "module",
    "plugin",
    "served_by",
    "work",
    "stage",
    "kernel",
    "timing",
    "timed_in",
    "estimate_kernel",
    "bytes",
    "flops",
    "estimate_ms",
    "plan_v100_estimate_ms",
    "bound",
    "ratio",
    "achieved_gbps",
    "achieved_tflops",
    "notes",
}
TIMING_KEYS = {"median_ms", "q20_ms", "q80_ms", "reps", "input_sets"}
WORK_KEYS = ({"tokens"}, {"sequences", "query_len", "context"})
NOT_MEASURED_KEYS = {"model", "module", "stage", "kernel", "reason"}
VERDICT_KEYS = {"family", "calls", "measured", "median_ratio", "verdict"}
CEILING_KEYS = {"copy_gbps", "read_gbps", "fp16_cublas_tflops", "fp32_fma_tflops"}
CALIBRATION_KEYS = {"device", "bandwidth_gbps", "tensor_tflops", "fma_tflops", "source", "ratios"}
DEVICE_KEYS = set(DEVICE)
SOFTWARE_KEYS = set(SOFTWARE)


def check_schema(report: dict[str, Any]) -> None:
    """``report`` (as ``--json`` prints it) has exactly the pinned keys, at every level, and
    figures where figures belong."""
    assert set(report) == REPORT_KEYS
    assert report["schema"] == "vllm-volta-bench/1"
    assert set(report["device"]) == DEVICE_KEYS
    assert set(report["software"]) == SOFTWARE_KEYS
    assert set(report["ceilings"]) == CEILING_KEYS
    assert all(isinstance(v, float) for v in report["ceilings"].values())
    assert set(report["calibration"]) == CALIBRATION_KEYS
    assert isinstance(report["seconds"], float)
    for row in report["kernels"]:
        assert set(row) == KERNEL_KEYS, row
        assert set(row["work"]) in WORK_KEYS, row
        assert row["timing"] is None or set(row["timing"]) == TIMING_KEYS, row
        assert isinstance(row["notes"], list)
    for row in report["not_measured"]:
        assert set(row) == NOT_MEASURED_KEYS, row
        assert row["reason"], row
    for v in report["verdicts"]:
        assert set(v) == VERDICT_KEYS


def test_the_pinned_timing_keys_are_the_harness_timing() -> None:
    assert {f.name for f in fields(Timing)} == TIMING_KEYS


# -- plans and reports with stand-in timings --------------------------------------------------


def _moe_config(folder: Path, example: str) -> str:
    """A bundled example (W4A16, or FP8 with 128 x 128 blocks) made a Qwen3.5-MoE in
    ``folder`` (256 experts, 8 a token, 512-wide): no bundled example has routed experts."""
    _, raw = read_config(example)
    raw["model_type"], raw["architectures"] = "qwen3_5_moe", ["Qwen3_5MoeForConditionalGeneration"]
    text = raw["text_config"]
    text.update(
        model_type="qwen3_5_moe_text",
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        hidden_size=2048,
        num_hidden_layers=40,
        num_attention_heads=16,
        num_key_value_heads=2,
        layer_types=text["layer_types"][:40],
    )
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return str(folder)


#: The models the report is checked on: two bundled examples (ct_wna16's and fp8w's linear
#: layers) and each made a MoE (their experts), given as a directory.
MODELS = {
    "w4a16": MODEL,
    "fp8": "qwen3.6-27b-fp8",
    "w4a16 experts": "moe:qwen3.5-27b-w4a16",
    "fp8 experts": "moe:qwen3.6-27b-fp8",
}


def _target(model: str, tmp_path: Path) -> str:
    kind, _, example = model.partition(":")
    if kind != "moe":
        return model
    return _moe_config(tmp_path / "home" / "alice" / "Qwen3.5-MoE", example)


def _planned(target: str, device: Device = V100) -> tuple[list[Planned], Plan, str]:
    get_plugin_manager.cache_clear()
    manager = get_plugin_manager()
    name, raw = read_config(target)
    shown = public_name(target, name, raw)
    options = PlanOptions(device=device, kv_cache_dtype="fp8_e5m2")
    plan = make_plan(describe_model(name, raw), options, manager)
    return plan_cases(manager, plan, shown, QUICK), plan, shown


def _stand_in(p: Planned) -> Timing:
    """A timing of ``p``'s estimate times its family's factor."""
    assert p.estimate is not None, p
    ms = (
        p.estimate.serving(True).seconds(CEILINGS.rates(str(DEVICE["name"])))
        * 1e3
        * FACTORS[p.family]
    )
    return Timing(ms, 0.99 * ms, 1.01 * ms, 100, 4)


def _report(planned: list[Planned], plan: Plan, name: str) -> dict[str, Any]:
    measured = [Measured(p, _stand_in(p), "CUDA graph") for p in planned]
    report = assemble(
        models=[name],
        quick=True,
        device=DEVICE,
        software=SOFTWARE,
        ceilings=CEILINGS,
        measured=measured,
        unmeasured=unmeasured_paths(plan, planned, name, QUICK),
        seconds=12.0,
        calibrated=False,
    )
    printed: dict[str, Any] = json.loads(json.dumps(report))
    return printed


def _stages(plan: Plan) -> tuple[set[tuple[Any, str]], dict[str, Any]]:
    """Every (layer, stage) the plan prints for a plugin-served layer, and how a report's
    module names its layer: an attention layer by the report's label; a quant module by its
    method and shape (the report times one module of each shape, the plan prints each)."""
    shapes = {
        q.prefix: (
            q.method,
            q.module.kind,
            q.module.input_size,
            q.module.output_size,
            q.module.experts,
            q.module.top_k,
        )
        for q in plan.quant
        if q.plugin is not None and q.module is not None
    }
    printed = {
        (attention_module(lp.spec), path.stage)
        for lp in plan.layers
        if lp.plugin is not None and lp.spec is not None
        for path in lp.kernel_paths
    } | {
        (shapes[q.prefix], path.stage)
        for q in plan.quant
        if q.prefix in shapes
        for path in q.kernel_paths
    }
    return printed, shapes


def _accounted(report: dict[str, Any], shapes: dict[str, Any]) -> tuple[set[Any], set[Any]]:
    """The (layer, stage) pairs the report timed, and those it lists as not measured."""
    timed = {
        (shapes.get(r["module"], r["module"]), r["stage"])
        for r in report["kernels"]
        if r["timing"] is not None
    }
    listed = {(shapes.get(r["module"], r["module"]), r["stage"]) for r in report["not_measured"]}
    return timed, listed


@BENCHED_PLUGINS
@pytest.mark.parametrize("model", list(MODELS.values()), ids=list(MODELS))
def test_every_stage_the_plan_prints_is_timed_beside_its_estimate(
    model: str, tmp_path: Path
) -> None:
    """A V100's plan: each stage of each plugin-served layer (attention's decode stages of one
    and of several query tokens, each linear stage, the experts' decode and routed stages)
    has a timed call whose estimate is the plan's for it; each family is judged."""
    planned, plan, name = _planned(_target(model, tmp_path))
    report = _report(planned, plan, name)
    check_schema(report)
    printed, shapes = _stages(plan)
    timed, listed = _accounted(report, shapes)
    assert printed
    assert printed - timed == set()
    assert listed == set()
    families = {p.family for p in planned}
    assert families >= {Family.ATTENTION_DECODE, Family.ATTENTION_PREFILL, Family.KV_WRITE}
    assert (Family.MOE in families) == model.startswith("moe:")
    for row in report["kernels"]:
        assert row["ratio"] == pytest.approx(FACTORS[Family(row["family"])], rel=1e-3), row
        assert row["notes"] == [], row
        assert row["kernel"] == row["estimate_kernel"], row
        assert row["plan_v100_estimate_ms"] > 0
    assert {v["family"]: v["verdict"] for v in report["verdicts"]} == {
        f.value: VERDICTS[f.value] for f in Family if f in families
    }


@BENCHED_PLUGINS
def test_the_report_and_its_text_go_where_the_command_puts_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    planned, plan, name = _planned(MODEL)
    report = _report(planned, plan, name)
    ratios = report["calibration"].pop("ratios")
    assert report["calibration"] == {
        "device": DEVICE["name"],
        "bandwidth_gbps": 800.0,
        "tensor_tflops": 100.0,
        "fma_tflops": 14.0,
        "source": "vllm-volta bench (quick), vllm-volta-core 0.9.0",
    }
    # Each judged family's factor, from as many calls as its verdict measured.
    assert ratios == {
        v["family"]: {"median_ratio": FACTORS[Family(v["family"])], "calls": v["measured"]}
        for v in report["verdicts"]
    }
    assert report["calibrated"] is False
    text = render_text(report)
    assert "Tesla V100-SXM2-32GB (sm 7.0, 80 SMs" in text
    assert "ceilings: copy 800.0 GB/s, read 850.0 GB/s, fp16 cuBLAS 100.0 TFLOP/s" in text
    assert all(f"  {family}: " in text for family in VERDICTS if family != "MoE experts")
    # Each module whole on its rows: q_proj and k_proj are told apart in the pasted text.
    lines = text.splitlines()
    for row in report["kernels"]:
        assert any(f" {row['module']} " in line and f" {row['stage']} " in line for line in lines)
    assert any("self_attn.q_proj " in line for line in lines)
    assert any("self_attn.k_proj " in line for line in lines)

    monkeypatch.setattr(bench_run, "run_bench", lambda *_, **__: report)
    assert main(["bench", MODEL, "--quick", "--out", f"{tmp_path}/"]) == 0
    assert capsys.readouterr().out.strip() == text
    assert json.loads((tmp_path / "bench.json").read_text()) == report
    assert (tmp_path / "bench.txt").read_text().strip() == text
    assert main(["bench", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == report


@pytest.mark.parametrize(
    ("stage", "quick", "full"),
    [
        ("1 token", (1,), (1,)),
        ("1-7 tokens", (1,), (1, 7)),
        ("33-256 tokens", (33,), (33, 256)),
        ("257+ tokens", (257,), (257, 2048)),
        ("4096+ tokens", (4096,), (4096,)),
        ("decode, 3-8 query tokens", (3,), (3, 8)),
        ("prefill", (), ()),
    ],
)
def test_each_stage_is_timed_at_its_first_count_and_in_a_full_run_at_its_last(
    stage: str, quick: tuple[int, ...], full: tuple[int, ...]
) -> None:
    assert stage_counts(stage, QUICK) == quick
    assert stage_counts(stage, FULL) == full


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


def test_a_gpu_short_of_free_memory_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    free = {"bytes": 1 << 30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda _=0: (free["bytes"], 32 << 30))
    ran: list[str] = []
    monkeypatch.setattr(bench_run, "measure_copy_bandwidth", lambda *_: ran.append("copy"))
    assert main(["bench", "--quick"]) == 2
    out, err = capsys.readouterr()
    assert (out, ran) == ("", [])
    assert err.count("\n") == 1
    assert "bench needs 4.0 GiB free on GPU 0, which has 1.00 GiB free" in err
    free["bytes"] = bench_run.FREE_BYTES_NEEDED
    assert require_gpu() is torch


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
def test_the_device_and_the_software_are_described_by_these_keys_only(
    monkeypatch: pytest.MonkeyPatch, manager: VoltaPluginManager
) -> None:
    """``describe_device`` and ``describe_software`` with torch's CUDA and ``nvidia-smi``
    stood in: exactly the pinned keys (no identifier of the GPU, the machine or the user)."""
    torch = pytest.importorskip("torch")
    props = SimpleNamespace(multi_processor_count=80, total_memory=32 << 30, L2_cache_size=6 << 20)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _: DEVICE["name"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _: (7, 0))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    answers = {
        "--query-gpu": "550.54.15, 1530, 877, 3, 16, 300.00\n",
        "nvlink": "GPU 0: Tesla V100 (UUID: GPU-x)\n\t Link 0: 25.781 GB/s\n",
    }
    monkeypatch.setattr(
        machine, "_smi", lambda *args: answers["nvlink" if args[0] == "nvlink" else "--query-gpu"]
    )
    device = describe_device()
    assert set(device) == DEVICE_KEYS
    assert device["interconnect"] == "PCIe gen 3 x16; NVLink 1 links x 25.781 GB/s"
    assert "UUID" not in json.dumps(device)
    assert set(describe_software(manager)) == SOFTWARE_KEYS


@pytest.mark.parametrize(
    ("config", "shown"),
    [
        ({"_name_or_path": "/home/alice/models/Qwen3-30B-A3B-FP8/"}, "Qwen3-30B-A3B-FP8"),
        ({"_name_or_path": "Qwen/Qwen3-8B"}, "Qwen3-8B"),
        ({}, "private-finetune"),
    ],
)
def test_a_model_folder_is_named_by_its_config_or_its_own_name_never_its_path(
    tmp_path: Path, config: dict[str, str], shown: str
) -> None:
    folder = tmp_path / "alice" / "private-finetune"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    for target in (str(folder), str(folder / "config.json")):
        assert public_name(target, target, config) == shown
    assert public_name(MODEL, f"example {MODEL}", {}) == MODEL


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
    assert {p.family for p in planned} == set(FACTORS) - {Family.MOE}
    assert all(p.make_call is not None for p in planned)
    with pytest.raises(UsageError, match=r"--plugin volta_nothing\.plugin: cannot be imported"):
        load_plugins(["volta_nothing.plugin"])


def _stand_in_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU, the ceilings' measurements and the device's description stood in."""
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


@BENCHED_PLUGINS
def test_the_command_measures_the_ceilings_then_each_planned_call(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_bench``'s glue with the GPU stood in: ceilings, plans, every call timed once."""
    _stand_in_gpu(monkeypatch)
    timed: list[tuple[Planned, int]] = []

    def stand_in(planned: Planned, budget: int, replays: int, l2: int) -> Measured:
        timed.append((planned, budget))
        assert (replays, l2) == (5, 6 << 20)
        return Measured(planned, _timing(), "CUDA graph")

    monkeypatch.setattr(bench_run, "time_planned", stand_in)
    get_plugin_manager.cache_clear()
    assert main(["bench", "--quick", "--json", "--kv-cache-dtype", "fp8_e5m2"]) == 0
    report = json.loads(capsys.readouterr().out)
    check_schema(report)
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
    assert {r["family"] for r in report["kernels"]} == {f.value for f in FACTORS} - {"MoE experts"}
    assert report["not_measured"] == []


@BENCHED_PLUGINS
def test_quick_starts_no_call_past_its_budget_and_says_which_stages_went_unmeasured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A clock that passes the budget after the fifth call: the calls after it are not run,
    and every stage of the plan is timed or listed as not measured with that reason; the
    model, given as a folder, is named by the folder's name alone."""
    _stand_in_gpu(monkeypatch)
    calls: list[Planned] = []

    def stand_in(planned: Planned, *_: Any) -> Measured:
        calls.append(planned)
        return Measured(planned, _timing(), "CUDA graph")

    monkeypatch.setattr(bench_run, "time_planned", stand_in)
    budget = bench_run.QUICK_SETTINGS.budget_s
    assert budget is not None

    def clock() -> float:
        """Seconds since the start: none until the fifth call, past the budget after it."""
        return 0.0 if len(calls) < 5 else budget + 1.0

    folder = _target("moe:qwen3.6-27b-fp8", tmp_path)
    get_plugin_manager.cache_clear()
    manager = get_plugin_manager()
    report = json.loads(
        json.dumps(
            run_bench(
                [folder],
                quick=True,
                dtype="float16",
                kv_cache_dtype="fp8_e5m2",
                manager=manager,
                clock=clock,
            )
        )
    )
    check_schema(report)
    assert len(calls) == 5 < len(report["kernels"])
    skipped = f"not run: --quick starts no call after {budget:.0f} s"
    assert all(r["notes"] == [skipped] for r in report["kernels"][5:])
    assert report["not_measured"]
    assert {r["reason"] for r in report["not_measured"]} == {skipped}
    name, raw = read_config(folder)
    plan = make_plan(
        describe_model(name, raw),
        PlanOptions(device=V100, kv_cache_dtype="fp8_e5m2"),
        manager,
    )
    printed, shapes = _stages(plan)
    timed, listed = _accounted(report, shapes)
    assert printed - timed - listed == set()
    assert timed & listed == set()
    assert report["models"] == ["Qwen3.5-MoE"]
    text = render_text(report)
    assert str(tmp_path) not in json.dumps(report) + text
    assert "alice" not in json.dumps(report) + text


def test_the_command_needs_no_devkit_nor_test_tools() -> None:
    """The bench modules import with the devkit, pytest and hypothesis unimportable: the
    command runs where only the core (and the plugins) are installed."""
    blocked = ("volta_devkit", "pytest", "hypothesis")
    modules = [
        "volta_core.cli",
        "volta_core.bench.run",
        "volta_core.bench.cases",
        "volta_core.bench.report",
        "volta_core.bench.machine",
        "volta_core.kernel_api",
    ]
    code = (
        f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
        f"import importlib\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
