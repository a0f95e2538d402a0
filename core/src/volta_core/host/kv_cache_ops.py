"""The KV-cache writer an attention backend uses, resolved through the format's owner.

The plugin that defines a KV-cache format (``volta_kv_cache_ops``) owns the code that writes it,
so a cache holds the same codes whichever backend reads it. A backend that declares a
``kv_cache_layout`` asks here, once when it is built, for the writer of its layer's dtype.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from volta_core.errors import PluginError
from volta_core.host.discovery import get_plugin_manager
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import canonical_kv_dtype

#: ``write(key, value, kv_cache, slot_mapping, *, kv_cache_dtype, k_scale, v_scale,
#: check_values)``, as :class:`volta_core.host.types.KVCacheOpsSpec` describes it.
KVCacheWriter = Callable[..., None]


def kv_cache_writer(
    layout: str,
    kv_cache_dtype: str,
    activation_dtype: str = "float16",
    manager: VoltaPluginManager | None = None,
) -> KVCacheWriter:
    """The write function of the plugin that owns ``kv_cache_dtype`` in ``layout``.

    ``kv_cache_dtype`` is spelled as vLLM's ``--kv-cache-dtype`` (``auto`` is the activation
    dtype). Raises :class:`PluginError` naming the format when no plugin writes it or its
    writer cannot be imported.
    """
    manager = manager if manager is not None else get_plugin_manager()
    dtype = canonical_kv_dtype(kv_cache_dtype, activation_dtype)
    owner = manager.kv_cache_format(layout, dtype)
    if owner is None:
        raise PluginError(
            f"no vllm-volta plugin writes a {dtype} KV cache in the {layout} layout "
            "(install the plugin that defines the format, vllm-volta-fp8kv)"
        )
    plugin, spec = owner
    module, _, name = spec.impl.partition(":")
    try:
        write = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise PluginError(
            f"plugin {plugin!r}: the {spec.name} KV-cache writer {spec.impl} cannot be "
            f"imported: {exc}"
        ) from exc
    if not callable(write):
        raise PluginError(f"plugin {plugin!r}: the {spec.name} KV-cache writer is not callable")
    return write  # type: ignore[no-any-return]
