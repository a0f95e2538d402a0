"""The SM70 compile gate over every configuration ``volta_kernel_configs`` returns for a V100.

Each configuration is compiled for sm_70 with the toolkit's gate: it must compile, spill no
register and fit Volta's 96 KB of shared memory (and use no e4m3). The configuration list must
cover every declared head size and KV dtype for each kernel, so the gate sees what a V100 runs.
"""

from __future__ import annotations

import pytest

from volta_attn_v100 import plugin
from volta_core import V100, Device
from volta_devkit.gate import (
    assert_gate_passes,
    check_kernel_config,
    compiled,
    gate_variants,
    pairwise_cover,
)

V100_CONFIGS = list(plugin.volta_kernel_configs(V100))


def test_configs_cover_the_declaration() -> None:
    covered = {
        (c.kernel.rsplit(":", 1)[1], c.constexprs["HEAD_SIZE"], c.signature.get("kv_ptr"))
        for c in V100_CONFIGS
    }
    for head_size in plugin.SPEC.head_sizes:
        for kv_type in ("*fp16", "*u8"):
            assert ("paged_decode_kernel", head_size, kv_type) in covered
            assert ("paged_prefill_kernel", head_size, kv_type) in covered


def test_sm70_and_sm90_tiles_differ() -> None:
    from volta_core import Device

    h100 = {c.name: c for c in plugin.volta_kernel_configs(Device((9, 0)))}
    shared = [c for c in V100_CONFIGS if c.name in h100]
    assert shared
    assert any(
        h100[c.name].constexprs != c.constexprs or h100[c.name].num_warps != c.num_warps
        for c in shared
    )
    assert all(c.num_stages == 1 for c in V100_CONFIGS), "num_stages does nothing on SM70"


@pytest.mark.parametrize("config", gate_variants(V100_CONFIGS), ids=lambda c: c.name)
def test_sm70_gate(config) -> None:
    report = check_kernel_config(config, capability=70)
    assert_gate_passes(report)
    assert report.n_spills == 0
    assert report.shared_bytes <= 96 * 1024


def test_prefill_tile_follows_the_query_length_on_sm90_only() -> None:
    """SM80+ takes 128 keys per prefill tile from 1024-token queries on (heads up to 128), and
    both tiles are in the configuration list; SM70 has one tile."""
    from volta_attn_v100.launch import prefill_tile_choices, prefill_tiles
    from volta_attn_v100.tables import SM70, SM80

    h100 = (9, 0)
    tiles = SM80.prefill_tiles[128]
    assert tiles.long_query == 1024
    short, long = prefill_tiles(tiles, 1023), prefill_tiles(tiles, 1024)
    assert (short.block_n, long.block_n) == (64, 128)
    d256 = SM80.prefill_tiles[256]
    assert prefill_tile_choices(d256) == [prefill_tiles(d256, 1 << 20)]
    assert all(len(prefill_tile_choices(t)) == 1 for t in SM70.prefill_tiles.values())
    listed = {
        (c.constexprs["BLOCK_N"], c.signature["kv_ptr"])
        for c in plugin.volta_kernel_configs(Device(h100))
        if c.kernel.endswith("paged_prefill_kernel") and c.constexprs["HEAD_SIZE"] == 128
    }
    assert listed == {(n, kv) for n in (64, 128) for kv in ("*fp16", "*u8")}


H100_CONFIGS = list(plugin.volta_kernel_configs(Device((9, 0))))
AHEAD_CONFIGS = [c for c in H100_CONFIGS if c.constexprs.get("AHEAD")]


def test_scores_ahead_only_with_fp8_in_halves() -> None:
    """The H100's decode configurations with scores ahead are fp8 in halves only."""
    assert AHEAD_CONFIGS
    for config in AHEAD_CONFIGS:
        assert config.constexprs["KV_FP8"], config.name
        assert config.constexprs["HALVES"], config.name


@pytest.mark.parametrize("config", pairwise_cover(AHEAD_CONFIGS), ids=lambda c: c.name)
def test_scores_ahead_configs_compile_for_sm90(config) -> None:
    """They compile for sm_90: every pair of their launch parameters' values, as in the
    root suite's sm_90 gate (``VOLTA_TEST_SM90_GATE=all`` there compiles every one)."""
    assert compiled(check_kernel_config(config, capability=90, measure=False))


def test_e4m3_builds_from_sm89_only() -> None:
    """No e4m3 build on a V100 (or SM80: no e4m3 there); from SM89 every prefill build and
    each head size's first decode build get an e4m3 twin, which reads its codes through the
    hardware conversion."""
    from volta_attn_v100.dispatch import kernel_configs
    from volta_attn_v100.limits import FP8_E4M3_NATIVE, fp8_decode

    for capability in ((7, 0), (8, 0)):
        assert not [c.name for c in kernel_configs(capability) if "e4m3" in c.name]
    configs = kernel_configs((9, 0))
    twins = {c.name: c for c in configs if "_fp8_e4m3" in c.name}
    for c in configs:
        if "_fp8_e5m2" in c.name and not c.name.startswith("decode"):
            twin = twins[c.name.replace("_fp8_e5m2", "_fp8_e4m3")]
            assert twin.signature == c.signature
    decode = [c for c in twins.values() if c.name.startswith("decode")]
    assert sorted(c.constexprs["HEAD_SIZE"] for c in decode) == sorted(plugin.SPEC.head_sizes)
    for c in twins.values():
        assert c.constexprs["FP8_DECODE"] == FP8_E4M3_NATIVE
    assert fp8_decode("fp8_e4m3", (8, 9)) == FP8_E4M3_NATIVE
    assert fp8_decode("fp8_e4m3", (7, 0)) != FP8_E4M3_NATIVE
    assert fp8_decode("fp8_e5m2", (7, 0)) != fp8_decode("fp8_e5m2", (9, 0))
