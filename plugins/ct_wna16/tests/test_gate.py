"""The SM70 compile gate over every configuration the plugin launches on a V100."""

from __future__ import annotations

import itertools
from dataclasses import replace

import ct_wna16_bench as bench
import pytest

from volta_core import CudaKernelConfig
from volta_core.device import V100, Device
from volta_ct_wna16.dispatch import (
    MOE_OUTPUTS,
    MoEBuild,
    SplitKBuild,
    linear_choice,
    moe_blocks_choice,
    table_launch,
)
from volta_ct_wna16.gate_configs import cuda_builds, moe_config, splitk_config
from volta_ct_wna16.launch import (
    balanced_splits,
    group_tile,
    mma_k_tile,
    mma_options,
    mma_words,
    moe_splits,
    route_place_tile,
    split_count,
    whole_tiles,
)
from volta_ct_wna16.limits import MAX_ROUTED_EXPERTS, SUPPORTED_BITS
from volta_ct_wna16.plugin import volta_kernel_configs
from volta_ct_wna16.tables import (
    DEQUANT_MATMUL,
    MMA,
    SM70,
    SM70_MMA,
    SM90,
    SPLITK,
    Launch,
    table_for,
)
from volta_devkit.cuda_gate import (
    MAX_BLOCK_THREADS,
    REGISTERS_PER_BLOCK,
    block_registers,
    check_cuda_config,
)
from volta_devkit.gate import (
    MAX_SHARED_BYTES,
    assert_gate_passes,
    check_kernel_config,
    gate_variants,
)

SM70_CONFIGS = list(volta_kernel_configs(V100))


def _config_for(launch: Launch, bits: int, names: set[str]) -> bool:
    """Whether the gate's list has a configuration of ``launch``'s tile for ``bits``-bit weights."""
    tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
    if launch.path == SPLITK:
        tile += f"w{launch.num_warps}s{launch.num_stages}r{launch.reduce_unroll}"
    if launch.path == DEQUANT_MATMUL:
        tile = f"n{launch.block_n}k{launch.block_k}"
    return any(tile in name and f"w{bits}" in name for name in names)


@pytest.mark.parametrize("device", [V100, Device((9, 0))], ids=["sm70", "sm90"])
def test_the_list_covers_every_launch_choose_makes(device: Device) -> None:
    device_configs = volta_kernel_configs(device)
    names = {c.name for c in device_configs}
    kinds = {c.kernel.rsplit(":", 1)[1] for c in device_configs}
    expected = {"wna16_splitk_kernel", "wna16_dequant_kernel", "wna16_moe_kernel"}
    expected |= {"moe_count_kernel", "moe_place_kernel", "silu_mul_kernel"}
    expected |= {"moe_decode_gate_up_kernel", "moe_decode_down_kernel", "topk_softmax_kernel"}
    if device == V100:  # SM90 runs 33-191 tokens on a split-K tile, not the GEMM kernel
        expected.add("wna16_gemm_kernel")
    else:  # SM90 runs 1-4 tokens' experts in one launch
        expected.add("moe_decode_fused_kernel")
    assert kinds == expected
    for m in range(1, 600):
        for n in (256, 5120, 8192, 27648):
            for k in (256, 5120, 27648):
                for bits in (4, 8):
                    launch = table_launch(m, n, k, bits, device.capability)
                    assert _config_for(launch, bits, names), (m, n, k, launch)
                    if whole_tiles(n, k, launch, bits):
                        # The unmasked build the launcher takes, split or not, both symmetries.
                        for use_ws, zp in itertools.product((False, True), (False, True)):
                            gt = group_tile(launch, 128)
                            atomic = use_ws and launch.atomic
                            zp8 = zp and launch.byte_zeros
                            cfg = splitk_config(
                                SplitKBuild(
                                    launch, bits, zp, False, use_ws, gt, zp8, atomic, whole=True
                                )
                            )
                            assert cfg.name in names, cfg.name
    for pairs in range(1, 4096, 7):
        for experts in (8, 64, 128, 256):
            launch = moe_blocks_choice(pairs, experts, device.capability).launch
            split = moe_splits(launch)
            assert split == (launch.block_m == 16)
            tiles = {group_tile(launch, group) for group in (32, 64, 128, 256)}
            for bits, zp, gt in itertools.product((4, 8), (False, True), tiles):
                for rw, atomic in MOE_OUTPUTS:
                    cfg = moe_config(MoEBuild(launch, bits, zp, rw, gt, atomic))
                    assert cfg.name in names, cfg.name
    table = table_for(device.capability)
    for experts in range(1, MAX_ROUTED_EXPERTS + 1):
        e_pow2, _ = route_place_tile(experts)
        for launch in (table.moe, table.moe_large):
            assert f"moe_place_e{e_pow2}_m{launch.block_m}" in names, (experts, launch)


