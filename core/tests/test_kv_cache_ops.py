"""KV-cache formats: declared by the plugin that defines them, required by backends that write
through the host, resolved to one writer, and named in the plan."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from volta_core import (
    PACKED_KV_LAYOUT,
    V100,
    AttentionBackendSpec,
    AttentionLayer,
    KVCacheOpsSpec,
    PluginError,
    kv_cache_writer,
)
from volta_core.errors import DuplicateDeclarationError, NoAttentionBackendError
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import PluginStatus

WRITER_MODULE = "volta_test_kv_writer"


@pytest.fixture
def writer_module() -> Iterator[types.ModuleType]:
    """An importable module holding a write function, as a format's owner would ship."""
    module = types.ModuleType(WRITER_MODULE)
    calls: list[dict[str, Any]] = []

    def write(*args: Any, **kwargs: Any) -> None:
        calls.append({"args": args, **kwargs})

    module.write = write  # type: ignore[attr-defined]
    module.calls = calls  # type: ignore[attr-defined]
    module.not_callable = 3  # type: ignore[attr-defined]
    sys.modules[WRITER_MODULE] = module
    yield module
    del sys.modules[WRITER_MODULE]


def _formats(*dtypes: str, impl: str = f"{WRITER_MODULE}:write") -> list[KVCacheOpsSpec]:
    return [KVCacheOpsSpec(d, impl) for d in dtypes]


def _host_writing(backend: Callable[..., AttentionBackendSpec]) -> AttentionBackendSpec:
    return backend("VOLTA", kv_cache_layout=PACKED_KV_LAYOUT)


def _layer(kv_cache_dtype: str) -> AttentionLayer:
    return AttentionLayer("model.layers.0.self_attn", 128, 32, 8, "float16", kv_cache_dtype)


def test_formats_are_attributed_and_listed(
    manager: VoltaPluginManager, fake_plugin: Any, writer_module: Any
) -> None:
    manager.register(fake_plugin(volta_kv_cache_ops=_formats("float16", "fp8_e5m2")), "fmt")
    assert [(p, s.name) for p, s in manager.kv_cache_formats()] == [
        ("fmt", "packed.float16"),
        ("fmt", "packed.fp8_e5m2"),
    ]
    assert manager.records["fmt"].provides["KV-cache format"] == (
        "packed.float16",
        "packed.fp8_e5m2",
    )


def test_two_owners_of_one_format_are_both_disabled(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    manager.register(fake_plugin(volta_kv_cache_ops=_formats("fp8_e5m2")), "first")
    with pytest.raises(DuplicateDeclarationError) as info:
        manager.register(fake_plugin(volta_kv_cache_ops=_formats("fp8_e5m2")), "second")
    assert "first" in str(info.value)
    assert "packed.fp8_e5m2" in str(info.value)
    assert manager.records["first"].status is PluginStatus.FAILED
    assert manager.kv_cache_formats() == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (KVCacheOpsSpec("fp8", f"{WRITER_MODULE}:write"), "dtype is not one of"),
        (KVCacheOpsSpec("fp8_e5m2", "no colon"), "impl is 'package.module:Attribute'"),
    ],
)
def test_malformed_formats_fail_their_plugin(
    manager: VoltaPluginManager, fake_plugin: Any, spec: KVCacheOpsSpec, message: str
) -> None:
    with pytest.raises(PluginError, match=message):
        manager.register(fake_plugin(volta_kv_cache_ops=[spec]), "bad")
    assert "bad" not in manager.records or manager.records["bad"].status is not PluginStatus.LOADED


def test_a_backend_writing_through_the_host_needs_the_layers_format(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any, writer_module: Any
) -> None:
    manager.register(fake_plugin(volta_attention_backends=[_host_writing(backend)]), "attn")
    with pytest.raises(NoAttentionBackendError) as info:
        manager.select_attention(_layer("fp8_e5m2"), V100)
    assert [r.reason for r in info.value.refusals if r.backend == "VOLTA"] == [
        "no plugin writes a fp8_e5m2 KV cache in its packed layout (install the plugin that "
        "defines the format, vllm-volta-fp8kv)"
    ]

    manager.register(fake_plugin(volta_kv_cache_ops=_formats("fp8_e5m2")), "fmt")
    chosen = manager.select_attention(_layer("fp8_e5m2"), V100)
    assert chosen.backend.name == "VOLTA"
    assert manager.cache_writer(chosen.backend, "fp8_e5m2") == "plugin fmt"
    # fp16 has no owner here: the backend is refused for it.
    assert manager.select_attention(_layer("auto"), V100).backend.name != "VOLTA"


def test_who_writes_the_cache_of_other_backends(
    manager: VoltaPluginManager, fake_plugin: Any, backend: Any
) -> None:
    own = backend("OWN")
    manager.register(fake_plugin(volta_attention_backends=[own]), "attn")
    assert manager.cache_writer(own, "float16") == "plugin attn"
    builtin = manager.select_attention(_layer("auto"), V100).backend
    assert builtin.name == "OWN"
    triton = AttentionBackendSpec(
        "TRITON_ATTN", "vllm:x", 0, (7, 0), (12, 0), {"float16"}, {"float16"}, builtin=True
    )
    assert manager.cache_writer(triton, "float16") == "vLLM"


def test_the_writer_is_the_owners_function(
    manager: VoltaPluginManager, fake_plugin: Any, writer_module: Any
) -> None:
    manager.register(fake_plugin(volta_kv_cache_ops=_formats("float16", "fp8_e5m2")), "fmt")
    assert kv_cache_writer(PACKED_KV_LAYOUT, "fp8_e5m2", manager=manager) is writer_module.write
    # ``auto`` is the activation dtype.
    assert kv_cache_writer(PACKED_KV_LAYOUT, "auto", "float16", manager) is writer_module.write


def test_a_missing_or_broken_writer_is_one_clear_error(
    manager: VoltaPluginManager, fake_plugin: Any, writer_module: Any
) -> None:
    with pytest.raises(PluginError, match="no vllm-volta plugin writes a fp8_e5m2 KV cache"):
        kv_cache_writer(PACKED_KV_LAYOUT, "fp8_e5m2", manager=manager)
    specs = [
        KVCacheOpsSpec("fp8_e5m2", "volta_no_such_module:write"),
        KVCacheOpsSpec("float16", f"{WRITER_MODULE}:not_callable"),
    ]
    manager.register(fake_plugin(volta_kv_cache_ops=specs), "broken")
    with pytest.raises(PluginError, match=r"'broken'.*packed\.fp8_e5m2.*cannot be imported"):
        kv_cache_writer(PACKED_KV_LAYOUT, "fp8_e5m2", manager=manager)
    with pytest.raises(PluginError, match=r"'broken'.*not callable"):
        kv_cache_writer(PACKED_KV_LAYOUT, "float16", manager=manager)
