"""Dispatch's answers without a device: the table's launch per token count, what launches cost,
the tiles fitted to a layer, the fused experts' choices, costs and plan stages, and the builds
the compile gate checks."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from volta_core import Device, LayerKind, QuantLayer
from volta_core.kernel_api import V100_RATES, DeviceFacts, StageCost, Unit, Workload
from volta_fp8w.dispatch import (
    KERNEL_NAMES,
    MMA_MIN_M,
    MOE_BLOCKS,
    MOE_DECODE,
    MOE_MMA,
    TritonBuild,
    expert_bytes,
    expert_choice,
    expert_cost,
    expert_launch_cost,
    expert_layer,
    expert_paths,
    linear_choice,
    linear_cost,
    linear_paths,
    max_blocks,
    mma_launch,
    moe_blocks_build,
    moe_blocks_choice,
    moe_builds,
    moe_count_build,
    moe_decode_choice,
    moe_e_pow2,
    moe_gemv_build,
    moe_place_build,
    moe_sum_build,
    moe_tile_k,
    moe_unit,
    route_place_tile,
    stage_cost,
    table_choice,
    table_launch,
    tensor_core_builds,
    touched_experts,
    triton_builds,
    triton_unit,
)
from volta_fp8w.gate_configs import kernel_configs
from volta_fp8w.launch import fitted, split_count
from volta_fp8w.scheme import Fp8Scheme
from volta_fp8w.tables import (
    CUDA_GEMV,
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
    for m in range(2, table.small_max_m + 1):
        assert table_launch(m, 4096, 4096, capability) == table.small
    assert table.dequant_from is not None
    for m in range(table.small_max_m + 1, table.dequant_from):
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
    assert triton_unit(SM90.cuda_gemv[0][1], H100) is Unit.FMA
    assert set(KERNEL_NAMES) == {SPLITK, GEMM, DEQUANT_MATMUL, MMA, CUDA_GEMV}


@pytest.mark.parametrize(("n", "k"), [(4096, 4096), (27648, 5120), (5120, 27648), (768, 2048)])
def test_a_v100_takes_the_tensor_cores_from_eight_tokens(n: int, k: int) -> None:
    """Below :data:`MMA_MIN_M` the GEMVs (memory-bound, one byte a weight); from there on the
    tensor-core GEMM wherever the V100 model prices it no higher than the table's launch, with
    the table's choice as the fallback where NVRTC is missing: at 8 tokens both read the same
    bytes (a tie goes to the tensor cores), above that the FMA GEMM and dequantize-then-cuBLAS
    cost more. Off the V100 the table's launch, no CUDA build."""
    for m in range(2, MMA_MIN_M):
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
        for m in (8, 64, 2048):
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
    warps = {launch.num_warps for launch in (table.gemv, table.small, table.gemm, table.dequant)}
    stages = {launch.num_stages for launch in (table.gemv, table.small, table.gemm, table.dequant)}
    for build in builds:
        assert build.num_warps in warps
        assert build.num_stages in stages
        assert "SCALE_K" in build.aligned
    # The GEMV and GEMM tiles read their codes as words (as on aligned rows); each tile's
    # byte-reading form (unaligned rows) is built in its largest variant, split with bias.
    tiles = [b for b in builds if "dequant" not in b.kernel]
    bytewise = [b for b in tiles if not dict(b.constexprs)["WORDS"]]
    assert {_tile(b) for b in bytewise} == {_tile(b) for b in tiles}
    assert all(dict(b.constexprs)["HAS_BIAS"] for b in bytewise)
    assert all(dict(b.constexprs).get("SPLIT", True) for b in bytewise)


def _tile(build: TritonBuild) -> tuple[str, int, int, int]:
    c = dict(build.constexprs)
    return build.kernel, c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]


# -- the fused experts ------------------------------------------------------------------------

#: Qwen3-30B-A3B's experts: 128 of them, 8 a token, hidden 2048, intermediate 768.
HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8
FAMILIES = [V100, (7, 5), (8, 0), H100]


