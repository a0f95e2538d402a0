"""The SM70 compile gate over every kernel configuration every installed plugin declares.

Each plugin's own tests gate its kernels too; this one checks the installed set together, as
discovery sees it, so a configuration a plugin declares but does not test is still gated. One
test id per plugin and configuration.
"""

from __future__ import annotations

import pytest

import volta_core
from volta_core.kernels.gate import assert_gate_passes, check_kernel_config
from volta_core.types import KernelConfig

pytest.importorskip("triton", reason="the kernel gate needs the `kernels` extra (triton)")


def _kernel_configs() -> list[tuple[str, KernelConfig]]:
    return volta_core.get_plugin_manager().kernel_configs(volta_core.V100)


def _params() -> list[object]:
    configs = _kernel_configs()
    if not configs:
        return [
            pytest.param(
                None,
                None,
                id="no-kernel-configs",
                marks=pytest.mark.skip(
                    reason="no installed plugin declares kernel configurations for sm_70 "
                    "(volta_kernel_configs); nothing to gate yet"
                ),
            )
        ]
    return [pytest.param(plugin, cfg, id=f"{plugin}/{cfg.name}") for plugin, cfg in configs]


@pytest.mark.parametrize(("plugin", "cfg"), _params())
def test_declared_kernel_config_passes_sm70_gate(plugin: str, cfg: KernelConfig) -> None:
    report = check_kernel_config(cfg, capability=70)
    assert report.capability == 70
    assert_gate_passes(report)
