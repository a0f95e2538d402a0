"""Dispatch's answers without a device: the table's launch per token count, what launches cost,
the tiles fitted to a layer, and the builds the compile gate checks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from volta_core import LayerKind, QuantLayer
from volta_core.kernel_api import V100_RATES, DeviceFacts, Unit, Workload
from volta_fp8w.dispatch import (
    KERNEL_NAMES,
    MMA_MIN_M,
    linear_choice,
    linear_cost,
    linear_paths,
    mma_launch,
    stage_cost,
    table_choice,
    table_launch,
    tensor_core_builds,
    triton_builds,
    triton_unit,
)
from volta_fp8w.launch import fitted, split_count
from volta_fp8w.scheme import Fp8Scheme
from volta_fp8w.tables import (
    DECODE_MAX_M,
    DEQUANT_MATMUL,
    GEMM,
    MMA,
    SM70,
    SM70_MMA,
    SM90,
    SPLITK,
    Launch,
    table_for,
)

V100 = (7, 0)
H100 = (9, 0)
BLOCK = (128, 128)
CHANNEL = Fp8Scheme("channel", None, "compressed-tensors")


@pytest.mark.parametrize("capability", [V100, (7, 5), (8, 0), H100])
def test_table_launch_by_token_count(capability: tuple[int, int]) -> None:
    table = table_for(capability)
    assert table_launch(1, 4096, 4096, capability) == table.gemv
    for m in range(2, DECODE_MAX_M + 1):
        assert table_launch(m, 4096, 4096, capability) == table.small
    assert table.dequant_from is not None
    for m in range(DECODE_MAX_M + 1, table.dequant_from):
        assert table_launch(m, 4096, 4096, capability) == table.gemm
    for m in (table.dequant_from, 4096):
        assert table_launch(m, 4096, 4096, capability) == table.dequant


def test_sm70_choices_name_their_kernel_and_unit() -> None:
    """On SM70 every Triton launch multiplies on the FMA units; dequantize-then-cuBLAS on the
    tensor cores. From SM80 the dot launches move to the tensor cores, the 1-token GEMV not."""
    for m, path, unit in ((1, SPLITK, Unit.FMA), (5, SPLITK, Unit.FMA), (20, GEMM, Unit.FMA)):
        choice = table_choice(m, 4096, 4096, V100)
        assert (choice.launch.path, choice.unit) == (path, unit)
        assert choice.kernel == KERNEL_NAMES[path]
        assert choice.fallback is None
    assert table_choice(64, 4096, 4096, V100).unit is Unit.TENSOR_CORES
    assert triton_unit(SM90.gemv, H100) is Unit.FMA
    assert triton_unit(SM90.small, H100) is Unit.TENSOR_CORES
    assert triton_unit(SM90.gemm, H100) is Unit.TENSOR_CORES
    assert set(KERNEL_NAMES) == {SPLITK, GEMM, DEQUANT_MATMUL, MMA}


@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (27648, 5120), (5120, 27648), (768, 2048)])
def test_a_v100_takes_the_tensor_cores_from_eight_tokens(n: int, k: int) -> None:
    """Below :data:`MMA_MIN_M` the GEMVs (memory-bound, one byte a weight); from there on the
    tensor-core GEMM wherever the V100 model prices it no higher than the table's launch, with
    the table's choice as the fallback where NVRTC is missing: at 8 tokens both read the same
    bytes (a tie goes to the tensor cores), above that the FMA GEMM and dequantize-then-cuBLAS
    cost more. Off the V100 the table's launch, no CUDA build."""
    for m in range(1, MMA_MIN_M):
        assert linear_choice(m, n, k, V100) == table_choice(m, n, k, V100)
    for m in (MMA_MIN_M, 9, 16, 17, 33, 256, 257, 2048):
        choice = linear_choice(m, n, k, V100)
        assert choice.launch == mma_launch(m)
        assert choice.unit is Unit.TENSOR_CORES
        assert choice.fallback == table_choice(m, n, k, V100)
        mma = linear_cost(choice.launch, m, n, k, BLOCK).seconds(V100_RATES)
        table = linear_cost(choice.fallback.launch, m, n, k, BLOCK).seconds(V100_RATES)
        assert mma <= table, (m, mma, table)
    for capability in ((7, 5), H100):
        for m in (1, 8, 64, 2048):
            assert linear_choice(m, n, k, capability) == table_choice(m, n, k, capability)