@pytest.mark.parametrize("capability", FAMILIES)
def test_experts_take_the_decode_gemvs_then_the_routed_blocks(capability) -> None:
    """Up to the table's ``moe_decode_max_m`` tokens (16) the decode GEMVs on the FMA units;
    above, the routed blocks, whose dot tiles run on the FMA units on SM70 and on the tensor
    cores from SM80."""
    table = table_for(capability)
    assert table.moe_decode_max_m == 16
    for tokens in range(1, table.moe_decode_max_m + 1):
        chosen = expert_choice(tokens, tokens * TOP_K, EXPERTS, capability)
        assert (chosen.kernel, chosen.unit, chosen.launch) == (
            MOE_DECODE,
            Unit.FMA,
            table.moe_decode,
        )
        assert chosen == moe_decode_choice(tokens, capability)
        assert chosen.fallback is None
    blocks_unit = Unit.TENSOR_CORES if capability >= (8, 0) else Unit.FMA
    for tokens in (table.moe_decode_max_m + 1, 64, 512, 8192):
        assert moe_decode_choice(tokens, capability) is None
        chosen = expert_choice(tokens, tokens * TOP_K, EXPERTS, capability)
        assert (chosen.kernel, chosen.unit) == (MOE_BLOCKS, blocks_unit)
        assert chosen.launch in table.moe_blocks
        assert chosen == moe_blocks_choice(tokens * TOP_K, EXPERTS, capability)
    assert moe_unit(table.moe_decode, capability) is Unit.FMA
    assert all(moe_unit(la, capability) is blocks_unit for la in table.moe_blocks)


@pytest.mark.parametrize("capability", FAMILIES)
def test_routed_blocks_tile_by_mean_rows_per_expert(capability) -> None:
    """The first tile whose ``block_m`` is at least the mean routed rows of an expert, the
    largest above them all; by the batch only."""
    launches = table_for(capability).moe_blocks
    assert [la.block_m for la in launches] == sorted(la.block_m for la in launches)
    assert launches[0].block_m >= 16
    for pairs, experts in itertools.product((17, 136, 1024, 4096, 65536), (8, 60, 128, 256)):
        mean = pairs / experts
        launch = moe_blocks_choice(pairs, experts, capability).launch
        fits = [la for la in launches if la.block_m >= mean]
        assert launch == (fits[0] if fits else launches[-1]), (pairs, experts)
    assert moe_blocks_choice(16 * 8, 8, capability).launch == launches[0]
    assert moe_blocks_choice(10**6, 8, capability).launch == launches[-1]


def test_what_follows_from_an_experts_launch() -> None:
    assert [moe_tile_k(128, b) for b in (128, 256, 64, 192, 96, 32, 4096)] == [
        128, 128, 64, 64, 32, 32, 128,
    ]  # fmt: skip
    assert moe_tile_k(32, 128) == 32
    assert [moe_e_pow2(e) for e in (1, 8, 16, 17, 60, 128, 129, 1024)] == [
        16, 16, 16, 32, 64, 128, 256, 1024,
    ]  # fmt: skip
    assert route_place_tile(16) == (16, 1024)
    assert route_place_tile(128) == (128, 128)
    assert route_place_tile(1024) == (1024, 16)
    # Every expert's last block may be partial: never more than pairs // block_m + experts.
    assert max_blocks(136, 128, 16) == 136 // 16 + 128
    assert max_blocks(4, 128, 16) == 0 + 4


