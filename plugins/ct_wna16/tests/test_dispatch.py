"""What :mod:`volta_ct_wna16.dispatch` says a launch costs, and the stages the estimate prices.

The expected times are written out here from the SM70 model the plugin used before dispatch
(0.6.2 ``sm70_model``: bytes at 900 GB/s, products at 125 TFLOP/s on the tensor cores or 15.7
on the FMA units), not computed by the code under test.
"""

from __future__ import annotations

import pytest

from volta_core import LayerKind, QuantLayer
from volta_core.kernel_api import V100_RATES, Unit, Workload
from volta_ct_wna16.dispatch import (
    KERNEL_NAMES,
    MOE_BLOCKS,
    MOE_DECODE,
    ExpertShape,
    expert_choice,
    expert_cost,
    expert_launch_cost,
    expert_paths,
    linear_choice,
    linear_cost,
    linear_paths,
    packed_bytes,
    stage_cost,
    table_launch,
)
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import DEQUANT_MATMUL, MMA, SM70, SM70_MMA, SM90

BANDWIDTH, TENSOR, FMA = 900e9, 125e12, 15.7e12
SHAPES = [(5120, 5120), (27648, 5120), (5120, 27648), (600, 1152), (8, 8192)]
SCHEMES = [WeightScheme(4, True, 128), WeightScheme(8, False, 64), WeightScheme(4, False, None)]


def _old_dequant_cublas(m: int, n: int, k: int, wb: int) -> float:
    """0.6.2 ``sm70_model.dequant_cublas_seconds``."""
    io = 2 * m * k + 2 * m * n
    dequant = (wb + 2 * n * k) / BANDWIDTH
    return dequant + max((2 * n * k + io) / BANDWIDTH, 2 * m * n * k / TENSOR)


