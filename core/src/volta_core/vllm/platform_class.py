"""The Volta CUDA platform class: a subclass of vLLM's platform that, on compute capability 7.x,
routes attention per layer (:mod:`volta_core.vllm.attention` decides) and judges the KV-cache
dtype at config time (:mod:`volta_core.vllm.kv_cache` decides).

:mod:`volta_core.vllm.cuda_platform` applies :func:`make_platform_class` to vLLM's CUDA platform
(the class :data:`PLATFORM_QUALNAME` names); the tests apply it to other bases. vLLM is
imported lazily, inside the functions.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from volta_core.device import Device
from volta_core.host.manager import VoltaPluginManager
from volta_core.vllm import attention, families, kv_cache, report
from volta_core.vllm.backend_binding import backend_class_path
from volta_core.vllm.engine_config import activation_dtype

log = logging.getLogger("volta_core.vllm")

#: Import path vLLM resolves (``module.Class``) for the Volta CUDA platform.
PLATFORM_QUALNAME = "volta_core.vllm.cuda_platform.VoltaCudaPlatform"


def _calling_layer() -> tuple[Any, str | None]:
    """Best effort: the attention layer whose construction asked for a backend, and its prefix."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(40):
        if frame is None:
            return None, None
        local = frame.f_locals
        owner = local.get("self")
        if (
            frame.f_code.co_name == "__init__"
            and isinstance(local.get("prefix"), str)
            and type(owner).__name__.endswith("Attention")
        ):
            return owner, str(local["prefix"]) or None
        frame = frame.f_back
    return None, None


def selector_layer(selector_config: Any, num_heads: int | None) -> attention.SelectorLayer:
    """vLLM's ``AttentionSelectorConfig`` as plain values.

    Where the selector config has no ``has_sliding_window`` (the "selector's sliding window"
    row of :mod:`volta_core.vllm.families`), the window is read from the layer being built
    (``Attention`` sets ``self.sliding_window`` before it asks).
    """
    fields = selector_config._asdict()
    get = fields.get
    owner, prefix = _calling_layer()
    raw_type = get("attn_type") or "decoder"
    attn_type = str(getattr(raw_type, "value", raw_type))
    special = None
    if get("use_mla"):
        special = "MLA"
    elif get("use_sparse"):
        special = "sparse attention"
    elif get("use_mm_prefix"):
        special = "multimodal prefix attention"
    elif attn_type not in ("decoder", "encoder_only"):
        special = f"{attn_type} attention"
    if "has_sliding_window" in fields:
        sliding = bool(get("has_sliding_window"))
    else:
        sliding = getattr(owner, "sliding_window", None) is not None
    return attention.SelectorLayer(
        head_size=int(get("head_size")),
        dtype=activation_dtype(get("dtype")),
        kv_cache_dtype=str(get("kv_cache_dtype") or "auto"),
        block_size=get("block_size"),
        num_heads=num_heads,
        has_sliding_window=sliding,
        has_sink=bool(get("has_sink")),
        non_causal=bool(get("use_non_causal")) or attn_type == "encoder_only",
        special=special,
        prefix=prefix,
    )


def make_platform_class(base: type, manager_fn: Callable[[], VoltaPluginManager]) -> type:
    """A subclass of vLLM platform ``base`` that routes attention and judges the KV dtype.

    Both overrides act on compute capability 7.x only and defer to ``base`` everywhere else.
    """

    class VoltaCudaPlatform(base):
        @classmethod
        def _volta_device(cls) -> Device | None:
            capability = cls.get_device_capability()
            if capability is None:
                return None
            return Device((capability.major, capability.minor), getattr(cls, "device_name", ""))

        @classmethod
        def get_attn_backend_cls(
            cls, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None
        ) -> str:
            device = cls._volta_device()
            if attention.routes(device):
                layer = selector_layer(attn_selector_config, num_heads)
                forced = selected_backend.name if selected_backend is not None else None
                family = families.family().name if forced is not None else None
                spec = attention.select(manager_fn(), layer, device, forced, family)  # type: ignore[arg-type]
                if spec is not None:
                    path = backend_class_path(spec)
                    report.event("attention", backend=spec.name, head_size=layer.head_size)
                    return path
            engine_path: str = super().get_attn_backend_cls(
                selected_backend, attn_selector_config=attn_selector_config, num_heads=num_heads
            )
            return engine_path

        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            super().check_and_update_config(vllm_config)
            device = cls._volta_device()
            model_config = getattr(vllm_config, "model_config", None)
            if not attention.routes(device) or model_config is None:
                return
            raw = getattr(model_config.hf_config, "quantization_config", None)
            raw = raw if isinstance(raw, dict) else getattr(raw, "to_dict", lambda: None)()
            request = kv_cache.kv_request(
                str(vllm_config.cache_config.cache_dtype),
                raw,
                device,  # type: ignore[arg-type]
                activation_dtype(model_config.dtype),
            )
            decision = kv_cache.decide(manager_fn(), request)
            log.info("vllm-volta: %s", kv_cache.describe(decision))
            report.event("kv_decision", line=kv_cache.describe(decision))

    return VoltaCudaPlatform


def cuda_platform_base() -> type:
    """vLLM's CUDA platform class, the base of the class :data:`PLATFORM_QUALNAME` names."""
    from vllm.platforms.cuda import CudaPlatform

    platform: type = CudaPlatform
    return platform
