"""The dispatch contract (:mod:`volta_core.host.dispatch`) and the ``volta_kernel_cost`` hook.

A plugin's dispatch answers which kernel runs a call and what it costs; the plan prints the
kernels (``volta_kernel_paths``) and the estimate prices them (``volta_kernel_cost``) from that
one answer. Here: the contract's arithmetic against hand-computed rooflines, the stage walk,
the hook's answer check, and the estimate using exactly the unit and cost the serving plugin
gives (its fallback's where NVRTC is missing), while vLLM's own layers keep the host's model.
"""

from __future__ import annotations

from typing import Any

import pytest

from volta_core import V100, AttentionLayer, Device, QuantLayer
from volta_core.host.dispatch import (
    V100_RATES,
    Choice,
    KernelCost,
    LaunchCost,
    StageCost,
    Unit,
    Workload,
    kernel_paths,
    stage_of,
    stage_ranges,
    token_stage,
)
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import KernelPath, QuantClaim, QuantConfig, QuantMethodSpec
from volta_core.planner import plan as plan_module
from volta_core.planner.capacity import SpeedRequest, assess
from volta_core.planner.fit import FitOptions
from volta_core.planner.model import describe_model, read_config
from volta_core.planner.plan import PlanOptions, make_plan

GB = 1e9


def test_a_launch_is_the_larger_of_its_bytes_and_its_arithmetic() -> None:
    memory_bound = LaunchCost(900_000_000, 0, 10**9, Unit.FMA)
    assert memory_bound.seconds(V100_RATES) == pytest.approx(1e-3)
    assert memory_bound.bound(V100_RATES) == "HBM"
    fma_bound = LaunchCost(0, 9_000, 157 * 10**9, Unit.FMA)
    assert fma_bound.seconds(V100_RATES) == pytest.approx(0.01)
    assert fma_bound.bound(V100_RATES) == "FMA"
    tensor = LaunchCost(0, 0, 125 * 10**9, Unit.TENSOR_CORES)
    assert tensor.seconds(V100_RATES) == pytest.approx(1e-3)


def test_a_kernel_cost_sums_its_launches_in_turn() -> None:
    dequant = LaunchCost(450_000_000, 450_000_000, 0, Unit.FMA)
    gemm = LaunchCost(450_000_000, 0, 250 * 10**9, Unit.TENSOR_CORES)
    cost = KernelCost("dequantize, then cuBLAS", (dequant, gemm))
    assert cost.seconds() == pytest.approx(1e-3 + 2e-3)
    assert cost.bytes == 1_350_000_000
    assert cost.flops == 250 * 10**9
    assert cost.unit is Unit.TENSOR_CORES
    assert cost.bound() == "tensor cores"
    with pytest.raises(ValueError, match="at least one launch"):
        KernelCost("nothing", ())


def test_a_stage_cost_serves_its_fallback_without_nvrtc() -> None:
    cuda = KernelCost("cuda", (LaunchCost(1, 0, 1, Unit.TENSOR_CORES),))
    triton = KernelCost("triton", (LaunchCost(1, 0, 1, Unit.FMA),))
    assert StageCost("prefill", cuda, triton).serving(nvrtc=False) is triton
    assert StageCost("prefill", cuda, triton).serving(nvrtc=True) is cuda
    assert StageCost("decode", triton).serving(nvrtc=False) is triton


@pytest.mark.parametrize(("sequences", "query_len", "context"), [(0, 1, 0), (1, 0, 0), (1, 1, -1)])
def test_a_workload_has_work(sequences: int, query_len: int, context: int) -> None:
    with pytest.raises(ValueError, match="workload"):
        Workload(sequences, query_len, context)
    assert Workload(3, 4, 10).tokens == 12


def _choice(m: int) -> Choice[int]:
    """FMA up to 7 tokens, tensor cores (Triton fallback) for 8-256, then dequantize."""
    triton = Choice("Triton", Unit.FMA, m)
    if m < 8:
        return triton
    if m <= 256:
        return Choice("tensor cores", Unit.TENSOR_CORES, m, fallback=triton)
    return Choice("dequantize", Unit.TENSOR_CORES, m)