def test_expert_bytes_count_codes_and_scales() -> None:
    gate_up, down = expert_bytes(HIDDEN, INTER, (128, 128))
    assert gate_up == 2 * INTER * HIDDEN + 4 * 2 * (INTER // 128) * (HIDDEN // 128)
    assert down == HIDDEN * INTER + 4 * (HIDDEN // 128) * (INTER // 128)
    rows = expert_bytes(HIDDEN, INTER, None)
    assert rows == (2 * INTER * HIDDEN + 4 * 2 * INTER, HIDDEN * INTER + 4 * HIDDEN)
    # A block split by the intermediate size: gate's and up's rows each in whole blocks.
    assert expert_bytes(256, 72, (128, 128))[0] == 2 * 72 * 256 + 4 * 2 * 1 * 2


def test_touched_experts() -> None:
    assert touched_experts(1, EXPERTS, TOP_K) == pytest.approx(TOP_K)
    for tokens in (1, 2, 4, 16, 64, 1024):
        touched = touched_experts(tokens, EXPERTS, TOP_K)
        assert 0 < touched <= min(EXPERTS, tokens * TOP_K)
    assert touched_experts(4096, EXPERTS, TOP_K) == pytest.approx(EXPERTS)
    assert touched_experts(3, 8, 8) == 8
    assert touched_experts(0, EXPERTS, TOP_K) == 0


@pytest.mark.parametrize("capability", [V100, H100])
@pytest.mark.parametrize("block", [(128, 128), None])
def test_expert_costs_price_the_chosen_launches(capability, block) -> None:
    """The decode step's three launches (gate/up, down, the slot sum) and the routed blocks'
    three (routing, gate/up, down), in order: all the arithmetic in gate/up and down
    (``2 x pairs x 3 x inter x hidden``), the weights of the touched experts and no more, the
    unit of the choice. On a V100 the tensor cores' products padded: each touched expert's last
    block half empty."""
    gate_up_bytes, down_bytes = expert_bytes(HIDDEN, INTER, block)
    for tokens in (1, 4, 16, 17, 64, 512, 4096):
        pairs = tokens * TOP_K
        chosen = expert_choice(tokens, pairs, EXPERTS, capability, (HIDDEN, INTER))
        cost = expert_cost(tokens, HIDDEN, INTER, EXPERTS, TOP_K, block, capability)
        assert cost.kernel == chosen.kernel
        assert cost.unit is chosen.unit
        touched = touched_experts(tokens, EXPERTS, TOP_K)
        tensor_cores = chosen.kernel == MOE_MMA
        assert tensor_cores == (capability == V100 and tokens > 16)
        rows = pairs + (round(touched * chosen.launch.block_m / 2) if tensor_cores else 0)
        assert cost.flops == 2 * rows * 3 * INTER * HIDDEN
        assert len(cost.launches) == 3
        assert all(launch.bytes_read > 0 and launch.bytes_written > 0 for launch in cost.launches)
        weights = round(touched * gate_up_bytes) + round(touched * down_bytes)
        most = min(EXPERTS, pairs) * (gate_up_bytes + down_bytes)
        assert weights <= most
        if chosen.kernel == MOE_DECODE:
            gate_up, down, total = cost.launches
            assert total.flops == 0
            assert total.bytes_written == 2 * tokens * HIDDEN
        else:
            routing, gate_up, down = cost.launches
            assert routing.flops == 0
            slots = max_blocks(pairs, EXPERTS, chosen.launch.block_m) * chosen.launch.block_m
            assert routing.bytes_written == 4 * pairs + 8 * slots
        assert gate_up.flops == 2 * rows * 2 * INTER * HIDDEN
        assert down.flops == 2 * rows * INTER * HIDDEN
        assert round(touched * gate_up_bytes) < gate_up.bytes_read
        assert round(touched * down_bytes) <= down.bytes_read
        # Only the weights of touched experts: the rest of the bytes are activations,
        # intermediates, outputs and the router's, a few per pair and element.
        rest = cost.bytes - weights
        assert 0 < rest <= 64 * pairs * (HIDDEN + INTER) + 64 * max(pairs, EXPERTS) * 64


@pytest.mark.parametrize("capability", [V100, H100])
def test_expert_costs_are_positive_and_grow_with_the_tokens(capability) -> None:
    seconds = [
        expert_cost(t, HIDDEN, INTER, EXPERTS, TOP_K, (128, 128), capability).seconds(V100_RATES)
        for t in (1, 2, 4, 8, 16, 17, 32, 64, 256, 1024, 8192)
    ]
    assert seconds[0] > 0
    decode, blocks = seconds[:5], seconds[5:]
    assert decode == sorted(decode)
    assert blocks == sorted(blocks)
    sizes = [
        expert_cost(4, h, i, EXPERTS, TOP_K, (128, 128), capability).bytes
        for h, i in ((1024, 384), (2048, 384), (2048, 768), (4096, 1536))
    ]
    assert sizes == sorted(sizes)


@pytest.mark.parametrize("capability", FAMILIES)
def test_expert_paths_are_the_launchers_choices(capability) -> None:
    """The plan's stages for fused experts: the decode GEMVs from one token to the table's
    ``moe_decode_max_m``, the routed blocks above, each stage's kernel and unit those of
    :func:`expert_choice` at every count in it (whatever the layer)."""
    table = table_for(capability)
    paths = expert_paths(capability)
    assert [p.stage for p in paths] == [
        f"1-{table.moe_decode_max_m} tokens",
        f"{table.moe_decode_max_m + 1}+ tokens",
    ]
    spans = ((1, table.moe_decode_max_m), (table.moe_decode_max_m + 1, 4096))
    for path, (first, last) in zip(paths, spans, strict=True):
        assert not path.needs_nvrtc
        for tokens in (first, last):
            for experts, top_k in ((8, 2), (EXPERTS, TOP_K), (256, 8)):
                chosen = expert_choice(tokens, tokens * top_k, experts, capability)
                assert (path.kernel, path.unit) == (chosen.kernel, chosen.unit.value)


@pytest.mark.parametrize("capability", [V100, H100])
@pytest.mark.parametrize("scheme", [Fp8Scheme("block", (128, 128), "fp8"), CHANNEL])
@pytest.mark.parametrize("tokens", [1, 16, 17, 64, 2048])
def test_stage_cost_prices_the_experts_chosen_launches(capability, scheme, tokens) -> None:
    """Fused experts (``output_size`` one expert's intermediate size on the rank,
    ``input_size`` the hidden size): the stage of the layer's :func:`expert_paths` holding the
    tokens, :func:`expert_cost` of the launches :func:`expert_choice` takes there and, on a
    V100's tensor cores, the Triton routed blocks' cost as the fallback's."""
    layer = QuantLayer(
        LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", HIDDEN, INTER, EXPERTS, TOP_K
    )
    stage = stage_cost(layer, scheme, capability, Workload(sequences=tokens))
    cost = expert_cost(tokens, HIDDEN, INTER, EXPERTS, TOP_K, scheme.block, capability)
    paths = expert_paths(capability, expert_layer(layer))
    [path] = [p for p in paths if (tokens <= 16) == (p.kernel == MOE_DECODE)]
    chosen = expert_choice(tokens, tokens * TOP_K, EXPERTS, capability, (HIDDEN, INTER))
    fallback = None
    if chosen.fallback is not None:
        fallback = expert_launch_cost(
            chosen.fallback, tokens, HIDDEN, INTER, EXPERTS, TOP_K, scheme.block
        )
        assert fallback.kernel == MOE_BLOCKS
    assert (fallback is not None) == (capability == V100 and tokens > 16)
    assert stage == StageCost(path.stage, cost, fallback)
    assert cost.kernel == chosen.kernel
    work = Workload(sequences=tokens)
    for unknown in (
        QuantLayer(LayerKind.FUSED_MOE, "x", HIDDEN, INTER),
        QuantLayer(LayerKind.FUSED_MOE, "x", HIDDEN, INTER, EXPERTS, 0),
        QuantLayer(LayerKind.FUSED_MOE, "x", HIDDEN, INTER, 4, 8),
        QuantLayer(LayerKind.FUSED_MOE, "x", 0, 0, EXPERTS, TOP_K),
    ):
        assert stage_cost(unknown, scheme, capability, work) is None


def test_the_plugins_hooks_answer_for_fused_experts() -> None:
    """``volta_kernel_paths`` and ``volta_kernel_cost`` on claimed FP8 experts are dispatch's."""
    from volta_core import QuantConfig
    from volta_fp8w import plugin

    config = QuantConfig(
        method="fp8",
        raw={
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        },
    )
    layer = QuantLayer(LayerKind.FUSED_MOE, "model.layers.0.mlp.experts", HIDDEN, INTER, 128, 8)
    device = Device(V100)
    paths = expert_paths(V100, expert_layer(layer))
    assert plugin.volta_kernel_paths(layer, plugin.METHOD, device, config) == paths
    assert paths[-1].kernel == MOE_MMA
    work = Workload(sequences=32)
    assert plugin.volta_kernel_cost(layer, plugin.METHOD, device, config, work) == stage_cost(
        layer, Fp8Scheme("block", (128, 128), "fp8"), V100, work
    )


# -- the fused experts' builds ------------------------------------------------------------------


@pytest.mark.parametrize("capability", FAMILIES)
def test_moe_builds_cover_every_launch_the_experts_launcher_makes(capability) -> None:
    """Every build the launcher makes for the table's launches on layers of 128 x 128 blocks
    and of one scale a row, any input tile, either id type, with and without an expert map and
    the router weight on the input, 16 to 1024 local experts, is one of :func:`moe_builds`."""
    table = table_for(capability)
    builds = moe_builds(capability)
    assert len(builds) == len(set(builds))
    assert not set(builds) & set(triton_builds(capability))
    shipped = set(builds)
    flags = list(itertools.product(("i32", "i64"), (False, True), (False, True)))
    decode = table.moe_decode
    for scales in ((128, 128), (1, 128), (64, 64), (1, 96)):
        for ids, has_map, mul in flags:
            for down in (False, True):
                build = moe_gemv_build(decode, scales, down=down, has_map=has_map, mul=mul, ids=ids)
                tile = dict(build.constexprs)["BLOCK_K"]
                assert tile == moe_tile_k(decode.block_k, scales[1])
                if scales in ((128, 128), (1, 128)):
                    assert build in shipped, build
                else:  # another block of the same tile: the same code, another constexpr
                    assert any(
                        b.kernel == build.kernel
                        and dict(b.constexprs)["BLOCK_K"] == tile
                        and b.types == build.types
                        for b in builds
                    )
    assert moe_sum_build() in shipped
    for experts in (1, 8, 16, 60, 128, 256, 384, 1024):
        for ids, has_map in itertools.product(("i32", "i64"), (False, True)):
            assert moe_count_build(has_map=has_map, ids=ids) in shipped
            for launch in table.moe_blocks:
                assert moe_place_build(launch.block_m, experts, has_map=has_map, ids=ids) in shipped
        for launch in table.moe_blocks:
            for scales, mul, down in itertools.product(
                ((128, 128), (1, 128)), (False, True), (False, True)
            ):
                build = moe_blocks_build(launch, scales, experts, down=down, mul=mul)
                assert build in shipped, build
    for build in builds:
        assert build.num_warps in (2, 4, 8)
        assert build.num_stages >= 1


@pytest.mark.parametrize("capability", [V100, H100])
def test_gate_configs_name_each_kernels_arguments(capability) -> None:
    """One gate configuration per build, each named once, its signature and constexprs every
    argument of its kernel in order (so the gate compiles the kernel the launcher calls)."""
    pytest.importorskip("triton")
    from volta_devkit.gate import import_kernel

    builds = [*triton_builds(capability), *moe_builds(capability)]
    configs = kernel_configs(Device(capability))
    assert len(configs) == len(builds)
    assert len({c.name for c in configs}) == len(configs)
    kernels = {}
    for cfg, build in zip(configs, builds, strict=True):
        assert cfg.kernel == build.kernel
        assert (cfg.num_warps, cfg.num_stages) == (build.num_warps, build.num_stages)
        if cfg.kernel not in kernels:
            kernels[cfg.kernel] = import_kernel(cfg.kernel).arg_names
        assert [*cfg.signature, *cfg.constexprs] == kernels[cfg.kernel], cfg.name
        assert set(cfg.divisible_by_16) <= set(cfg.signature)
        if "ids_ptr" in cfg.signature:
            assert cfg.signature["ids_ptr"] in ("*i32", "*i64")
    assert {c.kernel.rsplit(":", 1)[1] for c in configs if "moe" in c.kernel} == {
        "moe_gemv_gate_up_kernel",
        "moe_gemv_down_kernel",
        "moe_sum_kernel",
        "moe_count_kernel",
        "moe_place_kernel",
        "moe_gate_up_kernel",
        "moe_down_kernel",
    }
