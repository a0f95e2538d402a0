"""Dispatch's answers without a device: the table's launch per token count, what launches cost,
the tiles fitted to a layer, and the builds the compile gate checks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from volta_core.kernel_api import V100_RATES, DeviceFacts, Unit
from volta_fp8w.dispatch import (
    KERNEL_NAMES,
    linear_choice,
    linear_cost,
    table_choice,
    table_launch,
    triton_builds,
    triton_unit,
)
from volta_fp8w.launch import fitted, split_count
from volta_fp8w.tables import (
    DECODE_MAX_M,
    DEQUANT_MATMUL,
    GEMM,
    MMA,
    SM70,
    SM90,
    SPLITK,
    Launch,
    table_for,
)

V100 = (7, 0)
H100 = (9, 0)
BLOCK = (128, 128)


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
        assert linear_choice(m, 4096, 4096, V100) == choice
    assert table_choice(64, 4096, 4096, V100).unit is Unit.TENSOR_CORES
    assert triton_unit(SM90.gemv, H100) is Unit.FMA
    assert triton_unit(SM90.small, H100) is Unit.TENSOR_CORES
    assert triton_unit(SM90.gemm, H100) is Unit.TENSOR_CORES
    assert set(KERNEL_NAMES) == {SPLITK, GEMM, DEQUANT_MATMUL, MMA}


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