def test_sm90_gemv_tile_follows_the_output_and_input_counts() -> None:
    sm90 = (9, 0)
    narrow, (wide_from, wide) = SM90.gemv, SM90.wide_gemv or (0, None)
    short_to, short = SM90.short_gemv or (0, None)
    assert table_launch(1, 5120, None, 4, sm90) == narrow
    assert table_launch(1, wide_from - 1, None, 4, sm90) == narrow
    assert table_launch(1, wide_from, None, 4, sm90) == wide
    assert table_launch(1, 27648, None, 8, sm90) == wide
    assert table_launch(1, 27648, None, 4, (7, 0)) == SM70.gemv
    # The short tile: narrow layers of at most short_to inputs (5120x5120, 7168x5120).
    assert table_launch(1, 5120, 5120, 4, sm90) == short
    assert table_launch(1, 7168, short_to, 4, sm90) == short
    assert table_launch(1, 5120, short_to + 1, 4, sm90) == narrow
    assert table_launch(1, 5120, 27648, 4, sm90) == narrow
    assert table_launch(1, wide_from, 5120, 4, sm90) == wide
    assert table_launch(2, 5120, 5120, 4, sm90) == SM90.small
    assert table_launch(1, 5120, 5120, 4, (7, 0)) == SM70.gemv


def test_a_long_input_is_cut_into_more_splits_not_given_another_tile() -> None:
    """Run 6's sweep: the 1-token tile of the narrow shapes was also the fastest launch on
    5120x27648 (30.6 us; 33.4-41.4 for the 64- and 128-input tiles), so the input length acts
    through the split count: the same tile, more and longer splits."""
    sm90 = (9, 0)
    narrow = SM90.gemv
    assert table_launch(1, 5120, None, 4, sm90) == narrow
    short = split_count(5120, 5120, narrow, 132)
    long = split_count(5120, 27648, narrow, 132)
    assert long[0] >= short[0]
    assert long[1] > short[1]
    assert table_launch(16, 5120, None, 4, sm90) == SM90.decode


@pytest.mark.parametrize(
    ("n", "k", "decode", "gemm"),
    [(5120, 5120, 10, 8), (27648, 5120, 6, 3), (5120, 27648, 13, 8), (7168, 5120, 8, 3)],
)
def test_the_dot_tiles_take_the_split_counts_run_16_found_fastest(n, k, decode, gemm) -> None:
    """Run 16 timed every split count on the H100 (132 SMs) and the balanced counts follow:
    at 2-16 tokens (call 2, ``docs/perf/ct_wna16/run16/call2/probe_counts.log``) and at 64
    (call 4) they were the fastest or within 1 us of it; the programs-per-SM rule before them
    chose 14, 3, 14 and 10, and 4, 1, 4 and 3."""
    sm90 = (9, 0)
    for m, splits in ((2, decode), (4, decode), (16, decode), (64, gemm)):
        launch = table_launch(m, n, None, 4, sm90)
        assert launch.split_cost is not None
        assert split_count(n, k, launch, 132, m)[0] == splits