def test_stage_ranges_group_equal_kernels_and_name_them() -> None:
    runs = stage_ranges(range(1, 258), _choice, open_ended=True)
    assert [(first, last) for first, last, _ in runs] == [(1, 7), (8, 256), (257, None)]
    assert [stage_of(m, runs) for m in (1, 7, 8, 256, 257, 10_000)] == [0, 0, 1, 1, 2, 2]
    paths = kernel_paths(runs, token_stage)
    assert paths == [
        KernelPath("1-7 tokens", "Triton", unit="FMA"),
        KernelPath(
            "8-256 tokens",
            "tensor cores",
            needs_nvrtc=True,
            fallback="Triton",
            unit="tensor cores",
            fallback_unit="FMA",
        ),
        KernelPath("257+ tokens", "dequantize", unit="tensor cores"),
    ]
    closed = stage_ranges(range(1, 9), _choice)
    assert closed[-1][:2] == (8, 8)
    assert token_stage(1, 1) == "1 token"
    assert token_stage(8, 8, "query token") == "8 query tokens"
    with pytest.raises(ValueError, match="none of the stages"):
        stage_of(0, runs)


# -- the hook ---------------------------------------------------------------------------------

LAYER = AttentionLayer("l", 128, 8, 2, "float16", "auto")
TENSOR = KernelCost("tensor cores (CUDA)", (LaunchCost(10, 0, 10**6, Unit.TENSOR_CORES),))
FMA = KernelCost("Triton", (LaunchCost(10, 0, 10**6, Unit.FMA),))


def test_only_the_serving_plugin_is_asked_for_a_cost(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    asked: list[Workload] = []

    def cost(**kwargs: Any) -> StageCost:
        asked.append(kwargs["work"])
        return StageCost("decode", TENSOR, FMA)

    manager.register(fake_plugin(volta_kernel_cost=cost), "owner")
    manager.register(fake_plugin(volta_kernel_cost=lambda **_: 1 / 0), "bystander")
    work = Workload(2, 1, 100)
    assert manager.kernel_cost("owner", LAYER, "VOLTA", V100, None, work) == StageCost(
        "decode", TENSOR, FMA
    )
    assert manager.kernel_cost("nobody", LAYER, "VOLTA", V100, None, work) is None
    assert asked == [work]
    assert manager.faults == []


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ("fast", "expected StageCost or None"),
        (StageCost("", FMA), "empty stage"),
        (StageCost("decode", "Triton"), "cost is 'Triton'"),  # type: ignore[arg-type]
        (
            StageCost("decode", KernelCost("k", (LaunchCost(-1, 0, 0, Unit.FMA),))),
            "negative count",
        ),
        (
            StageCost("decode", KernelCost("k", (LaunchCost(1, 0, 1.5, Unit.FMA),))),  # type: ignore[arg-type]
            "flops is 1.5",
        ),
        (StageCost("decode", KernelCost("k", ((1, 0, 0),))), "not a LaunchCost"),  # type: ignore[arg-type]
    ],
)
def test_a_wrong_cost_disables_the_plugin(
    manager: VoltaPluginManager, fake_plugin: Any, answer: Any, error: str
) -> None:
    manager.register(fake_plugin(volta_kernel_cost=answer), "wrong")
    assert manager.kernel_cost("wrong", LAYER, "VOLTA", V100, None, Workload(1)) is None
    (fault,) = manager.faults
    assert (fault.plugin, fault.hook) == ("wrong", "volta_kernel_cost")
    assert error in fault.error


# -- the estimate reads the serving plugin's cost -------------------------------------------

W4_BYTES_PER_WEIGHT = 0.5


def _w4_plugin(fake_plugin: Any) -> Any:
    """Claims every linear module of a W4A16 checkpoint; tensor cores from 8 tokens."""

    def claim(config: QuantConfig, layer: QuantLayer, device: Device) -> QuantClaim | None:
        return QuantClaim("w4", "m:W4") if layer.output_size and layer.input_size else None

    def paths(layer: Any, served_by: str, device: Device, quant: Any) -> list[KernelPath]:
        runs = stage_ranges(range(1, 258), _choice, open_ended=True)
        return kernel_paths(runs, token_stage)

    def cost(layer: Any, served_by: str, device: Device, quant: Any, work: Workload) -> StageCost:
        runs = stage_ranges(range(1, 258), _choice, open_ended=True)
        first, last, chosen = runs[stage_of(work.tokens, runs)]
        weights = int(layer.output_size * layer.input_size * W4_BYTES_PER_WEIGHT)
        flops = 2 * work.tokens * layer.output_size * layer.input_size

        def priced(choice: Choice[int]) -> KernelCost:
            return KernelCost(choice.kernel, (LaunchCost(weights, 0, flops, choice.unit),))

        fallback = priced(chosen.fallback) if chosen.fallback else None
        return StageCost(token_stage(first, last), priced(chosen), fallback)

    return fake_plugin(
        volta_quant_methods=[QuantMethodSpec("w4", "m:W4")],
        volta_quant_method=claim,
        volta_kernel_paths=paths,
        volta_kernel_cost=cost,
    )


