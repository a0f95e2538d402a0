"""The plugin as the host sees it: light to load, declared through the entry point, its cache
written by the plugin that owns the format (fp8kv), and per-layer selection that gives what it
does not declare to the host's fallback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from volta_attn_v100.dispatch import (
    TENSOR_CORES,
    TRITON,
    cuda_kernel_configs,
    takes_cuda_decode,
    takes_cuda_prefill,
)
from volta_attn_v100.limits import MAX_DECODE_QUERY_LEN
from volta_attn_v100.plugin import BACKEND_NAME
from volta_core import (
    PACKED_KV_LAYOUT,
    V100,
    Device,
    PluginError,
    VoltaPluginManager,
    canonical_kv_dtype,
    kv_cache_writer,
)
from volta_core.errors import NoAttentionBackendError
from volta_core.host.types import AttentionFeature, AttentionLayer, KernelPath


def test_loading_the_plugin_imports_no_heavy_module() -> None:
    code = (
        "import sys, volta_attn_v100.plugin as p; list(p.volta_attention_backends()); "
        "list(p.volta_kernel_configs(__import__('volta_core').V100)); "
        "list(p.volta_cuda_kernel_configs(__import__('volta_core').V100)); "
        "from volta_core import AttentionLayer; from volta_core.kernel_api import Workload; "
        "layer = AttentionLayer('l', 128, 32, 8, 'float16', 'auto'); "
        "list(p.volta_kernel_paths(layer, p.BACKEND_NAME, __import__('volta_core').V100, None)); "
        "p.volta_kernel_cost(layer, p.BACKEND_NAME, __import__('volta_core').V100, None, "
        "Workload(4, 1, 1024)); "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'vllm')]; "
        "print(heavy); assert not heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def manager(plugins: tuple[str, ...] = ("attn_v100", "fp8kv")) -> VoltaPluginManager:
    """A host with this plugin and the one that writes its cache formats (its dependency)."""
    m = VoltaPluginManager()
    m.load_entrypoints(list(plugins))
    return m


def test_entry_point_declares_the_backend() -> None:
    backends = dict((spec.name, (plugin, spec)) for plugin, spec in manager().attention_backends())
    plugin, spec = backends["VOLTA_ATTN_V100"]
    assert plugin == "attn_v100"
    assert spec.vllm_name == "CUSTOM"
    assert spec.impl == "volta_attn_v100.backend:VoltaAttentionBackend"
    assert spec.head_sizes == {64, 80, 96, 128, 256, 512}
    assert spec.kv_cache_layout == PACKED_KV_LAYOUT


@pytest.mark.parametrize("kv", ["auto", "float16", "fp8_e5m2", "fp8", "fp8_e4m3"])
def test_every_declared_cache_format_is_written_by_fp8kv(kv) -> None:
    """The host resolves the writer of every KV dtype the backend declares to fp8kv's, and the
    plan names fp8kv as the layer's cache writer."""
    from volta_fp8kv.cache_ops import write

    m = manager()
    assert kv_cache_writer(PACKED_KV_LAYOUT, kv, "float16", manager=m) is write
    choice = m.select_attention(layer(128, kv), Device((9, 0)))
    assert choice.backend.name == "VOLTA_ATTN_V100"
    assert m.cache_writer(choice.backend, canonical_kv_dtype(kv, "float16")) == "plugin fp8kv"


def test_without_the_format_owner_no_layer_runs_here() -> None:
    """Alone (fp8kv not loaded), the backend is refused for every layer with the reason, and a
    writer cannot be resolved: one error naming the missing format."""
    alone = manager(("attn_v100",))
    choice = alone.select_attention(layer(128), V100)
    assert choice.backend.name == "TRITON_ATTN"
    assert "no plugin writes a float16 KV cache in its packed layout" in choice.refusals[0].reason
    with pytest.raises(PluginError, match="writes a fp8_e5m2 KV cache in the packed layout"):
        kv_cache_writer(PACKED_KV_LAYOUT, "fp8_e5m2", manager=alone)


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


def _query_lengths(stage: str) -> range:
    lengths = stage.removeprefix("decode, ").split(" ")[0]
    first, _, last = lengths.partition("-")
    return range(int(first), int(last or first) + 1)


@pytest.mark.parametrize("device", [V100, Device((9, 0))])
@pytest.mark.parametrize(
    ("head", "heads", "kv_heads", "kv"),
    [
        (128, 32, 8, "auto"),
        (128, 32, 8, "fp8_e5m2"),
        (256, 24, 4, "auto"),
        (128, 8, 8, "fp8_e5m2"),
        (64, 16, 2, "auto"),
        (512, 16, 2, "auto"),
    ],
)
def test_the_plan_shows_the_launchers_kernel_per_stage(device, head, heads, kv_heads, kv) -> None:
    """``volta_kernel_paths``: the prefill's kernel and the decode's for every query length
    (1 to 8, each once and in order), as the launcher's rules pick them; the tensor cores need
    NVRTC, with Triton as the fallback, on the FMA units below SM80 and the tensor cores from
    there."""
    layer = AttentionLayer("model.layers.0.self_attn.attn", head, heads, kv_heads, "float16", kv)
    paths = manager().kernel_paths("attn_v100", layer, BACKEND_NAME, device)
    kv_dtype = canonical_kv_dtype(kv, "float16")
    prefill, *decode = paths
    triton_unit = "FMA" if device == V100 else "tensor cores"

    def expected(stage: str, tensor: bool) -> KernelPath:
        if tensor:
            return KernelPath(stage, TENSOR_CORES, True, TRITON, "tensor cores", triton_unit)
        return KernelPath(stage, TRITON, unit=triton_unit)

    assert prefill == expected("prefill", takes_cuda_prefill(device.capability, head, kv_dtype))
    covered = [q for path in decode for q in _query_lengths(path.stage)]
    assert covered == list(range(1, MAX_DECODE_QUERY_LEN + 1))
    for path in decode:
        for q_len in _query_lengths(path.stage):
            chosen = takes_cuda_decode(device.capability, head, kv_dtype, heads // kv_heads, q_len)
            assert path == expected(path.stage, chosen), (q_len, path)
    assert any(p.needs_nvrtc for p in paths) == (device == V100 and head in (64, 128, 256))


def test_v100_decode_of_a_32_8_layer_takes_the_tensor_cores_up_to_4_query_tokens() -> None:
    layer = AttentionLayer("l", 128, 32, 8, "float16", "fp8_e5m2")
    paths = manager().kernel_paths("attn_v100", layer, BACKEND_NAME, V100)
    assert [(p.stage, p.kernel) for p in paths] == [
        ("prefill", TENSOR_CORES),
        ("decode, 1-4 query tokens", TENSOR_CORES),
        ("decode, 5-8 query tokens", TRITON),
    ]


def test_the_cuda_builds_are_declared_through_the_host() -> None:
    declared = manager().cuda_kernel_configs(V100)
    ours = cuda_kernel_configs(V100.capability)
    assert [cfg for plugin, cfg in declared if plugin == "attn_v100"] == ours
    assert ours
    assert manager().cuda_kernel_configs(Device((9, 0))) == []
