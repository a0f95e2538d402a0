"""Per-layer attention routing on compute capability 7.x, free of vLLM.

vLLM asks its platform for a backend once per distinct layer configuration
(``Platform.get_attn_backend_cls``). The Volta platform
(:mod:`volta_core.vllm.platform_class`) turns vLLM's selector configuration into plain values,
and this module answers through the host's
:meth:`~volta_core.host.manager.VoltaPluginManager.select_attention`: the one selection the plan
command shows.
"""

from __future__ import annotations

from dataclasses import dataclass

from volta_core.device import Device
from volta_core.host import builtins
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import AttentionBackendSpec, AttentionFeature, AttentionLayer

#: Compute capability majors the Volta platform routes (Volta 7.0/7.2, Turing 7.5).
ROUTED_MAJORS = (7,)

#: Block size assumed when the user did not set one (vLLM's CUDA default).
DEFAULT_BLOCK_SIZE = 16


def routes(device: Device | None) -> bool:
    """Whether the adapter routes attention on ``device`` (never on SM80+, ROCm or CPU)."""
    return device is not None and device.capability[0] in ROUTED_MAJORS


@dataclass(frozen=True)
class SelectorLayer:
    """What vLLM's selector says about a layer, as plain values.

    ``special`` names a property the host's declarations cannot describe (MLA, sparse
    attention, encoder-decoder cross attention...): such layers are left to vLLM.
    """

    head_size: int
    dtype: str
    kv_cache_dtype: str
    block_size: int | None
    num_heads: int | None = None
    has_sliding_window: bool = False
    has_sink: bool = False
    non_causal: bool = False
    special: str | None = None
    prefix: str | None = None


def to_attention_layer(layer: SelectorLayer) -> AttentionLayer:
    """The host's description of the layer (the prefix names it in every error)."""
    features = set()
    if layer.has_sliding_window:
        features.add(AttentionFeature.SLIDING_WINDOW)
    if layer.has_sink:
        features.add(AttentionFeature.SINKS)
    if layer.non_causal:
        features.add(AttentionFeature.ENCODER)
    prefix = layer.prefix or f"<attention layer with head size {layer.head_size}>"
    return AttentionLayer(
        prefix=prefix,
        head_size=layer.head_size,
        num_heads=layer.num_heads or 0,
        num_kv_heads=layer.num_heads or 0,
        dtype=layer.dtype,
        kv_cache_dtype=layer.kv_cache_dtype,
        block_size=layer.block_size or DEFAULT_BLOCK_SIZE,
        features=frozenset(features),
    )


def known_backend(manager: VoltaPluginManager, name: str) -> bool:
    """Whether ``name`` is a backend the host can select (a plugin's or a declared built-in)."""
    specs = [spec for _, spec in manager.attention_backends()]
    specs += [*builtins.BUILTIN_BACKENDS, *builtins.NAMED_ONLY_BACKENDS]
    return any(name in (spec.name, spec.vllm_name) for spec in specs)


def plugin_backend(manager: VoltaPluginManager, name: str) -> bool:
    """Whether ``name`` is a plugin's backend (one that runs the plugins' KV-cache format)."""
    return any(name == spec.name for _, spec in manager.attention_backends())


def select(
    manager: VoltaPluginManager,
    layer: SelectorLayer,
    device: Device,
    forced: str | None,
    family: str | None = None,
) -> AttentionBackendSpec | None:
    """The backend for one layer, or None where vLLM's own selection should decide; ``family``
    (the vLLM family's name) says whose own backend an explicit name means.

    None for layers the host cannot describe (``special``) and for an explicit
    ``--attention-backend`` the host does not know (vLLM validates that one itself). A layer no
    candidate admits, and a layer the explicitly chosen backend cannot run, raise
    :class:`NoAttentionBackendError` naming the layer and every reason.
    """
    if layer.special is not None:
        return None
    if forced is not None and not known_backend(manager, forced):
        return None
    return manager.select_attention(to_attention_layer(layer), device, forced, family).backend
