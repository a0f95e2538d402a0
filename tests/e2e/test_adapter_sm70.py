"""The adapter's CUDA-only behaviour, driven with vLLM's real objects for compute capability 7.0.

No GPU here, and vLLM's CUDA platform module cannot be imported from the CPU build, so the
Volta platform class is built (by the same :func:`make_platform_class` the CUDA build uses) over
a stand-in base that reports capability 7.0 and answers ``get_attn_backend_cls`` with a marker,
which shows where the adapter defers to vLLM. Everything else is vLLM's own: selector
configurations, the backend enum and registry, the engine configuration, the quantization
configs and the KV-cache gate ``_init_kv_cache_quant`` the host must beat.

The host's plugins are registered in-process into a fresh manager, so the tests do not depend
on which plugins are installed.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_support import config_engine_args, requires_vllm, selector_flags

from volta_core import Device, VoltaPluginManager, hookimpl
from volta_core.errors import KVCacheDtypeRejected, NoAttentionBackendError
from volta_core.host.types import (
    AttentionBackendSpec,
    AttentionFeature,
    KVRequest,
    KVVerdict,
    QuantClaim,
    QuantConfig,
    QuantLayer,
    QuantMethodSpec,
    TensorSplit,
    canonical_kv_dtype,
)

pytestmark = requires_vllm

TRITON_PATH = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
#: The start of every family's e5m2 refusal (1Cat-vLLM words the rest of it differently).
VLLM_GATE = "fp8_e5m2 kv-cache is not supported with"

BACKEND_MODULE = '''
class Backend:
    """Stands for a plugin attention backend: the adapter only imports it and asks its name."""

    @staticmethod
    def get_name():
        return "CUSTOM"


class Method:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def make_method(*, volta_config, layer, engine_config):
    return Method(volta_config=volta_config, layer=layer, engine_config=engine_config)
'''


class V100Plugin:
    """An in-process plugin: an SM70 attention backend (head sizes up to 256, like the real
    one), a compressed-tensors linear claim, and the fp8 KV rules for devices below SM89."""

    VOLTA_HOST_API = "1.0"

    def __init__(self, kv_scales: str = "unit") -> None:
        self.kv_scales = kv_scales

    @hookimpl
    def volta_attention_backends(self) -> list[AttentionBackendSpec]:
        return [
            AttentionBackendSpec(
                name="TEST_V100_ATTN",
                impl="voltatest_backend:Backend",
                priority=100,
                min_capability=(7, 0),
                max_capability=(7, 5),
                dtypes={"float16"},
                kv_cache_dtypes={"float16", "fp8_e5m2"},
                head_sizes={64, 128, 256},
                features={AttentionFeature.SLIDING_WINDOW},
            )
        ]

    @hookimpl
    def volta_quant_methods(self) -> list[QuantMethodSpec]:
        return [QuantMethodSpec("test-wna16", "voltatest_backend:make_method")]

    @hookimpl
    def volta_quant_method(
        self, config: QuantConfig, layer: QuantLayer, device: Device
    ) -> QuantClaim | None:
        if config.method != "compressed-tensors" or layer.kind.value != "linear":
            return None
        return QuantClaim("test-wna16", "voltatest_backend:make_method", priority=1)

    @hookimpl
    def volta_kv_cache_verdict(self, request: KVRequest) -> KVVerdict | None:
        dtype = canonical_kv_dtype(request.kv_cache_dtype, request.activation_dtype)
        if dtype == "fp8_e4m3" and not request.device.has_fp8_e4m3:
            return KVVerdict.reject(f"e4m3 needs SM89; {request.device.sm} has no e4m3")
        if dtype == "fp8_e5m2":
            scales = self.kv_scales if request.checkpoint.scheme.value != "none" else "unit"
            return KVVerdict.accept("e5m2 runs everywhere", scales=scales)
        return None


def make_manager(kv_scales: str = "unit") -> VoltaPluginManager:
    manager = VoltaPluginManager()
    manager.register(V100Plugin(kv_scales), "test_v100", distribution="in-process")
    return manager


@pytest.fixture(scope="module", autouse=True)
def backend_module(tmp_path_factory: pytest.TempPathFactory) -> None:
    directory = tmp_path_factory.mktemp("voltatest")
    (directory / "voltatest_backend.py").write_text(BACKEND_MODULE)
    sys.path.insert(0, str(directory))


@pytest.fixture(scope="module")
def manager() -> VoltaPluginManager:
    return make_manager()


def platform(manager: VoltaPluginManager, capability: tuple[int, int] = (7, 0)) -> Any:
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    from volta_core.vllm.platform_class import make_platform_class

    class StandInCuda(Platform):
        _enum = PlatformEnum.CUDA
        device_name = "stand-in"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*capability)

        @classmethod
        def get_attn_backend_cls(
            cls, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
        ) -> str:
            return f"vllm-own:{getattr(selected_backend, 'name', None)}"

    return make_platform_class(StandInCuda, lambda: manager)


def selector(head_size: int, kv: str = "auto", **flags: Any) -> Any:
    import torch
    from vllm.v1.attention.selector import AttentionSelectorConfig

    return AttentionSelectorConfig(
        head_size=head_size,
        dtype=torch.float16,
        kv_cache_dtype=kv,
        block_size=None,
        **selector_flags(**flags),
    )


def backend(name: str) -> Any:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name]


# -- attention routing ----------------------------------------------------------------------


def test_plugin_backend_is_bound_to_custom_and_chosen(manager: VoltaPluginManager) -> None:
    path = platform(manager).get_attn_backend_cls(None, selector(128), num_heads=8)
    assert path == "voltatest_backend.Backend"
    assert backend("CUSTOM").get_path() == "voltatest_backend.Backend"


@pytest.mark.parametrize("kv", ["auto", "float16"])
def test_gemma4_like_layers_fall_back_per_head_size(manager: VoltaPluginManager, kv: str) -> None:
    volta = platform(manager)
    sliding = volta.get_attn_backend_cls(None, selector(256, kv, has_sliding_window=True), 16)
    global_layer = volta.get_attn_backend_cls(None, selector(512, kv), 16)
    assert sliding == "voltatest_backend.Backend"
    assert global_layer == TRITON_PATH


def test_fp8_kv_layers_never_get_triton_attn_below_sm89(manager: VoltaPluginManager) -> None:
    volta = platform(manager)
    assert volta.get_attn_backend_cls(None, selector(256, "fp8_e5m2"), 16) == (
        "voltatest_backend.Backend"
    )
    with pytest.raises(NoAttentionBackendError) as error:
        volta.get_attn_backend_cls(None, selector(512, "fp8_e5m2"), 16)
    message = str(error.value)
    assert "head size 512" in message
    assert "TEST_V100_ATTN: head size 512 is not one of its head sizes (64, 128, 256)" in message
    assert "TRITON_ATTN: KV-cache dtype fp8_e5m2 needs compute capability 8.9" in message


def test_explicit_backend_names_the_layer_and_reason(manager: VoltaPluginManager) -> None:
    volta = platform(manager)

    class Gemma4Attention:  # constructs like a vLLM attention layer: its prefix names it
        def __init__(self, prefix: str, head_size: int, selected: str) -> None:
            volta.get_attn_backend_cls(backend(selected), selector(head_size), 16)

    assert volta.get_attn_backend_cls(backend("CUSTOM"), selector(256), 16) == (
        "voltatest_backend.Backend"
    )
    with pytest.raises(NoAttentionBackendError) as error:
        Gemma4Attention("model.layers.5.self_attn.attn", 512, "CUSTOM")
    assert "layer model.layers.5.self_attn.attn" in str(error.value)
    assert "head size 512 is not one of its head sizes" in str(error.value)

    assert volta.get_attn_backend_cls(backend("TRITON_ATTN"), selector(512), 16) == TRITON_PATH
    with pytest.raises(NoAttentionBackendError, match=r"needs compute capability 8\.9"):
        volta.get_attn_backend_cls(backend("TRITON_ATTN"), selector(512, "fp8_e5m2"), 16)


def test_backends_the_host_does_not_know_and_special_layers_stay_vllms(
    manager: VoltaPluginManager,
) -> None:
    volta = platform(manager)
    assert volta.get_attn_backend_cls(backend("FLASH_ATTN"), selector(128), 8) == (
        "vllm-own:FLASH_ATTN"
    )
    assert volta.get_attn_backend_cls(None, selector(576, use_mla=True), 8) == "vllm-own:None"


def test_multimodal_prefix_layers_stay_vllms(manager: VoltaPluginManager) -> None:
    """A multimodal Gemma-4 whose text layers attend bidirectionally over image tokens asks with
    ``use_mm_prefix`` (every layer); the plugin backend is causal only, so vLLM chooses."""
    volta = platform(manager)
    for head_size in (256, 512):
        assert volta.get_attn_backend_cls(None, selector(head_size, use_mm_prefix=True), 16) == (
            "vllm-own:None"
        )


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (9, 0), (12, 0)])
def test_never_routes_sm80_and_newer(manager: VoltaPluginManager, capability: tuple) -> None:
    volta = platform(manager, capability)
    for head_size, kv in ((128, "auto"), (512, "fp8_e5m2")):
        assert volta.get_attn_backend_cls(None, selector(head_size, kv), 8) == "vllm-own:None"


def test_platform_plugin_stays_out_on_the_cpu_build() -> None:
    from volta_core.vllm import families
    from volta_core.vllm import platform as platform_plugin

    assert families.is_cpu_build()
    assert platform_plugin.detect() is None


# -- KV-cache dtype at config time ---------------------------------------------------------


@pytest.fixture(scope="module")
def engine_config(checkpoints: dict[str, Path]) -> Any:
    """vLLM's real engine configuration for the scripted W4A16 checkpoint."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(checkpoints["w4a16-kv"]),
        kv_cache_dtype="fp8_e5m2",
        max_model_len=256,
        enforce_eager=True,
        gpu_memory_utilization=0.1,
        **config_engine_args("fp8_e5m2"),
    )
    return args.create_engine_config()


