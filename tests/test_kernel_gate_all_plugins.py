"""The compile gate over every kernel configuration every installed plugin declares.

Each plugin's own tests gate its kernels at sm_70 too; this one checks the installed set
together, as discovery sees it, so a configuration a plugin declares but does not test is still
gated. In the repository's root run, a build a plugin's own gate test compiles for the same
target in the same session is left to it (``tests/conftest.py`` deselects the repeat: each
distribution's own test run gates its builds). It also compiles for sm_90 the configurations a
plugin would launch on the H100, built as the JIT specializes them and unspecialized: no GPU is
needed to learn that a kernel does not compile there (Triton 3.6's SM90 pipeliner once rejected
a prefill kernel that passed the sm_70 gate, and only the device told). One test id per plugin
and configuration.

The H100 list is the product of every launch parameter (1,687 builds, over half an hour of
two CPU cores from a cold Triton cache), so by default this compiles its all-pairs cover
(:func:`~volta_devkit.gate.pairwise_cover`: every two parameter values that occur together in
one build of a kernel occur together in a compiled one); ``VOLTA_TEST_SM90_GATE=all`` compiles
every build, as before a session on the H100.
"""

from __future__ import annotations

import os
from typing import TypeVar

import pytest

import volta_core
from volta_core import Device
from volta_core.host.discovery import discover
from volta_core.host.types import CudaKernelConfig, KernelConfig
from volta_core.kernel_api import CudaToolkitUnavailable, nvrtc_version
from volta_devkit.cuda_gate import check_cuda_config
from volta_devkit.gate import (
    assert_gate_passes,
    check_kernel_config,
    compiled,
    gate_variants,
    pairwise_cover,
)

pytest.importorskip("triton", reason="the kernel gate needs the `kernels` extra (triton)")

H100 = Device((9, 0))

#: ``all``: the sm_90 test compiles every H100 build, not their all-pairs cover.
SM90_GATE_ENV = "VOLTA_TEST_SM90_GATE"


#: Why an empty parameter list is a failure: a gate over nothing would pass (or skip) silently
#: when every kernel plugin failed to load.
NOTHING_TO_GATE = (
    "no installed plugin declares kernel configurations for {device} (volta_kernel_configs, "
    "volta_cuda_kernel_configs): "
    "the kernel plugins failed to load or are not installed; `vllm-volta plugins` says why"
)


def _params(device: Device, variants: bool, cover: bool = False) -> list[object]:
    configs = volta_core.get_plugin_manager().kernel_configs(device)
    if not configs:
        return [pytest.param(str(device), None, id="no-kernel-configs")]
    builds = [
        (plugin, cfg)
        for plugin, declared in configs
        for cfg in (gate_variants([declared]) if variants else [declared])
    ]
    if cover:
        kept = {id(cfg) for cfg in pairwise_cover([cfg for _, cfg in builds])}
        builds = [(plugin, cfg) for plugin, cfg in builds if id(cfg) in kept]
    return [pytest.param(plugin, cfg, id=f"{plugin}/{cfg.name}") for plugin, cfg in builds]


def _cuda_params(device: Device) -> list[object]:
    configs = volta_core.get_plugin_manager().cuda_kernel_configs(device)
    if not configs:
        return [pytest.param(str(device), None, id="no-cuda-kernel-configs")]
    return [pytest.param(plugin, cfg, id=f"{plugin}/{cfg.name}") for plugin, cfg in configs]


Config = TypeVar("Config", KernelConfig, CudaKernelConfig)


def _require(plugin: str, cfg: Config | None) -> Config:
    if cfg is None:
        pytest.fail(NOTHING_TO_GATE.format(device=plugin))
    return cfg


def test_every_installed_plugin_loads() -> None:
    """In a user's environment (no filter, no test plugins) every installed plugin loads."""
    records = discover({}).records.values()
    failed = [
        f"{r.name}: {r.status.value}: {r.error}" for r in records if r.status.value != "loaded"
    ]
    assert not failed, failed


@pytest.mark.parametrize(("plugin", "cfg"), _params(volta_core.V100, variants=False))
def test_declared_kernel_config_passes_sm70_gate(plugin: str, cfg: KernelConfig | None) -> None:
    report = check_kernel_config(_require(plugin, cfg), capability=70)
    assert report.capability == 70
    assert_gate_passes(report)


@pytest.mark.parametrize(
    ("plugin", "cfg"),
    _params(H100, variants=True, cover=os.environ.get(SM90_GATE_ENV) != "all"),
)
def test_h100_kernel_config_compiles_for_sm90(plugin: str, cfg: KernelConfig | None) -> None:
    """Compiles; spills and shared memory are Volta's limits, not judged at sm_90, so the
    gate only compiles (no ``ptxas -v``, no disassembly)."""
    report = check_kernel_config(_require(plugin, cfg), capability=90, measure=False)
    assert compiled(report), report.describe()


@pytest.mark.parametrize(("plugin", "cfg"), _cuda_params(volta_core.V100))
def test_declared_cuda_build_passes_sm70_gate(plugin: str, cfg: CudaKernelConfig | None) -> None:
    """Every CUDA-source build a plugin declares for a V100 (``volta_cuda_kernel_configs``)
    compiles with NVRTC for sm_70 without spills, within 96 KB of shared memory and the register
    file, with HMMA in its SASS where it claims the tensor cores."""
    try:
        nvrtc_version()
    except CudaToolkitUnavailable as exc:
        pytest.skip(f"the CUDA gate needs NVRTC: {exc}")
    report = check_cuda_config(_require(plugin, cfg), capability=70)
    assert report.capability == 70
    assert_gate_passes(report)
