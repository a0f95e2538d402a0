"""The SM70 compile gate over every configuration the plugin reports for a V100."""

from __future__ import annotations

import pytest

from volta_core.device import V100, Device
from volta_devkit.gate import assert_gate_passes, check_kernel_config, gate_variants
from volta_fp8kv import configs, plugin

V100_CONFIGS = plugin.volta_kernel_configs(V100)


@pytest.mark.parametrize("cfg", gate_variants(V100_CONFIGS), ids=lambda c: c.name)
def test_every_sm70_config_passes_the_gate(cfg):
    report = check_kernel_config(cfg, capability=70)
    assert_gate_passes(report)
    assert report.n_spills == 0


def test_sm70_configs_cover_both_kernels_every_head_pad_and_no_e4m3():
    names = {c.name for c in V100_CONFIGS}
    for kernel in configs.KERNELS:
        for fmt in ("float16", "fp8_e5m2"):
            for pad in configs.HEAD_PADS:
                assert f"fp8kv.{kernel}[{fmt},head_pad={pad}]" in names
    assert not any(
        "e4m3" in n or c.constexprs["FMT"] == 2 for n, c in ((c.name, c) for c in V100_CONFIGS)
    )
    assert all(c.constexprs["HEAD_PAD"] * c.constexprs["BLOCK_T"] <= 1024 for c in V100_CONFIGS)


def test_sm89_and_newer_add_e4m3_configs():
    for device in (Device((8, 9)), Device((9, 0))):
        assert any(c.constexprs["FMT"] == 2 for c in plugin.volta_kernel_configs(device))


@pytest.mark.parametrize(
    ("hk", "hv", "pad"),
    [(64, 64, 64), (80, 80, 128), (128, 64, 128), (256, 256, 256), (512, 512, 512), (8, 8, 64)],
)
def test_head_pad_is_what_the_configs_list(hk, hv, pad):
    assert configs.head_pad(hk, hv) == pad