def with_kv(config: Any, kv_cache_dtype: str) -> Any:
    changed = copy.copy(config)
    changed.cache_config = copy.copy(config.cache_config)
    changed.cache_config.cache_dtype = kv_cache_dtype
    return changed


def test_config_time_rejection_carries_the_hosts_reason(
    manager: VoltaPluginManager, engine_config: Any
) -> None:
    volta = platform(manager)
    with pytest.raises(KVCacheDtypeRejected) as error:
        volta.check_and_update_config(with_kv(engine_config, "fp8"))
    message = str(error.value)
    assert "--kv-cache-dtype fp8 is rejected on sm_70" in message
    assert "test_v100: e4m3 needs SM89; sm_70 has no e4m3" in message
    volta.check_and_update_config(with_kv(engine_config, "fp8_e5m2"))  # accepted
    platform(manager, (9, 0)).check_and_update_config(with_kv(engine_config, "fp8"))


# -- quantization configs and vLLM's KV-cache gate -----------------------------------------


def quant_raw(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "config.json").read_text())["quantization_config"]


def bare_attention(kv_cache_dtype: str) -> Any:
    import torch
    from vllm.model_executor.layers.attention import Attention

    layer = Attention.__new__(Attention)
    torch.nn.Module.__init__(layer)
    layer.kv_cache_dtype = kv_cache_dtype
    layer.num_kv_heads = 1
    return layer


