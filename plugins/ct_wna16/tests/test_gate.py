"""The SM70 compile gate over every configuration the plugin launches on a V100."""

from __future__ import annotations

import pytest

from volta_core.device import V100, Device
from volta_core.kernels.gate import assert_gate_passes, check_kernel_config
from volta_ct_wna16 import configs
from volta_ct_wna16.plugin import volta_kernel_configs

SM70_CONFIGS = list(volta_kernel_configs(V100))


def test_the_list_covers_every_launch_choose_makes_on_sm70() -> None:
    names = {c.name for c in SM70_CONFIGS}
    kinds = {c.kernel.rsplit(":", 1)[1] for c in SM70_CONFIGS}
    assert kinds == {
        "wna16_splitk_kernel",
        "wna16_reduce_kernel",
        "wna16_gemm_kernel",
        "wna16_dequant_kernel",
    }
    for m in range(1, 64):
        for bits in (4, 8):
            launch = configs.choose(m, (7, 0), bits)
            tile = f"m{launch.block_m}n{launch.block_n}k{launch.block_k}"
            if launch.path == configs.DEQUANT_MATMUL:
                tile = f"n{launch.block_n}k{launch.block_k}"
            assert any(tile in name and f"w{bits}" in name for name in names), (m, bits, tile)


def test_sm90_tiles_differ_from_sm70_tiles() -> None:
    sm90 = {c.name for c in volta_kernel_configs(Device((9, 0)))}
    assert sm90 != {c.name for c in SM70_CONFIGS}


@pytest.mark.parametrize("cfg", SM70_CONFIGS, ids=lambda c: c.name)
def test_sm70_gate(cfg) -> None:
    report = check_kernel_config(cfg, capability=70)
    assert_gate_passes(report)
    if cfg.constexprs.get("USE_DOT") is False:
        # The decode GEMV converts integers with the fp32 bit trick, not the int-to-float unit.
        assert report.sass_histogram.get("FFMA", 0) > 0
