"""Plain values read from the vLLM engine configuration being built: the activation dtype, an
attention layer's KV-cache dtype, and the ``--attention-backend`` the user chose.

vLLM is imported lazily, inside the functions that read it.
"""

from __future__ import annotations

from typing import Any


def activation_dtype(dtype: Any) -> str:
    """A torch dtype (or its name) as the host spells dtypes: ``float16``, ``bfloat16``..."""
    return str(dtype).removeprefix("torch.")


def layer_kv_dtype(layer: Any) -> tuple[str, str]:
    """The layer's KV-cache dtype and the activation dtype.

    The layer's own ``kv_cache_dtype`` comes first: vLLM resolves it per layer (layers in
    ``kv_cache_dtype_skip_layers`` keep ``auto``), so the engine-wide ``--kv-cache-dtype`` of
    the current config is only the fallback for a layer that has none.
    """
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    engine_kv = getattr(getattr(config, "cache_config", None), "cache_dtype", None)
    dtype = getattr(getattr(config, "model_config", None), "dtype", None)
    kv = str(getattr(layer, "kv_cache_dtype", None) or engine_kv or "auto")
    return kv, activation_dtype(dtype) if dtype is not None else "float16"


def explicit_backend() -> str | None:
    """The ``--attention-backend`` of the engine being built, None in auto mode."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    backend = getattr(getattr(config, "attention_config", None), "backend", None)
    return None if backend is None else str(getattr(backend, "name", backend))