def test_tensor_core_rows_by_token_count() -> None:
    assert [mma_launch(m) for m in (8, 16)] == [SM70_MMA[0][1]] * 2
    assert mma_launch(17) == SM70_MMA[1][1]
    assert mma_launch(256) == mma_launch(4096) == SM70_MMA[-1][1]
    assert tensor_core_builds(V100) == [launch for _, launch in SM70_MMA]
    assert tensor_core_builds((7, 5)) == tensor_core_builds(H100) == []


def test_plan_paths_are_the_launchers_choices() -> None:
    """The plan's stages walk :func:`linear_choice`: contiguous ranges from one token, open
    above the last; each stage's kernel and fallback are the choice's at every count in it."""
    n, k = 5120, 27648
    paths = linear_paths(n, k, V100)
    assert paths[0].stage in ("1 token", f"1-{MMA_MIN_M - 1} tokens")
    assert paths[-1].stage.endswith("+ tokens")
    firsts = [int(p.stage.split()[0].split("-")[0].rstrip("+")) for p in paths]
    assert firsts == sorted(firsts)
    for path, first in zip(paths, firsts, strict=True):
        choice = linear_choice(first, n, k, V100)
        assert path.kernel == choice.kernel
        assert path.needs_nvrtc is (choice.fallback is not None)
        if choice.fallback is not None:
            assert path.fallback == choice.fallback.kernel
    assert any(p.kernel == KERNEL_NAMES[MMA] for p in paths)
    assert all(p.kernel != KERNEL_NAMES[MMA] for p in linear_paths(n, k, H100))


@pytest.mark.parametrize("scheme", [Fp8Scheme("block", (128, 128), "fp8"), CHANNEL])
@pytest.mark.parametrize("m", [1, 4, 8, 64, 2048])
def test_stage_cost_prices_the_chosen_launch_and_its_fallback(scheme, m: int) -> None:
    layer = QuantLayer(LayerKind.LINEAR, "model.layers.0.mlp.down_proj", 17408, 5120)
    stage = stage_cost(layer, scheme, V100, Workload(sequences=m))
    assert stage is not None
    choice = linear_choice(m, 5120, 17408, V100)
    block = scheme.block or (1, 17408)
    assert stage.cost == linear_cost(choice.launch, m, 5120, 17408, block)
    if choice.fallback is None:
        assert stage.fallback is None
    else:
        assert stage.fallback == linear_cost(choice.fallback.launch, m, 5120, 17408, block)
    [path] = [p for p in linear_paths(5120, 17408, V100) if p.stage == stage.stage]
    assert path.kernel == choice.kernel
    assert (
        stage_cost(QuantLayer(LayerKind.LINEAR, "x", 0, 0), scheme, V100, Workload(sequences=1))
        is None
    )


