"""The routed experts' tensor-core GEMM (CUDA, ``mma.m8n8k4``, ``fp8_moe_mma.cu``): when a V100
takes it, what the plan prints and prices, its sm_70 builds, its loading and refusals and, on a
GPU, its results against float64.

On CPU (CI): the V100's choice from the cost model on the MoE layers of Qwen3-30B-A3B and
Qwen3.5-35B-A3B (the decode GEMVs unchanged up to 16 tokens, the tensor cores from 17, the
Triton routed blocks their fallback; never off a V100), the issue's SM70 targets at 2048
tokens, the plan's stages and prices, every shipped build through the sm_70 gate (exact HMMA
and FFMA counts, no spills, shared memory, registers for the blocks an SM is meant to hold) and
its compute_70 PTX, the loading seam and the refusals before any launch. The ``gpu`` tests run
both layers' full shapes at 17-4096 tokens (odd counts among them), block, channel and tensor
scales, odd sizes, uneven routing, an expert map with another rank's experts, the router weight
on the input, poisoned buffers and CUDA-graph replays, against float64 on the dequantized
experts: the device's own cubin, and the compute_70 PTX JIT-compiled by the driver (``ptx70``,
which needs a CUDA 12 NVRTC).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from fp8w_mma_gate import assert_tensor_core_build, tile_mmas

from volta_core import Device, LayerKind, QuantLayer
from volta_core.kernel_api import (
    V100_RATES,
    CudaBuilds,
    CudaToolkitUnavailable,
    Unit,
    Workload,
    nvrtc_build,
    with_prelude,
)
from volta_devkit.cuda_gate import check_cuda_config
from volta_devkit.testing import assert_rel_close, poison_
from volta_fp8w import experts as experts_module
from volta_fp8w.cuda import MOE_KERNEL, MOE_SOURCE, moe_mma
from volta_fp8w.cuda.launch_args import (
    check_moe_mma_launch,
    moe_mma_columns,
    moe_mma_config,
    moe_mma_groups,
    moe_mma_options,
)
from volta_fp8w.dispatch import (
    MOE_BLOCKS,
    MOE_DECODE,
    MOE_MMA,
    PRICING_BLOCK,
    expert_bytes,
    expert_choice,
    expert_launch_cost,
    expert_layer,
    expert_paths,
    moe_blocks_choice,
    moe_mma_launch,
    moe_mma_launches,
    moe_tensor_core_builds,
    stage_cost,
    touched_experts,
)
from volta_fp8w.experts import ExpertWeights, experts_forward, stack_experts
from volta_fp8w.gate_configs import cuda_builds
from volta_fp8w.layout import Fp8Weights
from volta_fp8w.scheme import Fp8Scheme
from volta_fp8w.tables import SM70, SM70_MOE_MMA, Launch

CUDA0 = torch.device("cuda", 0)
V100 = (7, 0)

#: name: (experts, top_k, hidden, moe intermediate), the models' config.json
#: (Qwen/Qwen3-30B-A3B; Qwen/Qwen3.5-35B-A3B's text config).
LAYERS = {"Qwen3-30B-A3B": (128, 8, 2048, 768), "Qwen3.5-35B-A3B": (256, 8, 2048, 512)}

#: The tensor-core rows and every build of them (gate/up with the SiLU product, and down).
ROWS = [launch for _, launch in SM70_MOE_MMA]
BUILDS = [(launch, gate_up) for launch in ROWS for gate_up in (True, False)]
BUILD_IDS = [f"m{ln.block_m}-{'gate_up' if gu else 'down'}" for ln, gu in BUILDS]

#: fp16 gate/up rows and SiLU product (as the Triton routed blocks), fp32 sums.
TOLERANCE = 3e-3


# -- the choice, the estimate and the plan -----------------------------------------------------


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_v100_takes_the_tensor_cores_above_the_decode_gemvs(name: str) -> None:
    """Up to 16 tokens the decode GEMVs as before; from 17 the tensor cores, the tile of the rows
    an expert averages, the Triton routed blocks their fallback; never off a V100, nor for a
    layer of unknown shape."""
    experts, top_k, hidden, inter = LAYERS[name]
    shape = (hidden, inter)
    for m in (*range(1, 40), 64, 255, 512, 2048, 4096, 16384):
        pairs = m * top_k
        choice = expert_choice(m, pairs, experts, V100, shape)
        if m <= SM70.moe_decode_max_m:
            assert (choice.kernel, choice.launch, choice.fallback) == (
                MOE_DECODE,
                SM70.moe_decode,
                None,
            ), m
            continue
        assert (choice.kernel, choice.unit) == (MOE_MMA, Unit.TENSOR_CORES), m
        assert choice.launch == moe_mma_launch(pairs, experts), m
        assert choice.fallback is not None
        assert choice.fallback.launch == moe_blocks_choice(pairs, experts, V100).launch, m
    for other in ((7, 5), (8, 0), (9, 0)):
        assert expert_choice(2048, 2048 * top_k, experts, other, shape).kernel == MOE_BLOCKS
    assert expert_choice(2048, 2048 * top_k, experts, V100).kernel == MOE_BLOCKS


def test_the_tile_follows_the_rows_an_expert_averages() -> None:
    assert moe_mma_launch(16 * 256, 256).block_m == 16
    assert moe_mma_launch(16 * 256 + 1, 256).block_m == 32
    assert moe_mma_launch(10**7, 1).block_m == 32
    assert moe_mma_launches(V100) == tuple(ROWS)
    assert moe_mma_launches((7, 5)) == moe_mma_launches((9, 0)) == ()
    assert moe_tensor_core_builds(V100) == BUILDS
    assert moe_tensor_core_builds((9, 0)) == []


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_sm70_estimate_meets_the_issues_targets(name: str) -> None:
    """At 2048 tokens, 128 x 128 blocks: at most 0.2x the FMA routed blocks' estimate, and within
    2x of the larger of the touched experts' bytes at 900 GB/s and the routed FLOPs at 125
    TFLOP/s (the padding priced: each touched expert's last block half empty)."""
    experts, top_k, hidden, inter = LAYERS[name]
    m = 2048
    choice = expert_choice(m, m * top_k, experts, V100, (hidden, inter))
    assert choice.kernel == MOE_MMA
    assert choice.fallback is not None
    cost = expert_launch_cost(choice, m, hidden, inter, experts, top_k, PRICING_BLOCK)
    fma = expert_launch_cost(choice.fallback, m, hidden, inter, experts, top_k, PRICING_BLOCK)
    touched = touched_experts(m, experts, top_k)
    padded = m * top_k + round(touched * choice.launch.block_m / 2)
    assert cost.flops == 2 * padded * 3 * hidden * inter
    seconds, fma_seconds = cost.seconds(V100_RATES), fma.seconds(V100_RATES)
    assert seconds <= 0.2 * fma_seconds, (seconds, fma_seconds)
    weights = touched * sum(expert_bytes(hidden, inter, PRICING_BLOCK))
    floor = max(weights / 900e9, 2 * m * top_k * 3 * hidden * inter / 125e12)
    assert seconds <= 2 * floor, (seconds, floor)


def test_the_plan_prints_and_prices_the_tensor_core_stage() -> None:
    """The plan's stages for a known layer on a V100: the decode GEMVs, then the tensor cores
    needing NVRTC with the Triton routed blocks as fallback, priced both ways (a win at 2048
    tokens); without the expert count the Triton stages as before; none needs NVRTC on an H100."""
    experts, top_k, hidden, inter = LAYERS["Qwen3.5-35B-A3B"]
    layer = QuantLayer(
        LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", hidden, inter, experts, top_k
    )
    paths = expert_paths(V100, expert_layer(layer))
    assert [(p.stage, p.kernel, p.needs_nvrtc, p.fallback) for p in paths] == [
        ("1-16 tokens", MOE_DECODE, False, ""),
        ("17+ tokens", MOE_MMA, True, MOE_BLOCKS),
    ]
    scheme = Fp8Scheme("block", (128, 128), "fp8")
    for m in (1, 16, 17, 2048):
        cost = stage_cost(layer, scheme, V100, Workload(m))
        assert cost is not None
        assert cost.stage == ("1-16 tokens" if m <= 16 else "17+ tokens")
        assert (cost.fallback is None) == (m <= 16)
        if cost.fallback is not None:
            assert cost.cost.kernel == MOE_MMA
            assert cost.fallback.kernel == MOE_BLOCKS
            assert cost.cost.seconds(V100_RATES) <= cost.fallback.seconds(V100_RATES)
            if m == 2048:
                assert cost.cost.seconds(V100_RATES) < 0.2 * cost.fallback.seconds(V100_RATES)
    assert expert_paths(V100)[-1].kernel == MOE_BLOCKS
    assert not any(p.needs_nvrtc for p in expert_paths((9, 0), expert_layer(layer)))


# -- the sm_70 builds --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports() -> dict[tuple[str, ...], object]:
    """The gate's report of every shipped routed build, by NVRTC options (one compile each)."""
    return {
        moe_mma_options(launch, gate_up): check_cuda_config(
            moe_mma_config(launch, gate_up), capability=70
        )
        for launch, gate_up in BUILDS
    }


@pytest.mark.parametrize(("launch", "gate_up"), BUILDS, ids=BUILD_IDS)
def test_sm70_gate(reports, launch: Launch, gate_up: bool) -> None:
    """Each build compiles for sm_70 with no spills and no stack, at most 96 KB of shared
    memory, registers that let an SM hold its ``programs_per_sm`` blocks, its products on HMMA
    (the k-tile loop's body once: exactly :func:`tile_mmas` products of four HMMA steps), one
    FFMA an accumulator (the scale flush; the SiLU product is FMULs and MUFUs) and no fp16
    multiply (none per weight)."""
    report = reports[moe_mma_options(launch, gate_up)]
    assert_tensor_core_build(report, launch, moe_mma_groups(launch))


def test_compute_70_ptx_holds_the_tile_products() -> None:
    """The PTX a V100 build starts from (what the ``ptx70`` GPU tests JIT) has the tile's
    products as ``mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32``, from the prelude."""
    launch = ROWS[-1]
    for gate_up in (True, False):
        options = moe_mma_options(launch, gate_up)
        ptx = nvrtc_build(with_prelude(MOE_SOURCE), MOE_KERNEL, "compute_70", options).image
        text = ptx.decode()
        assert text.count("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32") == tile_mmas(
            launch, moe_mma_groups(launch)
        )


def test_the_gate_builds_what_the_launcher_loads() -> None:
    gated = [c for c in cuda_builds(Device(V100)) if c.kernel == MOE_KERNEL]
    assert [c.options for c in gated] == [moe_mma_options(ln, gu) for ln, gu in BUILDS]
    for config in gated:
        assert config.source == moe_mma.BUILDS.source == with_prelude(MOE_SOURCE)
        assert config.block_threads == 128
        assert config.claims_tensor_cores
    assert len({c.name for c in gated}) == len(BUILDS)
    assert not [c for c in cuda_builds(Device((9, 0))) if c.kernel == MOE_KERNEL]
    # The dense GEMM's e4m3 decode and k-tile products are shared, not written again.
    for shared in ("void e4m3x4(", "void tile_products(", "void load_weights("):
        assert MOE_SOURCE.count(shared) == 1, shared


def test_launch_arguments() -> None:
    launch = ROWS[-1]
    check_moe_mma_launch(launch)
    assert moe_mma_groups(launch) == 2
    assert moe_mma_columns(launch, True) == 128
    assert moe_mma_columns(launch, False) == 256
    assert moe_mma_options(ROWS[0], True) == (
        "-DBM=16",
        "-DWARPS=4",
        "-DJ=2",
        "-DBK=32",
        "-DMIN_BLOCKS=3",
        "-DGATE_UP=1",
    )
    for bad in (
        replace(launch, block_n=128),  # one group a warp: no gate and up pair
        replace(launch, split_cost=2.0),
        replace(launch, block_n=200),
    ):
        with pytest.raises(ValueError, match="routed tensor-core launch"):
            check_moe_mma_launch(bad)


# -- loading and refusals, through the plugin's seam --------------------------------------------


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """A fresh set of builds whose loader records each build's options and succeeds, outside
    capture."""
    calls: list[tuple[str, ...]] = []

    def load(source, name, *, options=(), device=None, ptx_arch=None):
        assert (source, name, device, ptx_arch) == (moe_mma.BUILDS.source, MOE_KERNEL, CUDA0, None)
        calls.append(tuple(options))
        return object()

    monkeypatch.setattr(
        moe_mma, "BUILDS", CudaBuilds(moe_mma.BUILDS.what, moe_mma.BUILDS.source, MOE_KERNEL, load)
    )
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("VLLM_VOLTA_STRICT", raising=False)
    return calls


def test_ready_loads_gate_up_and_down_once(loads) -> None:
    assert moe_mma.ready(CUDA0, ROWS[0])
    assert moe_mma.ready(CUDA0, ROWS[0])
    assert loads == [moe_mma_options(ROWS[0], True), moe_mma_options(ROWS[0], False)]
    moe_mma.warm_up(CUDA0, ROWS)
    assert loads == [moe_mma_options(ln, gu) for ln, gu in BUILDS]


def test_the_launcher_serves_the_tensor_cores_where_they_load(loads) -> None:
    """A V100's choice runs on the tensor cores where its builds load, for fp16 activations on
    CUDA; bf16 activations and CPU tensors take the fallback without asking for the builds."""
    choice = expert_choice(40, 320, 128, V100, (2048, 768))
    assert choice.fallback is not None
    fallback = ("blocks", choice.fallback.launch)
    assert experts_module._served(choice, torch.device("cpu"), torch.float16) == fallback
    assert experts_module._served(choice, CUDA0, torch.bfloat16) == fallback
    assert loads == []
    assert experts_module._served(choice, CUDA0, torch.float16) == ("mma", choice.launch)
    assert loads == [moe_mma_options(choice.launch, gu) for gu in (True, False)]
    decode = expert_choice(4, 32, 128, V100, (2048, 768))
    assert experts_module._served(decode, CUDA0, torch.float16) == ("gemv", SM70.moe_decode)


def test_without_nvrtc_the_triton_blocks_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without NVRTC: the builds do not load (logged, no raise), so the launcher takes
    the choice's fallback."""

    def missing(*args, **kwargs):
        raise CudaToolkitUnavailable("no CUDA 12 NVRTC here")

    monkeypatch.setattr(
        moe_mma,
        "BUILDS",
        CudaBuilds(moe_mma.BUILDS.what, moe_mma.BUILDS.source, MOE_KERNEL, missing),
    )
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("VLLM_VOLTA_STRICT", raising=False)
    assert not moe_mma.ready(CUDA0, ROWS[0])
    choice = expert_choice(40, 320, 128, V100, (2048, 768))
    assert choice.kernel == MOE_MMA
    assert choice.fallback is not None
    served = experts_module._served(choice, CUDA0, torch.float16)
    assert served == ("blocks", choice.fallback.launch)


def _tiny(experts: int = 2, hidden: int = 64, inter: int = 32) -> ExpertWeights:
    codes13 = torch.zeros(experts, 2 * inter, hidden, dtype=torch.uint8)
    codes2 = torch.zeros(experts, hidden, inter, dtype=torch.uint8)
    return ExpertWeights(
        Fp8Weights(codes13, torch.ones(experts, 2 * inter, 1), 2 * inter, hidden, 1, hidden),
        Fp8Weights(codes2, torch.ones(experts, hidden, 1), hidden, inter, 1, inter),
    )


def test_refusals_before_any_launch(loads, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernels' checks on CPU tensors
    weights = _tiny()
    x = torch.randn(4, 64).half()
    act = poison_(torch.empty(8, 32, dtype=torch.float16))
    pairs = torch.zeros(16, dtype=torch.int32)
    counts = torch.zeros(2, dtype=torch.int32)
    launch = ROWS[0]

    def call(**change):
        args = {"x": x, "w": weights.w13, "launch": launch, "out": act}
        args.update(change)
        moe_mma.moe_mma_linear(
            args["x"], args["w"], pairs, counts, 8, args["launch"], args["out"], gate_up=True,
            row_div=2, router_weights=None,
        )  # fmt: skip

    with pytest.raises(ValueError, match="not a tensor-core launch"):
        call(launch=Launch("gemm", block_m=16, block_n=64, block_k=32))
    with pytest.raises(ValueError, match="runs on CUDA devices"):
        call()
    odd = Fp8Weights(weights.w13.weight, weights.w13.scales, 64, 64, 1, 96)
    with pytest.raises(ValueError, match="does not divide"):
        call(w=odd, launch=replace(launch, block_k=64))
    assert act.isnan().all()
    assert loads == []
    with pytest.raises(ValueError, match="tensor-core launch"):
        experts_forward(x, weights, torch.ones(4, 1), torch.zeros(4, 1, dtype=torch.int32),
                        path="mma", launch=SM70.moe_blocks[0])  # fmt: skip
    with pytest.raises(ValueError, match="Triton launch"):
        experts_forward(x, weights, torch.ones(4, 1), torch.zeros(4, 1, dtype=torch.int32),
                        path="blocks", launch=launch)  # fmt: skip
    # Through the experts' entry: refused before the routing's launches.
    routed: list[object] = []
    monkeypatch.setattr(experts_module, "_route", lambda *args: routed.append(args))
    with pytest.raises(ValueError, match="runs on CUDA devices"):
        experts_forward(x, weights, torch.ones(4, 1), torch.zeros(4, 1, dtype=torch.int32),
                        path="mma", launch=launch)  # fmt: skip
    assert routed == []


# -- on the GPU ------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every buffer a step leaves to the kernels starts as NaN (integers: 0xA5 bytes)."""

    def empty(shape, dtype, device):
        t = torch.empty(shape, dtype=dtype, device=device)
        if t.is_cuda and torch.cuda.is_current_stream_capturing():
            return t.fill_(float("nan") if t.is_floating_point() else -0x5A5A5A5B)
        return poison_(t)

    monkeypatch.setattr(experts_module, "_empty", empty)


def random_experts(
    experts: int, hidden: int, inter: int, strategy: str, seed: int
) -> tuple[ExpertWeights, dict[str, Any]]:
    """Fresh random e4m3fn codes on CUDA (every finite code alike) and scales whose weights'
    RMS is about ``1 / sqrt(inputs)`` (a random code's RMS is about 42), each scheme in the
    checkpoint's layout through :func:`~volta_fp8w.experts.stack_experts`; also the checkpoint
    tensors, from which the reference dequantizes independently."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def codes(n: int, k: int) -> torch.Tensor:
        c = torch.randint(0, 256, (experts, n, k), generator=gen, device="cuda", dtype=torch.uint8)
        c[(c & 0x7F) == 0x7F] -= 1  # no NaN codes
        return c

    def scales(shape: tuple[int, ...], k: int) -> torch.Tensor:
        spread = 2.0 ** (torch.rand(shape, generator=gen, device="cuda") * 2 - 1)
        return spread / (42 * math.sqrt(k))

    c13, c2 = codes(2 * inter, hidden), codes(hidden, inter)
    if strategy == "block":
        s13 = scales((experts, 2 * -(-inter // 128), -(-hidden // 128)), hidden)
        s2 = scales((experts, -(-hidden // 128), -(-inter // 128)), inter)
    elif strategy == "channel":
        s13, s2 = scales((experts, 2 * inter, 1), hidden), scales((experts, hidden, 1), inter)
    else:
        s13, s2 = scales((experts, 2), hidden), scales((experts,), inter)
    block = (128, 128) if strategy == "block" else None
    w13 = stack_experts(
        "t (w13)", c13, s13, n=2 * inter, k=hidden, strategy=strategy, block=block,
        shards=(inter, inter),
    )  # fmt: skip
    w2 = stack_experts("t (w2)", c2, s2, n=hidden, k=inter, strategy=strategy, block=block)
    tensors = {"c13": c13, "s13": s13, "c2": c2, "s2": s2, "strategy": strategy}
    return ExpertWeights(w13, w2), tensors


def _dense(codes: torch.Tensor, scales: torch.Tensor, strategy: str, shards: int) -> torch.Tensor:
    """One expert's float64 weights from its checkpoint codes and scales (``shards`` stacked
    shards of equal rows, each its own blocks or scale)."""
    values = codes.view(torch.float8_e4m3fn).double()
    n, k = values.shape
    if strategy == "block":
        rows = n // shards
        full = torch.cat(
            [part.repeat_interleave(128, 0)[:rows] for part in scales.double().chunk(shards, 0)]
        ).repeat_interleave(128, 1)[:, :k]
    elif strategy == "channel":
        full = scales.double().reshape(n, 1)
    else:
        full = scales.double().reshape(-1).repeat_interleave(n // shards).reshape(n, 1)
    return values * full


def reference(
    tensors: dict[str, Any],
    x: torch.Tensor,
    w: torch.Tensor,
    ids: torch.Tensor,
    expert_map: torch.Tensor | None = None,
    on_input: bool = False,
) -> torch.Tensor:
    """float64 ``sum_s w * down(SiLU(gate(x)) * up(x))`` over the slots with a local expert, one
    expert at a time on the GPU."""
    m, top_k = ids.shape
    local = ids.long() if expert_map is None else expert_map.long()[ids.long()]
    flat, rw = local.reshape(-1), w.reshape(-1).double()
    inter = tensors["c2"].shape[2]
    strategy = tensors["strategy"]
    out = torch.zeros(m, tensors["c2"].shape[1], dtype=torch.float64, device="cuda")
    for e in flat.unique().tolist():
        if e < 0:
            continue
        pairs = (flat == e).nonzero().squeeze(1)
        tokens = pairs // top_k
        xe = x[tokens].double() * (rw[pairs, None] if on_input else 1.0)
        h = xe @ _dense(tensors["c13"][e], tensors["s13"][e], strategy, 2).T
        y = (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ _dense(
            tensors["c2"][e], tensors["s2"][e], strategy, 1
        ).T
        out.index_add_(0, tokens, y if on_input else y * rw[pairs, None])
    return out


def routing(
    m: int, experts: int, top_k: int, seed: int, skew: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ``top_k`` distinct experts and renormalized fp32 weights; with ``skew``
    expert 0 takes every token and the other slots come from the first quarter of the experts,
    so most experts get none."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand(m, experts, generator=gen, device="cuda")
    if skew:
        scores[:, experts // 4 :] -= 2.0
        scores[:, 0] += 2.0
    ids = scores.topk(top_k, dim=-1).indices.to(torch.int32)
    w = torch.rand(m, top_k, generator=gen, device="cuda") + 0.1
    return w / w.sum(-1, keepdim=True), ids


def run_mma(
    weights: ExpertWeights, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, **kw: Any
) -> torch.Tensor:
    out = experts_forward(x, weights, w, ids, path="mma", **kw)
    torch.cuda.synchronize()
    assert out.dtype == torch.float16
    return out


@pytest.fixture(scope="module")
def layers() -> dict[str, tuple[ExpertWeights, dict[str, Any]]]:
    """Both models' layers with 128 x 128 blocks, built once."""
    return {
        name: random_experts(experts, hidden, inter, "block", seed=len(name))
        for name, (experts, _, hidden, inter) in LAYERS.items()
    }


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_gpu_layer_shapes(layers, name: str) -> None:
    """The full layers at 17-4096 tokens (odd counts among them) on the tile dispatch gives
    each on a V100, and every tile at 300 tokens."""
    experts, top_k, hidden, _ = LAYERS[name]
    weights, tensors = layers[name]
    for m in (17, 64, 300, 333, 2048, 4096):
        x = torch.randn(m, hidden, device="cuda").half()
        w, ids = routing(m, experts, top_k, seed=m)
        out = run_mma(weights, x, w, ids)
        assert_rel_close(out, reference(tensors, x, w, ids), TOLERANCE, f"{name} m={m}")
    m = 300
    x = torch.randn(m, hidden, device="cuda").half()
    w, ids = routing(m, experts, top_k, seed=7)
    ref = reference(tensors, x, w, ids)
    for launch in ROWS:
        out = run_mma(weights, x, w, ids, launch=launch)
        assert_rel_close(out, ref, TOLERANCE, f"{name} m={m} tile {launch.block_m}")


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_gpu_channel_and_tensor_scales(strategy: str) -> None:
    experts, top_k, hidden, inter = LAYERS["Qwen3-30B-A3B"]
    weights, tensors = random_experts(experts, hidden, inter, strategy, seed=3)
    for m in (17, 300):
        x = torch.randn(m, hidden, device="cuda").half()
        w, ids = routing(m, experts, top_k, seed=m + 1)
        out = run_mma(weights, x, w, ids)
        assert_rel_close(out, reference(tensors, x, w, ids), TOLERANCE, f"{strategy} m={m}")


@pytest.mark.gpu
def test_gpu_uneven_routing_expert_map_router_on_input_odd_sizes() -> None:
    """One expert takes every token and most none; an expert map sending half the global experts
    to another rank (-1), so some tokens get no local expert and sum to exactly zero; the router
    weight on the input; a hidden size not a multiple of 16 (weights read byte by byte,
    activations copied) and an intermediate one not a multiple of 8; every tile."""
    for hidden, inter in ((1024, 256), (1000, 196)):
        experts, top_k = 16, 4
        weights, tensors = random_experts(experts, hidden, inter, "block", seed=hidden)
        for m in (17, 301):
            x = torch.randn(m, hidden, device="cuda").half()
            w, ids = routing(m, experts, top_k, seed=m, skew=True)
            ref = reference(tensors, x, w, ids)
            for launch in ROWS:
                out = run_mma(weights, x, w, ids, launch=launch)
                assert_rel_close(out, ref, TOLERANCE, f"skewed {hidden} m={m} {launch.block_m}")
            on_input = run_mma(weights, x, w, ids, weight_on_input=True)
            ref = reference(tensors, x, w, ids, on_input=True)
            assert_rel_close(on_input, ref, TOLERANCE, f"router on input {hidden} m={m}")
        expert_map = torch.full((2 * experts,), -1, dtype=torch.int32, device="cuda")
        expert_map[0::2] = torch.arange(experts, dtype=torch.int32, device="cuda")
        m = 257
        x = torch.randn(m, hidden, device="cuda").half()
        w, ids = routing(m, 2 * experts, top_k, seed=5)
        ids[0] = torch.tensor([1, 3, 5, 7][:top_k], dtype=torch.int32)  # another rank's only
        out = run_mma(weights, x, w, ids, expert_map=expert_map)
        ref = reference(tensors, x, w, ids, expert_map=expert_map)
        assert_rel_close(out, ref, TOLERANCE, f"expert map {hidden}")
        assert bool((out[0] == 0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("ptx_arch", ["compute_70"], ids=["ptx70"])
def test_gpu_compute_70_ptx(layers, ptx_arch: str) -> None:
    """The V100's PTX build, JIT-compiled by the driver, on Qwen3-30B-A3B's layer."""
    experts, top_k, hidden, _ = LAYERS["Qwen3-30B-A3B"]
    weights, tensors = layers["Qwen3-30B-A3B"]
    m = 300
    x = torch.randn(m, hidden, device="cuda").half()
    w, ids = routing(m, experts, top_k, seed=9)
    ref = reference(tensors, x, w, ids)
    for launch in ROWS:
        out = run_mma(weights, x, w, ids, launch=launch, ptx_arch=ptx_arch)
        assert_rel_close(out, ref, TOLERANCE, f"ptx70 tile {launch.block_m}")


@pytest.mark.gpu
def test_gpu_cuda_graph_replays_new_tokens_and_routing(layers) -> None:
    """Loaded eagerly, captured once, replayed with other tokens, ids and weights copied into
    the captured inputs, into poisoned outputs."""
    experts, top_k, hidden, _ = LAYERS["Qwen3.5-35B-A3B"]
    weights, tensors = layers["Qwen3.5-35B-A3B"]
    m = 256
    x = torch.randn(m, hidden, device="cuda").half()
    w, ids = routing(m, experts, top_k, seed=1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_mma(weights, x, w, ids)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = experts_forward(x, weights, w, ids, path="mma")
        for replay in range(3):
            new_w, new_ids = routing(m, experts, top_k, seed=100 + replay)
            x.copy_(torch.randn(m, hidden, device="cuda").half())
            w.copy_(new_w)
            ids.copy_(new_ids)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ref = reference(tensors, x, w, ids)
            assert_rel_close(out, ref, TOLERANCE, f"graph replay {replay}")


@pytest.mark.gpu
def test_gpu_builds_load_and_dispatch_on_this_device() -> None:
    """Both rows' builds compile and load on the device (its own cubin); off a V100 dispatch
    keeps the Triton routed blocks."""
    moe_mma.warm_up(CUDA0, ROWS)
    assert all(moe_mma.ready(CUDA0, launch) for launch in ROWS)
    capability = torch.cuda.get_device_capability()
    if capability != V100:
        assert expert_choice(2048, 16384, 128, capability, (2048, 768)).kernel == MOE_BLOCKS


@pytest.mark.gpu
def test_gpu_small_for_sanitizer() -> None:
    """A small step on every tile, skewed, with an odd hidden size (compute-sanitizer memcheck
    and racecheck run this)."""
    for hidden in (256, 200):
        weights, tensors = random_experts(8, hidden, 128, "block", seed=hidden)
        x = torch.randn(40, hidden, device="cuda").half()
        w, ids = routing(40, 8, 2, seed=2, skew=True)
        for launch in ROWS:
            out = run_mma(weights, x, w, ids, launch=launch)
            ref = reference(tensors, x, w, ids)
            assert_rel_close(out, ref, TOLERANCE, f"small {hidden} tile {launch.block_m}")


# -- the benchmark's CPU-side parts (benchmarks/fp8w_moe_bench.py) ------------------------------


def test_the_benchmark_prints_dispatchs_estimates_and_marks_wrong_paths() -> None:
    import fp8w_moe_bench as bench

    assert bench.LAYERS == LAYERS
    for name in LAYERS:
        estimate = bench.sm70_estimates(name, 2048)
        assert estimate["v100_kernel"] == MOE_MMA
        assert estimate["v100_ratio"] <= 0.2
    row = {
        "layer": "Qwen3-30B-A3B",
        "m": 2048,
        **bench.sm70_estimates("Qwen3-30B-A3B", 2048),
        "triton_ms": 2.0,
        "triton_err": 1e-3,
        "mma_ms": 4.0,
        "mma_err": 0.5,
        "mma_ptx70_error": "CudaToolkitUnavailable: no compute_70",
    }
    text = bench.table([row], ("triton", "mma", "mma_ptx70"))
    assert "| Qwen3-30B-A3B | 2048 | 2.000 | 4.000 WRONG | 0.50x | err | - |" in text
    assert f"| {row['v100_mma_ms']:.3f} | {row['v100_fma_ms']:.3f} |" in text


# -- the benchmark's vLLM column on CPU: its kernels from vLLM's files, under the interpreter ---


def vllm_files() -> tuple[Path, Path] | None:
    """The venv's vLLM ``fused_moe.py`` and ``fp8_utils.py``, found without importing vLLM
    (None without vLLM)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    layers = Path(next(iter(spec.submodule_search_locations))) / "model_executor" / "layers"
    files = (
        layers / "fused_moe" / "fused_moe.py",
        layers / "quantization" / "utils" / "fp8_utils.py",
    )
    return files if all(f.is_file() for f in files) else None


needs_vllm_files = pytest.mark.skipif(vllm_files() is None, reason="vLLM is not installed")


def _bench_layer(
    experts: int, hidden: int, inter: int, m: int, top_k: int, seed: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """A small layer on CPU as the benchmark's ``random_layer`` makes one (codes, 128 x 128
    block scales), fp16 tokens and a renormalized top-k router."""
    gen = torch.Generator().manual_seed(seed)

    def codes(n: int, k: int) -> torch.Tensor:
        c = torch.randint(0, 256, (experts, n, k), generator=gen, dtype=torch.uint8)
        c[(c & 0x7F) == 0x7F] -= 1
        return c

    def scales(n: int, k: int) -> torch.Tensor:
        spread = 2.0 ** (torch.rand(experts, n // 128, k // 128, generator=gen) * 2 - 1)
        return spread / (42.0 * math.sqrt(k))

    tensors = {
        "c13": codes(2 * inter, hidden),
        "s13": scales(2 * inter, hidden),
        "c2": codes(hidden, inter),
        "s2": scales(hidden, inter),
    }
    x = torch.randn(m, hidden, generator=gen).half()
    w, ids = torch.randn(m, experts, generator=gen).softmax(-1).topk(top_k, dim=-1)
    return tensors, x, (w / w.sum(-1, keepdim=True)).contiguous(), ids.to(torch.int32)


def test_the_benchmark_routes_as_moe_align_block_size() -> None:
    """vLLM's docstring example of ``moe_align_block_size`` (block 4), every pair once in a
    block of its expert, and the one-pair blocks at ``4 * pairs <= experts``."""
    import fp8w_moe_bench as bench

    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], dtype=torch.int32)
    sorted_ids, expert_ids, post = bench.vllm_routing(ids, 5, 4)
    assert sorted_ids is not None
    assert sorted_ids.numel() == 12 + 5 * 3
    assert sorted_ids[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]
    assert (sorted_ids[16:] == 12).all()
    assert expert_ids.tolist() == [1, 2, 3, 4, -1, -1, -1]
    assert post.tolist() == [16]
    ids = torch.randint(0, 64, (300, 8), generator=torch.Generator().manual_seed(1))
    sorted_ids, expert_ids, post = bench.vllm_routing(ids.to(torch.int32), 64, 16)
    assert sorted_ids is not None
    used = sorted_ids[: int(post)]
    real = used[used < ids.numel()].long()
    assert sorted(real.tolist()) == list(range(ids.numel()))
    block_of = torch.arange(int(post)) // 16
    assert torch.equal(
        ids.reshape(-1)[real], expert_ids[block_of[used < ids.numel()]].long()
    )  # each pair in a block of its own expert
    few = bench.vllm_routing(torch.tensor([[3]], dtype=torch.int32), 8, 16)
    assert few[0] is None
    assert few[1].tolist() == [3]
    assert few[2].tolist() == [16]
    # Fewer pairs than experts (but not the one-pair blocks): at most pairs * block_m slots.
    capped = bench.vllm_routing(torch.tensor([[1, 2]], dtype=torch.int32), 7, 16)[0]
    assert capped is not None
    assert capped.numel() == 32


def test_the_benchmark_takes_vllms_tuned_configuration_beside_its_file(tmp_path: Path) -> None:
    import fp8w_moe_bench as bench

    fused_moe = tmp_path / "fused_moe.py"
    (tmp_path / "configs").mkdir()
    name = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    table = {"triton_version": "3.6", "16": {"BLOCK_SIZE_M": 16}, "2048": {"BLOCK_SIZE_M": 64}}
    (tmp_path / "configs" / name).write_text(json.dumps(table))
    assert bench.vllm_tuned_config(fused_moe, 128, 768, 1500, "NVIDIA H200 NVL") == (
        {"BLOCK_SIZE_M": 64},
        name,
    )
    assert bench.vllm_tuned_config(fused_moe, 128, 768, 20, "NVIDIA H200")[0] == {
        "BLOCK_SIZE_M": 16
    }
    assert bench.vllm_tuned_config(fused_moe, 128, 768, 20, "NVIDIA H100 80GB HBM3") is None
    assert bench.vllm_tuned_config(fused_moe, 256, 512, 20, "NVIDIA H200") is None
    files = vllm_files()
    if files is not None:  # vLLM ships both layers' H200 tables
        for layer, (experts, _, _, inter) in bench.LAYERS.items():
            tuned = bench.vllm_tuned_config(files[0], experts, inter, 2048, "NVIDIA H200")
            assert tuned is not None, layer
            assert tuned[0]["BLOCK_SIZE_M"] == 64


@needs_vllm_files
def test_the_benchmarks_default_configuration_is_vllms() -> None:
    """``vllm_default_config`` against the venv's vLLM ``get_default_config`` (in a process of
    its own: importing vLLM there leaves this one's Triton alone)."""
    import subprocess
    import sys

    import fp8w_moe_bench as bench

    ms = (1, 4, 5, 8, 9, 16, 17, 64, 65, 2048)
    code = (
        "import json, sys\n"
        "from vllm.model_executor.layers.fused_moe.fused_moe import get_default_config\n"
        f"print(json.dumps([get_default_config(m, 128, 768, 2048, 8, 'fp8_w8a8', [128, 128])"
        f" for m in {ms!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"vLLM does not import here: {done.stderr.strip()[-300:]}")
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert [bench.vllm_default_config(m) for m in ms] == theirs


@needs_vllm_files
def test_the_benchmark_takes_vllms_kernels_from_its_files(tmp_path: Path) -> None:
    """The three ``@triton.jit`` functions taken by ``ast`` into a module importing only triton,
    which imports; the files' digests and version recorded; a file without them, or one not
    given, or a GPU without e4m3 skips the column with a note."""
    import fp8w_moe_bench as bench

    files = vllm_files()
    assert files is not None
    vllm, notes = bench.vllm_peer(*files, tmp_path, (9, 0))
    assert vllm is not None
    assert notes == []
    assert vllm.version == bench.VLLM_VERSION  # the venv's wheel is the one written against
    for fn in ("fused_moe_kernel", "write_zeros_to_output", "_per_token_group_quant_fp8"):
        assert hasattr(vllm.kernels, fn)
    text = vllm.module_path.read_text()
    assert vllm.module_path.parent == tmp_path
    assert text.count("@triton.jit\n") == 3
    assert "vllm" not in "".join(
        ln for ln in text.splitlines() if ln.startswith(("import", "from"))
    )
    assert set(vllm.record()["sha256"]) == {"fused_moe.py", "fp8_utils.py"}
    assert bench.vllm_peer(files[0], None, tmp_path, (9, 0)) == (
        None,
        ["vllm: skipped, no --vllm-fp8-utils given"],
    )
    assert bench.vllm_peer(*files, tmp_path, (7, 0))[1] == [
        "vllm: skipped, this GPU has no e4m3 (below SM89)"
    ]
    empty = tmp_path / "fused_moe.py"
    empty.write_text("def fused_moe_kernel():\n    pass\n")
    none, notes = bench.vllm_peer(empty, files[1], tmp_path, (9, 0))
    assert none is None
    assert "not loaded: LookupError" in notes[0]


@needs_vllm_files
def test_the_benchmarks_vllm_quantization_in_the_interpreter(monkeypatch, tmp_path: Path) -> None:
    """vLLM's ``_per_token_group_quant_fp8`` under Triton's interpreter against torch on its own
    scales (``amax * (1 / 448)``, exact): every code equal but where the interpreter's own
    float-to-e4m3 cast errs (triton-lang/triton#8322, #11897: the carry of a mantissa rounding
    up to the next power of two dropped, ties rounded away from zero, subnormals rounded twice),
    which a GPU's conversion does not."""
    import fp8w_moe_bench as bench

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    files = vllm_files()
    assert files is not None
    vllm = bench.load_vllm_kernels(*files, tmp_path)
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(3)).half()
    x[0, :128] = 0  # a zero group: eps's scale
    q, s = bench.vllm_quant(vllm, x, bench.poisoning_empty)
    groups = x.float().view(64, 4, 128)
    amax = groups.abs().amax(-1).clamp_min(bench.VLLM_QUANT_EPS)
    assert torch.equal(s, amax * (1.0 / bench.E4M3_MAX))
    y = (groups / s[..., None]).view(64, 512)
    ours = y.clamp(-bench.E4M3_MAX, bench.E4M3_MAX).to(torch.float8_e4m3fn).float()
    got = q.float()
    off = got != ours
    assert int(off.sum()) < 0.05 * off.numel()
    o, g, v = ours[off], got[off], y[off]
    carry = (g * 2 == o) & (o.abs().log2() == o.abs().log2().round())
    tie = (g - v).abs() == (o - v).abs()
    subnormal = v.abs() < 2.0**-6
    assert bool((carry | tie | subnormal).all())


@needs_vllm_files
@pytest.mark.parametrize(
    ("m", "top_k", "capability"),
    [(8, 2, (9, 0)), (8, 2, (8, 9)), (1, 1, (9, 0)), (70, 2, (9, 0))],
    ids=["swap_ab", "plain", "one_pair_blocks", "block_m64"],
)
def test_the_benchmarks_vllm_launches_in_the_interpreter(
    monkeypatch, tmp_path: Path, m: int, top_k: int, capability: tuple[int, int]
) -> None:
    """vLLM's ``fused_moe_kernel`` launched by the benchmark under the interpreter on a small
    layer (4 experts, hidden 256, intermediate 128), the tokens quantized by torch (the
    interpreter's e4m3 cast errs, see above): each GEMM into poisoned buffers against float64 on
    its own e4m3 operands (fp16 outputs), and the whole step against the benchmark's float64
    reference within :data:`VLLM_TOLERANCE`; the default configuration's tiles (16 x 64 with
    SWAP_AB on SM90 at 8 tokens, 64 x 128 at 70), and the one-pair blocks of 1 token."""
    import fp8w_bench
    import fp8w_moe_bench as bench

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    files = vllm_files()
    assert files is not None
    vllm = bench.load_vllm_kernels(*files, tmp_path)
    tensors, x, w, ids = _bench_layer(4, 256, 128, m, top_k, seed=m)
    layer = bench.vllm_layout(tensors)
    config = bench.vllm_default_config(m)
    swap = bench.vllm_swap_ab(config, capability)
    assert swap == (capability == (9, 0) and m <= 64)
    blocks = bench.vllm_routing(ids, 4, config["BLOCK_SIZE_M"])
    assert (blocks[0] is None) == (m * top_k * 4 <= 4)
    quant = fp8w_bench.quant_groups

    def dense(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return codes.view(torch.float8_e4m3fn).double() * scales.double().repeat_interleave(
            128, 0
        ).repeat_interleave(128, 1)

    flat = ids.reshape(-1).long()
    tokens = torch.arange(m).repeat_interleave(top_k)
    xq, xs = quant(x)
    gate_up = bench.poisoning_empty((m, top_k, 256), torch.float16, "cpu")
    bench.vllm_gemm(
        vllm, xq, xs, layer["w13"], layer["w13_scale"], gate_up, w, blocks, top_k, False,
        config, swap,
    )  # fmt: skip
    xd = fp8w_bench.dequant_groups(xq, xs).double()
    want = torch.stack(
        [
            xd[t] @ dense(tensors["c13"][e], tensors["s13"][e]).T
            for t, e in zip(tokens.tolist(), flat.tolist(), strict=True)
        ]
    )
    assert_rel_close(gate_up.view(-1, 256), want, 2e-3, "gate/up")
    aq, a_s = quant(torch.randn(m * top_k, 128, generator=torch.Generator().manual_seed(5)).half())
    down = bench.poisoning_empty((m, top_k, 256), torch.float16, "cpu")
    bench.vllm_gemm(
        vllm, aq, a_s, layer["w2"], layer["w2_scale"], down, w, blocks, 1, True, config, swap
    )
    ad = fp8w_bench.dequant_groups(aq, a_s).double()
    want = torch.stack(
        [
            w.reshape(-1)[p].double() * (ad[p] @ dense(tensors["c2"][e], tensors["s2"][e]).T)
            for p, e in enumerate(flat.tolist())
        ]
    )
    assert_rel_close(down.view(-1, 256), want, 2e-3, "down")
    out = bench.vllm_step(vllm, layer, x, w, blocks, config, swap, bench.poisoning_empty, quant)
    ref = bench.reference(tensors, x, w, ids)
    assert bench.rel_error(out, ref) <= bench.VLLM_TOLERANCE


def test_the_benchmarks_table_shows_vllms_error_against_its_own_tolerance() -> None:
    import fp8w_moe_bench as bench

    row = {
        "layer": "Qwen3-30B-A3B",
        "m": 2048,
        **bench.sm70_estimates("Qwen3-30B-A3B", 2048),
        "triton_ms": 2.0,
        "triton_err": 1e-3,
        "route_ms": 0.01,
        "vllm_ms": 1.0,
        "vllm_err": 0.05,  # past ours' tolerance, within e4m3 activations'
        "vllm_config": {"BLOCK_SIZE_M": 64},
        "vllm_tuned_ms": 0.5,
        "vllm_tuned_err": 0.2,
        "vllm_tuned_config": {"BLOCK_SIZE_M": 64},
    }
    paths = ("triton", *bench.vllm_paths([row]))
    assert paths == ("triton", "vllm", "vllm_tuned")
    lines = bench.table([row], paths).splitlines()
    assert lines[0].startswith(
        "| layer | M | triton ms | vllm ms | vllm x | vllm err | vllm_tuned ms | vllm_tuned x "
        "| vllm_tuned err | route ms |"
    )
    assert "| 2.000 | 1.000 | 2.00x | 0.050 | 0.500 WRONG | 4.00x | 0.200 | 0.010 |" in lines[2]
    assert bench.vllm_paths([{"layer": "x"}]) == ()
    failed = {k: v for k, v in row.items() if k not in ("vllm_ms", "vllm_err")}
    failed["vllm_error"] = "OutOfResources: shared memory"
    assert "| 2.000 | err | - | err |" in bench.table([failed], ("triton", "vllm"))