def gate(quant_config: Any, kv_cache_dtype: str = "fp8_e5m2") -> Any:
    """vLLM's own KV-cache initialisation of an attention layer, gate included."""
    from vllm.model_executor.layers.attention.attention import _init_kv_cache_quant

    layer = bare_attention(kv_cache_dtype)
    _init_kv_cache_quant(layer, quant_config, "model.layers.0.self_attn.attn")
    return layer


def overrides(manager: VoltaPluginManager, device: Device | None) -> dict[str, type]:
    from volta_core.vllm.quantization import make_quantization_overrides

    return make_quantization_overrides(manager, lambda: device)


SM70 = Device((7, 0))


def test_vllm_refuses_e5m2_on_an_fp8_kv_checkpoint_the_host_accepts_it(
    checkpoints: dict[str, Path],
) -> None:
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    raw = quant_raw(checkpoints["w4a16-kv"])
    with pytest.raises(ValueError, match=VLLM_GATE):
        gate(CompressedTensorsConfig.from_config(copy.deepcopy(raw)))

    checkpoint_scales = overrides(make_manager("checkpoint:per_tensor"), SM70)
    layer = gate(checkpoint_scales["compressed-tensors"].from_config(copy.deepcopy(raw)))
    assert type(layer.quant_method).__name__ == "VoltaCheckpointScalesKVMethod"
    assert layer.quant_method.quant_config.kv_cache_scheme["strategy"] == "tensor"
    assert tuple(layer.k_scale.shape) == (1,)  # the checkpoint's per-tensor scale is loaded

    unit = overrides(make_manager("unit"), SM70)
    layer = gate(unit["compressed-tensors"].from_config(copy.deepcopy(raw)))
    assert not hasattr(layer, "quant_method")
    assert not hasattr(layer, "k_scale")  # unit scales: nothing loaded from the checkpoint