def test_balanced_splits() -> None:
    # 20 tiles of 216 steps: 13 splits (260 programs, 2 per SM) and not 14 (280: a wave more).
    assert -(-216 // balanced_splits(20, 216, 2, 1.5, 132)) == 13
    # A lone tile is cut to single steps; one step is never cut.
    assert balanced_splits(1, 40, 2, 1.5, 132) == 1
    assert balanced_splits(50, 1, 2, 1.5, 132) == 1
    # Twice the tiles (32 tokens on a 16-row tile): never more splits than for one row block.
    for tiles, k_blocks in ((20, 40), (28, 40), (108, 40), (20, 216)):
        one = -(-k_blocks // balanced_splits(tiles, k_blocks, 2, 1.5, 132))
        two = -(-k_blocks // balanced_splits(2 * tiles, k_blocks, 2, 1.5, 132))
        assert two <= one, (tiles, k_blocks)
    # Nothing to split is refused by name, not answered.
    with pytest.raises(ValueError, match="k_blocks=0"):
        balanced_splits(20, 0, 2, 1.5, 132)
    with pytest.raises(ValueError, match="split_cost"):
        replace(SM90.decode, split_cost=-1.0)
    with pytest.raises(ValueError, match="split_cost"):
        replace(SM90.dequant, split_cost=1.0)
    with pytest.raises(ValueError, match="unmasked build"):
        replace(SM90.dequant, unmasked=True)
    # The m row blocks count: 17 tokens make two 16-row tiles.
    launch = SM90.decode
    assert split_count(5120, 5120, launch, 132, 17) == split_count(10240, 5120, launch, 132, 16)


def test_sm90_tiles_differ_from_sm70_tiles() -> None:
    sm90 = {c.name for c in volta_kernel_configs(Device((9, 0)))}
    assert sm90 != {c.name for c in SM70_CONFIGS}


@pytest.mark.parametrize("cfg", gate_variants(SM70_CONFIGS), ids=lambda c: c.name)
def test_sm70_gate(cfg) -> None:
    report = check_kernel_config(cfg, capability=70)
    assert_gate_passes(report)
    if cfg.constexprs.get("USE_DOT") is False:
        # The decode GEMV converts integers with the fp32 bit trick, not the int-to-float unit.
        assert report.sass_histogram.get("FFMA", 0) > 0


def _sweep_configs() -> list:
    """The sweep's split-K candidates as the H100 compiles them (4-bit, split, group 128),
    each compile-distinct launch once (programs per SM only change the grid)."""
    out, seen = [], set()
    for m in bench.SWEEP_MS:
        for launch in bench.sweep_candidates(m):
            key = replace(launch, programs_per_sm=0)
            if launch.path != SPLITK or key in seen:  # the table's dequantize build
                continue
            seen.add(key)
            for zp in (False, True) if launch.use_dot else (False,):
                gt = group_tile(launch, bench.GROUP)
                out.append(splitk_config(SplitKBuild(launch, 4, zp, False, True, gt)))
    return out


@pytest.mark.parametrize("cfg", _sweep_configs(), ids=lambda c: c.name)
def test_sweep_candidates_compile_for_sm90_without_spills(cfg) -> None:
    """The benchmark's sweep runs on the H100 only, so these are not in the gate's list; a
    candidate that spilled there would measure its spills, not its tile."""
    report = check_kernel_config(cfg, capability=90)
    assert report.passed, report.describe()


@pytest.mark.parametrize(
    "cfg",
    [c for c in volta_kernel_configs(Device((9, 0))) if c.name.endswith("_swap")],
    ids=lambda c: c.name,
)
def test_sm90_swapped_moe_builds_compile_for_sm90_without_spills(cfg) -> None:
    """SM90's large fused-MoE tile swaps (``Launch.swap``); the SM70 gate never compiles the
    SM90 table, and a build that spilled would trade the registers the swap keeps the weights
    in for local memory."""
    report = check_kernel_config(cfg, capability=90)
    assert report.passed, report.describe()


#: The SM90 table's one-launch decode builds (:class:`volta_ct_wna16.launch.MoEFused`).
SM90_FUSED = [c for c in volta_kernel_configs(Device((9, 0))) if "_fused_" in c.name]


@pytest.mark.parametrize("cfg", SM90_FUSED, ids=lambda c: c.name)
def test_sm90_one_launch_decode_builds_compile_for_sm90_without_spills(cfg) -> None:
    """SM90 runs 1-4 tokens' experts in one launch (the SM70 table keeps two: not timed on a
    V100); a build that spilled would measure its local memory, not its tile."""
    report = check_kernel_config(cfg, capability=90)
    assert report.passed, report.describe()


@pytest.mark.parametrize(
    "cfg",
    [c for c in SM90_FUSED if not c.name.endswith(("_map", "_rw"))],
    ids=lambda c: c.name,
)
def test_the_one_launch_decode_also_builds_for_sm70(cfg) -> None:
    """The one-launch kernel uses nothing Volta lacks (fp32 atomics, no ``tl.dot``), so a
    V100 table could take it once it is timed there: each width and symmetry passes the gate."""
    assert_gate_passes(check_kernel_config(cfg, capability=70))


def test_dot_tiles_load_scales_per_tile_only_inside_one_group() -> None:
    decode = SM90.decode
    assert group_tile(decode, 128)
    assert group_tile(decode, 256)
    assert not group_tile(decode, 64)
    assert not group_tile(decode, 5120 + 64)  # channel-wise: one group of K inputs
    assert not group_tile(SM90.gemv, 128)  # the GEMV loads per 32 inputs
    assert not group_tile(SM70.gemm, 128)  # the GEMM kernel loads per row
    assert SM90.moe_large.swap
    assert not group_tile(SM90.moe_large, 128)  # a swapped tile loads them per word row
    assert group_tile(replace(SM90.moe_large, swap=False), 128)


# -- the CUDA tensor-core GEMM (wna16_mma.cu) ---------------------------------------------------

#: A k-tile's products moved to the FMA units would take 8 FFMA per HMMA step (an HMMA.884 step
#: is 256 multiply-adds of a warp, 8 per thread). The rule for "no FFMA-based dot": at most one
#: FFMA per 8 HMMA, so the FMA units could do no more than 1/64 of the tensor cores' products.
HMMA_PER_FFMA = 8

#: What a Volta SM holds besides registers (CUDA C++ Programming Guide, "Compute Capabilities"):
#: 2048 resident threads.
THREADS_PER_SM = 2048

_MMA_CASES = [
    (launch, bits, zp) for _, launch in SM70_MMA for bits in SUPPORTED_BITS for zp in (False, True)
]


def _build(launch: Launch, bits: int, zp: bool) -> CudaKernelConfig:
    options = mma_options(launch, bits, zp)
    return next(b for b in cuda_builds(V100) if b.options == options)


@pytest.fixture(scope="module")
def mma_reports() -> dict[tuple[str, ...], object]:
    """The gate's report of every shipped tensor-core build, by NVRTC options (one compile)."""
    return {b.options: check_cuda_config(b, capability=70) for b in cuda_builds(V100)}


@pytest.mark.parametrize(
    ("launch", "bits", "zp"),
    _MMA_CASES,
    ids=[f"m{ln.block_m}-w{bits}{'a' if zp else 's'}" for ln, bits, zp in _MMA_CASES],
)
def test_sm70_gate_tensor_core_gemm(mma_reports, launch: Launch, bits: int, zp: bool) -> None:
    """Each shipped build compiles for sm_70 with no spills, at most 96 KB of shared memory,
    a block that fits the register file, and its products on HMMA: every k-tile's (static
    count a whole multiple of the tile's 4 HMMA steps per m8n8k4), no FFMA-based dot. Its
    registers let an SM hold the blocks the table's split count assumes."""
    report = mma_reports[mma_options(launch, bits, zp)]
    assert_gate_passes(report)
    hmma = report.sass_histogram.get("HMMA", 0)
    per_tile = 4 * (mma_k_tile(bits) // 4) * (launch.block_m // 8) * mma_words(launch)
    assert hmma >= per_tile, (hmma, per_tile)
    assert hmma % per_tile == 0, (hmma, per_tile)
    assert report.sass_histogram.get("FFMA", 0) * HMMA_PER_FFMA <= hmma, report.sass_histogram
    threads = launch.num_warps * 32
    held = min(
        REGISTERS_PER_BLOCK // block_registers(report.n_regs, threads),
        THREADS_PER_SM // threads,
        MAX_SHARED_BYTES // report.shared_bytes,
    )
    assert threads <= MAX_BLOCK_THREADS
    assert held >= launch.programs_per_sm, (report.n_regs, report.shared_bytes, held)


def test_the_cuda_builds_cover_every_tensor_core_launch() -> None:
    """Every tensor-core launch :func:`~volta_ct_wna16.dispatch.linear_choice` makes on a V100
    has its builds in the gate's list, and no other device gets any."""
    options = {b.options for b in cuda_builds(V100)}
    assert len(options) == len(cuda_builds(V100)) == len(_MMA_CASES)
    for m in range(1, 300):
        for n, k in ((8, 8192), (5120, 5120), (27648, 5120), (5120, 27648)):
            for bits, zp in itertools.product(SUPPORTED_BITS, (False, True)):
                launch = linear_choice(m, n, k, bits, n * k // 2, (7, 0)).launch
                if launch.path == MMA:
                    assert mma_options(launch, bits, zp) in options, (m, n, k, launch)
    for device in (Device((7, 5)), Device((9, 0))):
        assert cuda_builds(device) == []
    assert all(_build(*case).claims_tensor_cores for case in _MMA_CASES)
