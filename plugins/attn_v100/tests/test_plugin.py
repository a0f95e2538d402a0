"""The plugin as the host sees it: light to load, declared through the entry point, and
per-layer selection that gives 512-dim layers (not declared) to the host's fallback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from volta_core import V100, Device, VoltaPluginManager
from volta_core.errors import NoAttentionBackendError
from volta_core.types import AttentionFeature, AttentionLayer


def test_loading_the_plugin_imports_no_heavy_module() -> None:
    code = (
        "import sys, volta_attn_v100.plugin as p; list(p.volta_attention_backends()); "
        "list(p.volta_kernel_configs(__import__('volta_core').V100)); "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'vllm')]; "
        "print(heavy); assert not heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def manager() -> VoltaPluginManager:
    m = VoltaPluginManager()
    m.load_entrypoints(["attn_v100"])
    return m


def test_entry_point_declares_the_backend() -> None:
    backends = dict((spec.name, (plugin, spec)) for plugin, spec in manager().attention_backends())
    plugin, spec = backends["VOLTA_ATTN_V100"]
    assert plugin == "attn_v100"
    assert spec.vllm_name == "CUSTOM"
    assert spec.impl == "volta_attn_v100.backend:VoltaAttentionBackend"
    assert spec.head_sizes == {64, 80, 96, 128, 256, 512}


def layer(head_size: int, kv: str = "auto", **kw) -> AttentionLayer:
    return AttentionLayer(
        prefix=f"model.layers.0.self_attn.d{head_size}",
        head_size=head_size,
        num_heads=8,
        num_kv_heads=2,
        dtype="float16",
        kv_cache_dtype=kv,
        **kw,
    )


@pytest.mark.parametrize("kv", ["auto", "fp8_e5m2"])
def test_gemma4_layers_both_on_this_backend(kv) -> None:
    """Gemma-4's 256-dim sliding and 512-dim global layers, fp16 or e5m2 KV: with e5m2 no other
    backend runs the 512-dim layers on a V100 (TRITON_ATTN refuses fp8 KV below SM89)."""
    m = manager()
    sliding = m.select_attention(
        layer(
            256, kv, features={AttentionFeature.SLIDING_WINDOW, AttentionFeature.LOGITS_SOFT_CAP}
        ),
        V100,
    )
    assert sliding.backend.name == "VOLTA_ATTN_V100"
    assert m.select_attention(layer(512, kv), V100).backend.name == "VOLTA_ATTN_V100"


def test_undeclared_head_size_falls_back() -> None:
    choice = manager().select_attention(layer(192), V100)
    assert choice.backend.name == "TRITON_ATTN"
    assert "head size 192" in choice.refusals[0].reason


def test_fp8_e5m2_on_v100_and_e4m3_refused() -> None:
    m = manager()
    assert m.select_attention(layer(128, "fp8_e5m2"), V100).backend.name == "VOLTA_ATTN_V100"
    with pytest.raises(
        NoAttentionBackendError,
        match=r"VOLTA_ATTN_V100: KV-cache dtype fp8_e4m3 needs compute capability 8\.9",
    ):
        m.select_attention(layer(128, "fp8_e4m3"), V100)


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3"])
def test_e4m3_from_sm89(kv) -> None:
    """e4m3 (vLLM's ``fp8``) is declared where the hardware converts it: SM89 and the H100."""
    m = manager()
    for capability in ((8, 9), (9, 0)):
        choice = m.select_attention(layer(128, kv), Device(capability))
        assert choice.backend.name == "VOLTA_ATTN_V100", capability


def test_alibi_falls_back() -> None:
    choice = manager().select_attention(layer(128, features={AttentionFeature.ALIBI}), V100)
    assert choice.backend.name == "TRITON_ATTN"
    assert "alibi" in choice.refusals[0].reason