def _estimate(manager: VoltaPluginManager, batch: int) -> Any:
    name, raw = read_config("qwen3.5-27b-w4a16")
    model = describe_model(name, raw)
    plan = make_plan(model, PlanOptions(device=V100), manager)
    request = SpeedRequest(batch=batch, context=1024)
    capacity = assess(plan, model, raw, FitOptions(max_model_len=4096), request, manager, None)
    return plan, capacity.speed


@pytest.mark.parametrize(("batch", "unit"), [(1, "FMA"), (16, "tensor cores")])
def test_the_estimate_prices_the_serving_plugins_kernel(
    manager: VoltaPluginManager, fake_plugin: Any, monkeypatch: Any, batch: int, unit: str
) -> None:
    manager.register(_w4_plugin(fake_plugin), "w4plugin")
    monkeypatch.setattr(plan_module, "nvrtc_found", lambda: ("12.9", ""))
    plan, speed = _estimate(manager, batch)
    served = [k for k in speed.kernels if k.served_by == "w4plugin"]
    down = next(k for k in served if k.module.endswith("mlp.down_proj"))
    assert down.unit == unit
    assert len(down.layers) == 64
    # 5120 x 17408 at half a byte a weight, on each of the 64 layers.
    assert down.bytes == 64 * 5120 * 17408 // 2
    flops = 64 * 2 * batch * 5120 * 17408
    assert down.flops == flops
    rate = 125e12 if unit == "tensor cores" else 15.7e12
    assert down.seconds == pytest.approx(max(down.bytes / 900e9, flops / rate))
    printed = {q.prefix: q.kernel_paths for q in plan.quant}
    for line in served:
        (path,) = [p for p in printed[line.module] if p.stage == line.stage]
        assert (line.kernel, line.unit) == (path.kernel, path.unit)
    # The MLP term holds the served projections and nothing beside them.
    mlp = next(t for t in speed.terms if t.kernel == "MLP")
    assert mlp.bytes == sum(k.bytes for k in served if k.term == "MLP")


def test_without_nvrtc_the_estimate_prices_the_fallback(
    manager: VoltaPluginManager, fake_plugin: Any, monkeypatch: Any
) -> None:
    manager.register(_w4_plugin(fake_plugin), "w4plugin")
    monkeypatch.setattr(plan_module, "nvrtc_found", lambda: (None, "cuda-bindings is missing"))
    _, speed = _estimate(manager, 16)
    assert not speed.nvrtc
    served = [k for k in speed.kernels if k.served_by == "w4plugin"]
    assert {(k.kernel, k.unit) for k in served} == {("Triton", "FMA")}


def test_layers_nobody_serves_keep_the_hosts_model(manager: VoltaPluginManager) -> None:
    _, speed = _estimate(manager, 16)
    assert {k.served_by for k in speed.kernels} == {"vLLM"}
    attention = next(k for k in speed.kernels if k.term == "paged attention (KV reads)")
    assert (attention.kernel, attention.unit) == ("TRITON_ATTN", "FMA")
    mlp = next(k for k in speed.kernels if k.term == "MLP")
    assert (mlp.kernel, mlp.unit) == ("cuBLAS", "tensor cores")


def test_the_device_rates_are_stated_once() -> None:
    from volta_core.planner.estimate import SpeedAssumptions

    rates = SpeedAssumptions().rates()
    assert (rates.bandwidth, rates.tensor_flops, rates.fma_flops) == (
        V100_RATES.bandwidth,
        V100_RATES.tensor_flops,
        V100_RATES.fma_flops,
    )
