"""Kernel paths (``volta_kernel_paths``) and CUDA-source builds (``volta_cuda_kernel_configs``).

A plugin says, from its own launch rules, which kernels run a layer's stages on a device; the
plan prints it per layer, with the fallback where a stage needs NVRTC and none is installed.
Only the plugin serving the layer is asked, and a wrong answer disables it like any other.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from volta_core import V100, AttentionLayer, Device, QuantLayer
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import (
    CudaKernelConfig,
    KernelPath,
    QuantClaim,
    QuantConfig,
    QuantMethodSpec,
)
from volta_core.planner import plan as plan_module
from volta_core.planner.model import describe_model, read_config
from volta_core.planner.plan import PlanOptions, make_plan, plan_as_dict, render_text

TENSOR = "tensor cores (CUDA, mma.m8n8k4)"
PATHS = (
    KernelPath("prefill", TENSOR, needs_nvrtc=True, fallback="Triton"),
    KernelPath("decode", "Triton"),
)


def _served_paths(
    layer: AttentionLayer | QuantLayer, served_by: str, device: Device, quant: QuantConfig | None
) -> Any:
    if device != V100:
        return [KernelPath("prefill", "Triton"), KernelPath("decode", "Triton")]
    return list(PATHS) if served_by == "VOLTA" and layer.head_size == 128 else []


def _with_backend(manager: VoltaPluginManager, fake_plugin: Any, backend: Any) -> None:
    owner = fake_plugin(
        volta_attention_backends=[backend("VOLTA", head_sizes={128, 256})],
        volta_kernel_paths=_served_paths,
    )
    manager.register(owner, "owner")


def test_only_the_serving_plugin_is_asked(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any
) -> None:
    _with_backend(manager, fake_plugin, backend)
    asked: list[str] = []

    def bystander(**kwargs: Any) -> list[KernelPath]:
        asked.append(kwargs["served_by"])
        return [KernelPath("prefill", "mine")]

    manager.register(fake_plugin(volta_kernel_paths=bystander), "bystander")
    layer = AttentionLayer("l", 128, 8, 2, "float16", "auto")
    assert manager.kernel_paths("owner", layer, "VOLTA", V100) == PATHS
    assert manager.kernel_paths("owner", layer, "VOLTA", Device((9, 0)))[0].kernel == "Triton"
    assert manager.kernel_paths("nobody", layer, "VOLTA", V100) == ()
    assert asked == []


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ([KernelPath("prefill", "a"), KernelPath("prefill", "b")], "'prefill' twice"),
        ([KernelPath("prefill", "")], "empty stage or kernel"),
        ([KernelPath("", "Triton")], "empty stage or kernel"),
        ([KernelPath("prefill", TENSOR, needs_nvrtc=True)], "needing NVRTC without a fallback"),
        ("Triton", "expected a list of KernelPath"),
        ([("prefill", "Triton")], "item 0 is tuple"),
    ],
)
def test_a_wrong_answer_disables_the_plugin(
    manager: VoltaPluginManager, fake_plugin: Any, answer: Any, error: str
) -> None:
    manager.register(fake_plugin(volta_kernel_paths=answer), "wrong")
    layer = AttentionLayer("l", 128, 8, 2, "float16", "auto")
    assert manager.kernel_paths("wrong", layer, "VOLTA", V100) == ()
    (fault,) = manager.faults
    assert fault.plugin == "wrong"
    assert fault.hook == "volta_kernel_paths"
    assert error in fault.error
    assert manager.pm.get_plugin("wrong") is None


def _plan(manager: VoltaPluginManager, model: str = "qwen3-8b-fp8-kv-per-tensor") -> Any:
    name, raw = read_config(model)
    return make_plan(describe_model(name, raw), PlanOptions(device=V100), manager)


def test_the_plan_names_each_stage_and_the_nvrtc_that_builds_it(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any, monkeypatch: Any
) -> None:
    _with_backend(manager, fake_plugin, backend)
    monkeypatch.setattr(plan_module, "nvrtc_found", lambda: ("12.9", ""))
    plan = _plan(manager)
    assert {lp.kernel_paths for lp in plan.layers} == {PATHS}
    assert plan.nvrtc == "12.9"
    text = render_text(plan)
    assert (
        f"      prefill: {TENSOR} (compiled at first use by NVRTC 12.9; Triton without it)" in text
    )
    assert "      decode: Triton" in text
    data = json.loads(json.dumps(plan_as_dict(plan)))
    assert data["nvrtc"] == "12.9"
    common = {"unit": "", "fallback_unit": ""}
    assert data["attention"][0]["kernel_paths"] == [
        {"stage": "prefill", "kernel": TENSOR, "needs_nvrtc": True, "fallback": "Triton"} | common,
        {"stage": "decode", "kernel": "Triton", "needs_nvrtc": False, "fallback": ""} | common,
    ]


def test_without_nvrtc_the_plan_shows_the_fallback_and_says_why(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any, monkeypatch: Any
) -> None:
    _with_backend(manager, fake_plugin, backend)
    monkeypatch.setattr(plan_module, "nvrtc_found", lambda: (None, "cuda-bindings is missing"))
    plan = _plan(manager)
    assert plan.nvrtc is None
    text = render_text(plan)
    assert f"      prefill: Triton ({TENSOR} needs NVRTC: none here)" in text
    assert (
        "no CUDA NVRTC here, so these stages run their fallback kernels: prefill "
        "(cuda-bindings is missing)" in plan.notes
    )


def test_no_nvrtc_probe_when_no_stage_needs_it(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any, monkeypatch: Any
) -> None:
    manager.register(
        fake_plugin(
            volta_attention_backends=[backend("VOLTA", head_sizes={128})],
            volta_kernel_paths=[KernelPath("decode", "Triton")],
        ),
        "owner",
    )

    def probe() -> tuple[str | None, str]:
        raise AssertionError("probed NVRTC although no stage needs it")

    monkeypatch.setattr(plan_module, "nvrtc_found", probe)
    plan = _plan(manager)
    assert plan.nvrtc is None
    assert "      decode: Triton" in render_text(plan)
    assert not any("NVRTC" in note for note in plan.notes)


def test_quant_layers_carry_their_claiming_plugins_paths(
    manager: VoltaPluginManager, fake_plugin: Any, monkeypatch: Any
) -> None:
    def claim(config: QuantConfig, layer: QuantLayer, device: Device) -> QuantClaim:
        return QuantClaim("w4", "m:W4")

    def paths(
        layer: AttentionLayer | QuantLayer,
        served_by: str,
        device: Device,
        quant: QuantConfig | None,
    ) -> Any:
        assert isinstance(layer, QuantLayer)
        assert served_by == "w4"
        assert quant is not None
        assert quant.method == "compressed-tensors"
        return [KernelPath(f"{layer.output_size} outputs", "Triton")]

    manager.register(
        fake_plugin(
            volta_quant_methods=[QuantMethodSpec("w4", "m:W4")],
            volta_quant_method=claim,
            volta_kernel_paths=paths,
        ),
        "q",
    )
    monkeypatch.setattr(plan_module, "nvrtc_found", lambda: ("12.9", ""))
    plan = _plan(manager, "qwen3.5-27b-w4a16")
    claimed = [q for q in plan.quant if q.decision.startswith("w4")]
    assert claimed
    for q in claimed:
        assert q.kernel_paths == (KernelPath(f"{q.shape[1]} outputs", "Triton"),)
    assert f"      {claimed[0].shape[1]} outputs: Triton" in render_text(plan)


def test_cuda_kernel_configs_are_attributed(manager: VoltaPluginManager, fake_plugin: Any) -> None:
    build = CudaKernelConfig("k", 'extern "C" __global__ void k() {}', "k", 128, ("-DX=1",))
    manager.register(
        fake_plugin(volta_cuda_kernel_configs=lambda device: [build] if device == V100 else []),
        "cuda",
    )
    assert manager.cuda_kernel_configs(V100) == [("cuda", build)]
    assert manager.cuda_kernel_configs(Device((9, 0))) == []


def test_a_malformed_cuda_build_disables_its_plugin(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    bad = CudaKernelConfig("k", "src", "k", "128")  # type: ignore[arg-type]
    manager.register(fake_plugin(volta_cuda_kernel_configs=[bad]), "bad")
    assert manager.cuda_kernel_configs(V100) == []
    assert "block_threads is '128'" in manager.faults[0].error


def test_nvrtc_found_names_the_release_or_what_to_install(monkeypatch: Any) -> None:
    from volta_core import cuda_toolkit

    monkeypatch.setattr(cuda_toolkit, "nvrtc_version", lambda: (12, 9))
    assert cuda_toolkit.nvrtc_found() == ("12.9", "")
    monkeypatch.setattr(cuda_toolkit, "nvrtc_version", lambda: (13, 0))
    version, why = cuda_toolkit.nvrtc_found()
    assert version is None
    assert "NVRTC 13.0 cannot target sm_70" in why
    assert cuda_toolkit.INSTALL_HINT in why

    def missing() -> tuple[int, int]:
        raise cuda_toolkit.CudaToolkitUnavailable("cuda-bindings is not installed")

    monkeypatch.setattr(cuda_toolkit, "nvrtc_version", missing)
    assert cuda_toolkit.nvrtc_found() == (None, "cuda-bindings is not installed")
