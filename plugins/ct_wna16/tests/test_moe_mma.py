"""The routed experts' tensor-core GEMM (CUDA, ``mma.m8n8k4``, ``wna16_moe_mma.cu``): when it is
chosen, what the plan prints and prices, its sm_70 builds, the fallback without NVRTC and, on a
GPU, its results against float64.

On CPU (CI): the V100's choice from the cost model (decode rows unchanged, the tensor cores from
the first routed-blocks token count on the MoE layers of Qwen3.5-35B-A3B and Qwen3-30B-A3B, the
Triton routed blocks their fallback), the issue's SM70 targets at 2048 tokens, the plan's stages
and prices, every shipped build through the sm_70 gate (exact HMMA count, no spills, shared
memory, registers for the blocks an SM is meant to hold) and the launcher's refusals and
fallback. The ``gpu`` tests run both layers' full shapes at 64-4096 tokens on every int4/int8
scheme, uneven routing, an expert map, router weights on the input and a CUDA graph replay,
against the float64 step on the dequantized experts, as the device's own cubin and (``ptx70``) as
the compute_70 PTX a V100 loads, JIT-compiled by the driver (needs a CUDA 12 NVRTC).
"""

from __future__ import annotations

import math

import pytest
import torch

from volta_core import KernelPath, LayerKind, QuantLayer
from volta_core.device import V100, Device
from volta_core.kernel_api import V100_RATES, Unit, Workload
from volta_ct_wna16 import ops
from volta_ct_wna16.cuda import moe_mma
from volta_ct_wna16.dispatch import (
    MOE_BLOCKS,
    MOE_MMA,
    ExpertShape,
    expert_choice,
    expert_launch_cost,
    expert_paths,
    moe_blocks_choice,
    moe_decode_choice,
    moe_mma_launch,
    moe_mma_launches,
    packed_bytes,
    stage_cost,
)
from volta_ct_wna16.experts import ExpertWeights, experts_forward
from volta_ct_wna16.gate_configs import moe_cuda_builds
from volta_ct_wna16.launch import mma_k_tile, mma_options, mma_words
from volta_ct_wna16.layout import PackedWeights, dequantize
from volta_ct_wna16.limits import SUPPORTED_BITS
from volta_ct_wna16.routing import Blocks
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import MMA, SM70, SM70_MOE_MMA, Launch
from volta_devkit.cuda_gate import (
    MAX_BLOCK_THREADS,
    MAX_SHARED_BYTES,
    REGISTERS_PER_BLOCK,
    block_registers,
    check_cuda_config,
)
from volta_devkit.gate import assert_gate_passes

#: name: (experts, top_k, hidden, moe intermediate), the models' config.json.
LAYERS = {"Qwen3.5-35B-A3B": (256, 8, 2048, 512), "Qwen3-30B-A3B": (128, 8, 2048, 768)}
SCHEMES = [WeightScheme(b, s, g) for b in (4, 8) for s in (True, False) for g in (128, None)]
#: The SM70 FMA estimate of one layer at 2048 tokens before this kernel (ct_wna16's README).
FMA_2048_MS = {"Qwen3.5-35B-A3B": 6.57, "Qwen3-30B-A3B": 9.85}
#: As the Triton routed blocks' GPU tests: fp16 gate/up rows and SiLU product, fp32 sums.
TOLERANCE = 3e-3
#: What a Volta SM holds besides registers (CUDA C++ Programming Guide, "Compute Capabilities").
THREADS_PER_SM = 2048


def shape_of(name: str, scheme: WeightScheme) -> tuple[int, int, ExpertShape]:
    experts, top_k, hidden, inter = LAYERS[name]
    return experts, top_k, ExpertShape(hidden, inter, scheme)


# -- the choice and the plan -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_v100_takes_tensor_cores_above_the_decode_rows(name: str) -> None:
    """Up to 16 tokens the decode step as before; from 17 the tensor cores, the tile of the
    rows an expert averages, with the Triton routed blocks as the fallback; never elsewhere."""
    for scheme in SCHEMES:
        experts, top_k, shape = shape_of(name, scheme)
        for m in (*range(1, 40), 64, 255, 256, 512, 1024, 2048, 4096, 16384):
            choice = expert_choice(m, top_k, experts, (7, 0), shape)
            decode = moe_decode_choice(m, (7, 0))
            if decode is not None:
                assert (choice.kernel, choice.launch, choice.fallback) == (
                    decode.kernel,
                    decode.launch,
                    None,
                ), m
                continue
            assert choice.kernel == MOE_MMA, m
            assert choice.unit is Unit.TENSOR_CORES, m
            assert choice.launch == moe_mma_launch(m * top_k, experts), m
            triton = moe_blocks_choice(m * top_k, experts, (7, 0))
            assert choice.fallback is not None, m
            assert choice.fallback.launch == triton.launch, m
        for other in ((7, 5), (8, 0), (9, 0)):
            assert expert_choice(2048, top_k, experts, other, shape).kernel == MOE_BLOCKS
        # Without the layer's shape nothing is priced: the Triton routed blocks.
        assert expert_choice(2048, top_k, experts, (7, 0)).kernel == MOE_BLOCKS