def test_costs_count_bytes_and_flops() -> None:
    m, n, k = 4, 4096, 4096
    scales = 4 * (n // 128) * (k // 128)
    one_split = replace(SM70.small, programs_per_sm=0)
    cost = linear_cost(one_split, m, n, k, BLOCK)
    (launch,) = cost.launches
    assert launch.bytes_read == n * k + scales + 2 * m * k
    assert launch.bytes_written == 2 * m * n
    assert launch.flops == 2 * m * n * k
    assert launch.unit is Unit.FMA
    split = linear_cost(SM70.small, m, n, k, BLOCK)
    splits = split_count(n, k, SM70.small, 80, m)[0]
    assert splits > 1
    assert split.bytes == cost.bytes + 4 * m * n * (splits + 2)
    dequant = linear_cost(SM70.dequant, 64, n, k, BLOCK)
    first, second = dequant.launches
    assert (first.bytes_read, first.bytes_written, first.flops) == (n * k + scales, 2 * n * k, 0)
    assert second.bytes_read == 2 * n * k + 2 * 64 * k
    assert second.unit is Unit.TENSOR_CORES
    assert dequant.unit is Unit.TENSOR_CORES


def test_costs_are_positive_and_grow_with_the_work() -> None:
    for launch in (SM70.gemv, SM70.small, SM70.gemm, SM70.dequant, SM90.gemm):
        costs = [
            linear_cost(launch, m, n, k, BLOCK).seconds(V100_RATES)
            for m, n, k in ((1, 1024, 1024), (8, 1024, 1024), (8, 4096, 1024), (8, 4096, 4096))
        ]
        assert costs[0] > 0
        assert costs == sorted(costs), launch
    by_m = [linear_cost(SM70.gemm, m, 4096, 4096, BLOCK).seconds() for m in (9, 16, 32)]
    assert by_m == sorted(by_m)
    scales = [linear_cost(SM70.gemv, 1, 4096, 4096, b).bytes for b in ((128, 128), (1, 128))]
    assert scales[1] - scales[0] == 4 * (4096 - 32) * 32


def test_dequantize_then_cublas_against_the_fma_gemm_on_a_v100() -> None:
    """At V100 rates the two launches (one pass over ``W`` in fp16 and back, then the tensor
    cores) cost less than the FMA GEMM at many tokens, more at few."""
    n = k = 4096
    for m, cheaper in ((256, True), (DECODE_MAX_M + 1, False)):
        gemm = linear_cost(SM70.gemm, m, n, k, BLOCK).seconds(V100_RATES)
        dequant = linear_cost(SM70.dequant, m, n, k, BLOCK).seconds(V100_RATES)
        assert (dequant < gemm) == cheaper, m


def test_mma_cost_pads_the_tokens() -> None:
    mma = Launch(MMA, block_m=16, block_n=256, block_k=32)
    cost = linear_cost(mma, 3, 4096, 4096, BLOCK, DeviceFacts(V100, 80))
    assert cost.flops == 2 * 16 * 4096 * 4096
    assert cost.unit is Unit.TENSOR_CORES


def test_tiles_fit_the_scale_blocks() -> None:
    for block_k, tile in ((32, 32), (64, 64), (96, 32), (128, 128), (192, 64), (4096, 128)):
        assert fitted(SM70.gemv, block_k, 4096).block_k == tile
        assert fitted(SM70.small, block_k, 4095).block_k == tile
    assert fitted(SM70.gemv, 128, 4095).block_k == 32
    assert fitted(SM70.gemm, 128, 4095) is SM70.gemm


def test_split_count() -> None:
    """Enough programs for every SM, splits on whole tiles, never shorter than a tile."""
    splits, per_split = split_count(4096, 4096, SM70.gemv, 80)
    assert per_split % SM70.gemv.block_k == 0
    assert splits == -(-4096 // per_split)
    assert splits * 4096 // SM70.gemv.block_n >= SM70.gemv.programs_per_sm * 80
    assert split_count(4096, 100, SM70.gemv, 80) == (1, 128)
    assert split_count(64, 640, SM70.gemv, 80) == (5, 128)
    assert split_count(64, 640, SM70.gemv, 80, m=0) == (5, 128)


@pytest.mark.parametrize("capability", [V100, H100])
def test_builds_are_distinct_and_cover_every_table_launch(capability: tuple[int, int]) -> None:
    builds = triton_builds(capability)
    assert builds
    assert len(builds) == len(set(builds))
    table = table_for(capability)
    configs = {(b.kernel.rsplit(":", 1)[1], dict(b.constexprs)["BLOCK_K"]) for b in builds}
    for launch, kernel in (
        (table.gemv, "fp8w_splitk_kernel"),
        (table.small, "fp8w_splitk_kernel"),
        (table.gemm, "fp8w_gemm_kernel"),
        (table.dequant, "fp8w_dequant_kernel"),
    ):
        for block_k in (32, 64, 128):
            tile = fitted(launch, block_k, 4096).block_k
            assert (kernel, tile) in configs, (launch, block_k)
        assert (kernel, fitted(launch, 128, 4095).block_k) in configs
    for build in builds:
        assert build.num_warps in (4, 8)
        assert "SCALE_K" in build.aligned