def _old_mma(m: int, n: int, k: int, block_m: int, block_n: int, bits: int, wb: int) -> float:
    """0.6.2 ``sm70_model.mma_seconds``: the padded product (k-tile of 4 words)."""
    tile = 4 * (32 // bits)
    rows, cols = -(-m // block_m) * block_m, -(-n // block_n) * block_n
    flops = 2 * rows * cols * (-(-k // tile) * tile)
    return max((wb + 2 * m * k + 2 * m * n) / BANDWIDTH, flops / TENSOR)


def _old_fma(m: int, n: int, k: int, wb: int) -> float:
    """0.6.2 ``sm70_model.fma_seconds``."""
    return max((wb + 2 * m * k + 2 * m * n) / BANDWIDTH, 2 * m * n * k / FMA)


def test_the_rates_are_the_v100s() -> None:
    assert (V100_RATES.bandwidth, V100_RATES.tensor_flops, V100_RATES.fma_flops) == (
        BANDWIDTH,
        TENSOR,
        FMA,
    )


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label)
def test_each_paths_cost_is_the_old_models_time(n: int, k: int, scheme: WeightScheme) -> None:
    """Dequantize-then-cuBLAS is two launches whose serial sum is the old time exactly; the
    tensor-core GEMM counts its padded products; a Triton launch on SM70 runs on the FMA
    units."""
    bits, wb = scheme.num_bits, packed_bytes(n, k, scheme)
    for m in (1, 8, 17, 33, 64, 100, 256, 2048):
        dequant = linear_cost(m, n, k, SM70.dequant, bits, wb, (7, 0))
        assert [launch.unit for launch in dequant.launches] == [Unit.FMA, Unit.TENSOR_CORES]
        assert dequant.launches[0].flops == 0
        assert dequant.launches[0].bytes_written == 2 * n * k
        assert dequant.seconds(V100_RATES) == _old_dequant_cublas(m, n, k, wb)
        assert dequant.unit is Unit.TENSOR_CORES
        for _, launch in SM70_MMA:
            mma = linear_cost(m, n, k, launch, bits, wb, (7, 0))
            expected = _old_mma(m, n, k, launch.block_m, launch.block_n, bits, wb)
            assert mma.seconds(V100_RATES) == expected
            assert mma.unit is Unit.TENSOR_CORES
        for launch in (SM70.gemv, SM70.small, SM70.decode, SM70.gemm):
            triton = linear_cost(m, n, k, launch.scaled_for_bits(bits), bits, wb, (7, 0))
            assert triton.seconds(V100_RATES) == _old_fma(m, n, k, wb)
            assert triton.unit is Unit.FMA


def test_tensor_cores_exactly_on_the_tensor_core_and_cublas_paths() -> None:
    """On SM70 only the CUDA GEMM and dequantize-then-cuBLAS use the tensor cores; from SM80
    the Triton dot tiles do too, never a GEMV without a dot."""
    n, k, scheme = 5120, 5120, SCHEMES[0]
    wb = packed_bytes(n, k, scheme)
    for capability in ((7, 0), (7, 5), (9, 0)):
        for m in range(1, 301):
            choice = linear_choice(m, n, k, 4, wb, capability)
            launch = choice.launch
            cost = linear_cost(m, n, k, launch, 4, wb, capability)
            tensor = launch.path in (MMA, DEQUANT_MATMUL) or (
                capability >= (8, 0) and launch.use_dot
            )
            assert (choice.unit is Unit.TENSOR_CORES) == tensor, (capability, m, launch)
            assert cost.unit is choice.unit, (capability, m)
            assert cost.kernel == choice.kernel == KERNEL_NAMES[launch.path]
    assert linear_choice(1, n, k, 4, wb, (9, 0)).unit is Unit.FMA
    assert linear_choice(2, n, k, 4, wb, (9, 0)).launch == SM90.small


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("capability", [(7, 0), (7, 5), (9, 0)])
def test_every_token_count_gets_a_stage_of_the_plan(n: int, k: int, capability) -> None:
    """For 1-300 tokens the estimate's stage is the plan's stage holding that count, its cost
    the chosen kernel's, and a fallback's cost exactly where the choice needs NVRTC."""
    scheme = SCHEMES[0]
    layer = QuantLayer(LayerKind.LINEAR, "model.layers.0.mlp.up_proj", k, n)
    paths = {p.stage: p for p in linear_paths(n, k, scheme, capability)}
    wb = packed_bytes(n, k, scheme)
    for m in range(1, 301):
        cost = stage_cost(layer, scheme, capability, Workload(m))
        assert cost is not None
        path = paths[cost.stage]
        first, _, last = cost.stage.split(" ")[0].rstrip("+").partition("-")
        assert int(first) <= m
        if not cost.stage.split(" ")[0].endswith("+"):
            assert m <= int(last or first), (m, cost.stage)
        choice = linear_choice(m, n, k, 4, wb, capability)
        assert cost.cost == linear_cost(m, n, k, choice.launch, 4, wb, capability)
        assert cost.cost.kernel == path.kernel
        assert (cost.fallback is not None) == choice.needs_nvrtc == path.needs_nvrtc, m
        if choice.fallback is not None:
            fallback = linear_cost(m, n, k, choice.fallback.launch, 4, wb, capability)
            assert cost.fallback == fallback
            assert fallback.kernel == path.fallback


def test_a_workload_is_its_sequences_tokens() -> None:
    """The stage follows the step's tokens (sequences times query length)."""
    scheme, (n, k) = SCHEMES[0], SHAPES[0]
    layer = QuantLayer(LayerKind.LINEAR, "model.layers.0.mlp.up_proj", k, n)
    by_tokens = stage_cost(layer, scheme, (7, 0), Workload(64))
    assert stage_cost(layer, scheme, (7, 0), Workload(8, query_len=8)) == by_tokens
    assert by_tokens is not None
    assert by_tokens.stage == "33-256 tokens"
    past = stage_cost(layer, scheme, (7, 0), Workload(4096))
    assert past is not None
    assert past.stage == "257+ tokens"
    assert past.cost.kernel == KERNEL_NAMES[DEQUANT_MATMUL]


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label)
def test_experts_read_the_experts_their_tokens_touch(scheme: WeightScheme) -> None:
    """Bytes: ``E (1 - (1 - k/E)^m)`` experts' gate/up and down weights plus the activations
    in and out; FLOPs: gate, up and down for every routed pair, on the FMA units on SM70 (the
    Triton kernels: above 16 tokens the fallback of the tensor cores, test_moe_mma.py)."""
    hidden, inter, experts, top_k = 2048, 512, 256, 8
    shape = ExpertShape(hidden, inter, scheme)
    per_expert = packed_bytes(2 * inter, hidden, scheme) + packed_bytes(hidden, inter, scheme)
    for m in (1, 4, 16, 17, 256, 4096):
        chosen = expert_choice(m, top_k, experts, (7, 0), shape)
        cost = expert_launch_cost(m, shape, experts, top_k, chosen.fallback or chosen)
        touched = experts * (1 - (1 - top_k / experts) ** m)
        (launch,) = cost.launches
        assert launch.bytes_read == round(touched * per_expert) + 2 * m * hidden
        assert launch.bytes_written == 2 * m * hidden
        assert launch.flops == 2 * m * top_k * 3 * hidden * inter
        assert launch.unit is Unit.FMA
        assert cost.kernel == (MOE_DECODE if m <= 16 else MOE_BLOCKS)
    # One token touches top_k experts; many touch them all.
    one = expert_cost(1, hidden, inter, experts, top_k, scheme, (7, 0)).launches[0]
    assert one.bytes_read == top_k * per_expert + 2 * hidden
    many = expert_cost(4096, hidden, inter, experts, top_k, scheme, (7, 0)).launches[0]
    assert many.bytes_read == experts * per_expert + 2 * 4096 * hidden
    # The routed blocks' dot tiles run on the tensor cores from SM80.
    assert expert_cost(64, hidden, inter, experts, top_k, scheme, (9, 0)).unit is Unit.TENSOR_CORES


@pytest.mark.parametrize("capability", [(7, 0), (9, 0)])
def test_expert_stages_are_the_plans(capability) -> None:
    scheme = SCHEMES[0]
    layer = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 2048, 512, 256, 8)
    paths = {p.stage: p for p in expert_paths(capability, (256, 8, ExpertShape(2048, 512, scheme)))}
    for m in range(1, 300):
        cost = stage_cost(layer, scheme, capability, Workload(m))
        assert cost is not None
        assert cost.cost.kernel == paths[cost.stage].kernel, m
        assert (cost.fallback is not None) == paths[cost.stage].needs_nvrtc, m
    unknown = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", 2048, 512)
    assert stage_cost(unknown, scheme, capability, Workload(1)) is None


def test_the_table_launch_is_the_fallback_the_launcher_runs_without_nvrtc() -> None:
    n, k, scheme = 27648, 5120, SCHEMES[0]
    wb = packed_bytes(n, k, scheme)
    for m in (8, 16, 64, 256):
        choice = linear_choice(m, n, k, 4, wb, (7, 0))
        assert choice.launch.path == MMA
        assert choice.fallback is not None
        assert choice.fallback.launch == table_launch(m, n, k, 4, (7, 0))
        assert choice.fallback.unit is (
            Unit.TENSOR_CORES if choice.fallback.launch.path == DEQUANT_MATMUL else Unit.FMA
        )