def test_the_tile_follows_the_rows_an_expert_averages() -> None:
    assert moe_mma_launch(16 * 256, 256).block_m == 16
    assert moe_mma_launch(16 * 256 + 1, 256).block_m == 32
    assert moe_mma_launch(32 * 128, 128).block_m == 32
    assert moe_mma_launch(32 * 128 + 1, 128).block_m == 64
    assert moe_mma_launch(10**7, 1).block_m == 64
    assert moe_mma_launches((7, 0)) == tuple(row for _, row in SM70_MOE_MMA)
    assert moe_mma_launches((7, 5)) == moe_mma_launches((9, 0)) == ()


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_sm70_estimate_meets_the_issues_targets(name: str) -> None:
    """At 2048 tokens, int4 group 128: at most 0.2x the FMA estimate the README gave, and within
    2x of the larger of the layer's bytes at 900 GB/s and its FLOPs at 125 TFLOP/s. The padding
    priced: each touched expert's last block half empty."""
    experts, top_k, shape = shape_of(name, WeightScheme(4, True, 128))
    m = 2048
    choice = expert_choice(m, top_k, experts, (7, 0), shape)
    cost = expert_launch_cost(m, shape, experts, top_k, choice)
    assert choice.fallback is not None
    fma = expert_launch_cost(m, shape, experts, top_k, choice.fallback).seconds(V100_RATES)
    assert fma * 1e3 == pytest.approx(FMA_2048_MS[name], abs=0.01)
    (launch,) = cost.launches
    touched = experts * (1 - (1 - top_k / experts) ** m)
    padded = m * top_k + round(touched * choice.launch.block_m / 2)
    assert launch.flops == 2 * padded * 3 * shape.hidden * shape.inter
    seconds = cost.seconds(V100_RATES)
    assert seconds <= 0.2 * fma, (seconds, fma)
    per_expert = packed_bytes(2 * shape.inter, shape.hidden, shape.scheme) + packed_bytes(
        shape.hidden, shape.inter, shape.scheme
    )
    floor = max(
        experts * per_expert / 900e9, 2 * m * top_k * 3 * shape.hidden * shape.inter / 125e12
    )
    assert seconds <= 2 * floor, (seconds, floor)


def test_the_plan_prints_and_prices_the_tensor_core_stage() -> None:
    """The plan's experts stages for a known layer: the decode step, then the tensor cores
    needing NVRTC with the Triton routed blocks as fallback, priced both ways; without the
    expert count the Triton stages as before."""
    scheme = WeightScheme(4, True, 128)
    experts, top_k, shape = shape_of("Qwen3.5-35B-A3B", scheme)
    paths = expert_paths((7, 0), (experts, top_k, shape))
    assert [(p.stage, p.kernel, p.needs_nvrtc, p.fallback) for p in paths] == [
        ("1-16 tokens", paths[0].kernel, False, ""),
        ("17+ tokens", MOE_MMA, True, MOE_BLOCKS),
    ]
    layer = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 2048, 512, 256, 8)
    for m in (1, 16, 17, 2048):
        cost = stage_cost(layer, scheme, (7, 0), Workload(m))
        assert cost is not None
        stage = next(p for p in paths if p.stage == cost.stage)
        assert isinstance(stage, KernelPath)
        assert cost.cost.kernel == stage.kernel
        assert (cost.fallback is None) == (m <= 16)
        if cost.fallback is not None:
            assert cost.fallback.kernel == MOE_BLOCKS
            # A tie at 17 tokens (both bound by the experts' bytes), a win at 2048.
            assert cost.cost.seconds(V100_RATES) <= cost.fallback.seconds(V100_RATES)
            if m == 2048:
                assert cost.cost.seconds(V100_RATES) < 0.2 * cost.fallback.seconds(V100_RATES)
    assert [p.kernel for p in expert_paths((7, 0))][-1] == MOE_BLOCKS
    h100 = expert_paths((9, 0), (experts, top_k, shape))
    assert all(not p.needs_nvrtc for p in h100)