def test_the_layers_own_kv_dtype_is_judged_not_the_engine_wide_one(
    checkpoints: dict[str, Path],
) -> None:
    """vLLM resolves the KV dtype per layer; with an engine config of ``auto`` current, a layer
    that says e5m2 is judged as e5m2 (judging ``auto`` would hand it to vLLM's gate)."""
    from vllm.config import VllmConfig, set_current_vllm_config

    raw = quant_raw(checkpoints["w4a16-kv"])
    config = overrides(make_manager("checkpoint:per_tensor"), SM70)["compressed-tensors"]
    with set_current_vllm_config(VllmConfig()):
        layer = gate(config.from_config(copy.deepcopy(raw)))
    assert type(layer.quant_method).__name__ == "VoltaCheckpointScalesKVMethod"


def test_rejected_kv_dtype_fails_with_every_reason(checkpoints: dict[str, Path]) -> None:
    raw = quant_raw(checkpoints["w4a16-kv"])
    config = overrides(make_manager(), SM70)["compressed-tensors"].from_config(raw)
    with pytest.raises(KVCacheDtypeRejected, match="test_v100: e4m3 needs SM89"):
        gate(config, "fp8")


@pytest.mark.parametrize("device", [None, SM70], ids=["no-device", "sm70"])
def test_weight_only_checkpoint_gets_no_kv_method(
    checkpoints: dict[str, Path], device: Device | None
) -> None:
    raw = quant_raw(checkpoints["w4a16"])
    config = overrides(make_manager(), device)["compressed-tensors"].from_config(raw)
    for kv in ("fp8_e5m2", "auto"):
        layer = gate(config, kv)
        assert not hasattr(layer, "quant_method")


def test_dense_fp8_checkpoint_boots_e5m2_with_unit_scales() -> None:
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    raw = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "is_checkpoint_fp8_serialized": True,
    }
    with pytest.raises(ValueError, match=VLLM_GATE):
        gate(Fp8Config.from_config(dict(raw)))
    volta_fp8 = overrides(make_manager(), SM70)["fp8"]
    layer = gate(volta_fp8.from_config(dict(raw)))
    assert not hasattr(layer, "quant_method")
    assert float(layer._k_scale) == 1.0
    # Without a device to judge for, vLLM's own rule stands.
    with pytest.raises(ValueError, match=VLLM_GATE):
        gate(overrides(make_manager(), None)["fp8"].from_config(dict(raw)))


def test_linear_layers_are_claimed_through_the_host(checkpoints: dict[str, Path]) -> None:
    from vllm.model_executor.layers.linear import ReplicatedLinear

    raw = quant_raw(checkpoints["w4a16"])
    layer = ReplicatedLinear.__new__(ReplicatedLinear)
    layer.input_size, layer.output_size = 256, 128
    prefix = "model.layers.0.mlp.down_proj"

    config = overrides(make_manager(), SM70)["compressed-tensors"].from_config(copy.deepcopy(raw))
    method = config.get_quant_method(layer, prefix)
    assert type(method).__name__ == "Method"
    assert method.kwargs["engine_config"] is config
    assert method.kwargs["volta_config"].method == "compressed-tensors"
    # A replicated layer: tensor parallelism divides neither side.
    assert method.kwargs["layer"] == QuantLayer(
        "linear", prefix, 256, 128, tensor_parallel_size=1, split=TensorSplit.NONE
    )

    unjudged = overrides(make_manager(), None)["compressed-tensors"].from_config(raw)
    assert (
        type(unjudged.get_quant_method(layer, prefix)).__name__ == "CompressedTensorsLinearMethod"
    )


@pytest.mark.parametrize(
    ("capabilities", "activates"),
    [
        ([(7, 0)], True),
        ([(7, 0), (7, 0), (7, 0), (7, 0)], True),
        ([(7, 5)], True),
        ([(7, 0), (8, 0)], False),
        ([(8, 0)], False),
        ([(9, 0)], False),
        ([], False),
        (None, False),
    ],
)
def test_platform_plugin_activates_on_7x_gpus_only(
    monkeypatch: pytest.MonkeyPatch, capabilities: list | None, activates: bool
) -> None:
    from volta_core.vllm import devices, families
    from volta_core.vllm import platform as platform_plugin

    monkeypatch.setattr(families, "is_cpu_build", lambda: False)
    monkeypatch.setattr(devices, "nvml_capabilities", lambda: capabilities)
    expected = "volta_core.vllm.cuda_platform.VoltaCudaPlatform" if activates else None
    assert platform_plugin.detect() == expected


def test_platform_plugin_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    from volta_core.vllm import devices, families
    from volta_core.vllm import platform as platform_plugin

    def broken() -> None:
        raise OSError("NVML library not found")

    monkeypatch.setattr(families, "is_cpu_build", lambda: False)
    monkeypatch.setattr(devices, "nvml_capabilities", broken)
    assert platform_plugin.detect() is None