# -- the sm_70 gate ----------------------------------------------------------------------------

_CASES = [
    (launch, bits, zp)
    for _, launch in SM70_MOE_MMA
    for bits in SUPPORTED_BITS
    for zp in (False, True)
]


@pytest.fixture(scope="module")
def moe_reports() -> dict[tuple[str, ...], object]:
    """The gate's report of every shipped routed build, by NVRTC options (one compile each)."""
    return {b.options: check_cuda_config(b, capability=70) for b in moe_cuda_builds(V100)}


@pytest.mark.parametrize(
    ("launch", "bits", "zp"),
    _CASES,
    ids=[f"m{ln.block_m}-w{bits}{'a' if zp else 's'}" for ln, bits, zp in _CASES],
)
def test_sm70_gate_routed_tensor_core_gemm(
    moe_reports, launch: Launch, bits: int, zp: bool
) -> None:
    """Each shipped build compiles for sm_70 with no spills, at most 96 KB of shared memory, its
    products on HMMA: exactly one k-tile's (4 HMMA steps per m8n8k4, the loop body once: no
    split-K, no unrolled copy) and no FFMA-based dot; its registers let an SM hold the blocks
    the dense GEMM's row of the same tile assumes."""
    report = moe_reports[mma_options(launch, bits, zp)]
    assert_gate_passes(report)
    per_tile = 4 * (mma_k_tile(bits) // 4) * (launch.block_m // 8) * mma_words(launch)
    assert report.sass_histogram.get("HMMA", 0) == per_tile, report.sass_histogram
    assert report.sass_histogram.get("FFMA", 0) * 8 <= per_tile, report.sass_histogram
    threads = launch.num_warps * 32
    held = min(
        REGISTERS_PER_BLOCK // block_registers(report.n_regs, threads),
        THREADS_PER_SM // threads,
        MAX_SHARED_BYTES // report.shared_bytes,
    )
    assert threads <= MAX_BLOCK_THREADS
    assert held >= launch.programs_per_sm, (report.n_regs, report.shared_bytes, held)


def test_the_gate_holds_every_routed_launch() -> None:
    options = {b.options for b in moe_cuda_builds(V100)}
    assert len(options) == len(moe_cuda_builds(V100)) == len(_CASES)
    for experts in (1, 8, 128, 256):
        for pairs in (17, 512, 4096, 16384, 32768, 10**6):
            launch = moe_mma_launch(pairs, experts)
            for bits in SUPPORTED_BITS:
                for zp in (False, True):
                    assert mma_options(launch, bits, zp) in options
    assert moe_cuda_builds(Device((9, 0))) == moe_cuda_builds(Device((7, 5))) == []


# -- the launcher -------------------------------------------------------------------------------


def _tiny(bits: int = 4, symmetric: bool = True) -> ExpertWeights:
    gen = torch.Generator().manual_seed(0)
    experts, hidden, inter = 2, 64, 32

    def stacked(n: int, k: int) -> PackedWeights:
        kw = k // (32 // bits)
        qweight = torch.randint(
            -(2**31), 2**31 - 1, (experts, kw, n), generator=gen, dtype=torch.int32
        )
        scales = torch.rand(experts, 1, n, generator=gen).half()
        zeros = (
            None if symmetric else torch.randint(0, 2**bits, (experts, 1, n), generator=gen).half()
        )
        return PackedWeights(qweight, scales, zeros, n, k, bits, k)

    return ExpertWeights(stacked(2 * inter, hidden), stacked(hidden, inter))


def test_without_a_cuda_device_the_triton_blocks_serve() -> None:
    weights = _tiny()
    experts, top_k = weights.num_experts, 2
    choice = expert_choice(40, top_k, experts, (7, 0), weights.shape)
    assert choice.launch.path == MMA
    assert choice.fallback is not None
    assert ops.select_moe_launch(choice, weights.w13) == choice.fallback.launch
    triton = moe_blocks_choice(80, experts, (7, 0))
    assert ops.select_moe_launch(triton, weights.w13) == triton.launch
    assert weights.shape == ExpertShape(64, 32, WeightScheme(4, True, None))


def test_the_routed_gemm_refuses_bad_launches_before_any() -> None:
    weights = _tiny()
    x = torch.zeros(4, 64, dtype=torch.float16)
    out = torch.zeros(8, 64, dtype=torch.float16)
    launch = SM70_MOE_MMA[0][1]
    blocks = Blocks(torch.zeros(16, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 8, 2, 16)
    with pytest.raises(ValueError, match="not a tensor-core launch"):
        moe_mma.moe_mma_linear(x, weights.w13, blocks, SM70.moe, out, 2, 1, None)
    with pytest.raises(ValueError, match="not a tensor-core launch"):
        moe_mma.moe_mma_linear(x, weights.w13, blocks, SM70_MOE_MMA[1][1], out, 2, 1, None)
    with pytest.raises(ValueError, match="runs on CUDA devices"):
        moe_mma.moe_mma_linear(x, weights.w13, blocks, launch, out, 2, 1, None)


# -- on the GPU ---------------------------------------------------------------------------------


def random_experts(
    scheme: WeightScheme, experts: int, hidden: int, inter: int, seed: int
) -> ExpertWeights:
    """Random packed experts on CUDA in the kernels' layout (any word is a valid weight), scales
    sized so every layer's outputs stay near 1."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    bits = scheme.num_bits

    def stacked(n: int, k: int) -> PackedWeights:
        group = scheme.group_for(k)
        groups = -(-k // group)
        kw = -(-k // (32 // bits))
        qweight = torch.randint(
            -(2**31), 2**31 - 1, (experts, kw, n), generator=gen, device="cuda", dtype=torch.int32
        )
        spread = math.sqrt(k) * 2 ** (bits - 1) / 2
        scales = (0.5 + torch.rand(experts, groups, n, generator=gen, device="cuda")) / spread
        zeros = None
        if not scheme.symmetric:
            zeros = torch.randint(
                0, 2**bits, (experts, groups, n), generator=gen, device="cuda"
            ).half()
        return PackedWeights(qweight, scales.half(), zeros, n, k, bits, group)

    return ExpertWeights(stacked(2 * inter, hidden), stacked(hidden, inter))


def _one(pw: PackedWeights, e: int) -> PackedWeights:
    zeros = None if pw.zeros is None else pw.zeros[e]
    return PackedWeights(pw.qweight[e], pw.scales[e], zeros, pw.n, pw.k, pw.bits, pw.group)


def reference(
    weights: ExpertWeights,
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    ids: torch.Tensor,
    expert_map: torch.Tensor | None = None,
    weight_on_input: bool = False,
) -> torch.Tensor:
    """``sum_k w_k down_e(silu(gate_e(x)) up_e(x))`` in float64 on the dequantized experts."""
    m, top_k = ids.shape
    local = ids.long() if expert_map is None else expert_map[ids.long()].long()
    flat, w = local.reshape(-1), topk_weights.reshape(-1).double()
    out = torch.zeros(m, weights.hidden, dtype=torch.float64, device=x.device)
    inter = weights.inter
    for e in torch.unique(flat).tolist():
        if e < 0:
            continue
        pairs = (flat == e).nonzero().squeeze(1)
        tokens = pairs // top_k
        xe = x[tokens].double()
        if weight_on_input:
            xe = xe * w[pairs, None]
        h = xe @ dequantize(_one(weights.w13, e)).t()
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = act @ dequantize(_one(weights.w2, e)).t()
        out.index_add_(0, tokens, y if weight_on_input else y * w[pairs, None])
    return out


def random_routing(
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


def run_mma(weights: ExpertWeights, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, **kw):
    launch = moe_mma_launch(ids.numel(), weights.num_experts)
    return experts_forward(x, w, ids, weights, launch=launch, **kw)


def assert_close(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    from volta_devkit.testing import assert_rel_close

    assert out.dtype == torch.float16
    assert_rel_close(out, ref, TOLERANCE, what)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label.replace(" ", "-"))
def test_gpu_layer_shapes_every_scheme(name: str, scheme: WeightScheme) -> None:
    """The full layer on every scheme: 64-4096 tokens on int4 group 128, 256 and 2048 on the
    others (each tile of :data:`SM70_MOE_MMA` runs on both layers)."""
    experts, top_k, hidden, inter = LAYERS[name]
    weights = random_experts(scheme, experts, hidden, inter, seed=7)
    first = scheme == SCHEMES[0]
    for m in (64, 512, 2048, 4096) if first else (256, 2048):
        x = torch.randn(m, hidden, device="cuda").half()
        w, ids = random_routing(m, experts, top_k, seed=m)
        out = run_mma(weights, x, w, ids)
        assert_close(out, reference(weights, x, w, ids), f"{name} {scheme.label} m={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("ptx_arch", ["compute_70"], ids=["ptx70"])
def test_gpu_compute_70_ptx_every_tile(ptx_arch: str) -> None:
    """The V100's build, the compute_70 PTX JIT-compiled by the driver, on Qwen3-30B-A3B's layer:
    every tile of :data:`SM70_MOE_MMA`, int4 and int8, symmetric and not."""
    experts, top_k, hidden, inter = LAYERS["Qwen3-30B-A3B"]
    for scheme in (SCHEMES[0], SCHEMES[7], SCHEMES[3]):
        weights = random_experts(scheme, experts, hidden, inter, seed=13)
        m = 1024
        x = torch.randn(m, hidden, device="cuda").half()
        w, ids = random_routing(m, experts, top_k, seed=m, skew=True)
        ref = reference(weights, x, w, ids)
        for launch in (row for _, row in SM70_MOE_MMA):
            out = experts_forward(x, w, ids, weights, launch=launch, ptx_arch=ptx_arch)
            assert_close(out, ref, f"ptx70 {scheme.label} tile {launch.block_m}")


@pytest.mark.gpu
def test_gpu_uneven_routing_expert_map_and_router_on_input() -> None:
    """One expert takes every token and most take none; half the experts another rank's (the
    map sends them to -1, so some tokens get no local expert at all); the router weights on the
    input; every tile, both widths and symmetries."""
    experts, top_k, hidden, inter = 64, 8, 1024, 256
    for scheme in (SCHEMES[0], SCHEMES[7], SCHEMES[3]):
        weights = random_experts(scheme, experts, hidden, inter, seed=11)
        for m in (17, 300, 1500):
            x = torch.randn(m, hidden, device="cuda").half()
            w, ids = random_routing(m, experts, top_k, seed=m, skew=True)
            for launch in (row for _, row in SM70_MOE_MMA):
                out = experts_forward(x, w, ids, weights, launch=launch)
                ref = reference(weights, x, w, ids)
                assert_close(out, ref, f"skewed {scheme.label} m={m} tile {launch.block_m}")
            on_input = run_mma(weights, x, w, ids, weight_on_input=True)
            ref = reference(weights, x, w, ids, weight_on_input=True)
            assert_close(on_input, ref, f"router on input {scheme.label} m={m}")
        # Expert parallelism: global ids over twice the experts, the odd ones another rank's.
        global_experts = 2 * experts
        expert_map = torch.full((global_experts,), -1, dtype=torch.int32, device="cuda")
        expert_map[0::2] = torch.arange(experts, dtype=torch.int32, device="cuda")
        m = 700
        x = torch.randn(m, hidden, device="cuda").half()
        w, ids = random_routing(m, global_experts, top_k, seed=5)
        out = run_mma(weights, x, w, ids, expert_map=expert_map)
        ref = reference(weights, x, w, ids, expert_map=expert_map)
        assert_close(out, ref, f"expert map {scheme.label}")


@pytest.mark.gpu
def test_gpu_cuda_graph_replays_new_routing() -> None:
    experts, top_k, hidden, inter = 128, 8, 2048, 768
    weights = random_experts(SCHEMES[0], experts, hidden, inter, seed=3)
    m = 256
    x = torch.randn(m, hidden, device="cuda").half()
    w, ids = random_routing(m, experts, top_k, seed=1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # loads the build before the capture
        run_mma(weights, x, w, ids)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = run_mma(weights, x, w, ids)
    for replay in range(3):
        new_w, new_ids = random_routing(m, experts, top_k, seed=100 + replay)
        x.copy_(torch.randn(m, hidden, device="cuda").half())
        w.copy_(new_w)
        ids.copy_(new_ids)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, reference(weights, x, w, ids), f"graph replay {replay}")


@pytest.mark.gpu
def test_gpu_small_for_sanitizer() -> None:
    """A small step on every tile (compute-sanitizer memcheck and racecheck run this)."""
    experts, top_k, hidden, inter = 8, 2, 256, 128
    for scheme in (SCHEMES[0], SCHEMES[7]):
        weights = random_experts(scheme, experts, hidden, inter, seed=1)
        x = torch.randn(40, hidden, device="cuda").half()
        w, ids = random_routing(40, experts, top_k, seed=2, skew=True)
        for launch in (row for _, row in SM70_MOE_MMA):
            out = experts_forward(x, w, ids, weights, launch=launch)
            assert_close(out, reference(weights, x, w, ids), f"small tile {launch.block_m}")
