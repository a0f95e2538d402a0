"""vLLM's per-architecture configuration hooks (``MODELS_CONFIG_MAP``) subclassed for Gemma-4,
so that the whole-model TRITON_ATTN vLLM forces for mixed head sizes does not override the Volta
platform's per-layer attention routing.

vLLM is imported lazily, inside the functions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from volta_core.vllm import attention, report

log = logging.getLogger("volta_core.vllm")

#: Architectures whose vLLM configuration hook (``Gemma4Config.verify_and_update_config`` in
#: ``vllm/model_executor/models/config.py``) forces ``--attention-backend TRITON_ATTN`` for
#: the whole model when FlashAttention 4 is unavailable (any 7.x GPU) because the layers have
#: different head sizes (Gemma-4: 256 sliding, 512 global). The multimodal architectures
#: (real Gemma-4 checkpoints) share that hook; a model whose text layers attend bidirectionally
#: over image tokens (``is_mm_prefix_lm``) asks the selector with ``use_mm_prefix`` for every
#: layer, which the host leaves to vLLM, so routing per layer changes nothing for those.
PER_LAYER_HEAD_SIZE_ARCHS = (
    "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedForConditionalGeneration",
)


def routed_platform() -> bool:
    """Whether vLLM's current platform is a Volta platform that routes attention per layer."""
    from vllm.platforms import current_platform

    volta_device = getattr(current_platform, "_volta_device", None)
    return volta_device is not None and attention.routes(volta_device())


def make_model_config_overrides(routes_now: Callable[[], bool]) -> dict[str, type]:
    """Subclasses of vLLM's per-architecture configuration hooks for
    :data:`PER_LAYER_HEAD_SIZE_ARCHS`: when ``routes_now()``, a whole-model TRITON_ATTN the hook
    chose itself is taken back, so the Volta platform routes every layer (the plugin backend
    where it can run the layer, TRITON_ATTN where it cannot, as ``vllm-volta plan`` shows).

    Without this, vLLM hands the platform ``selected_backend=TRITON_ATTN`` for every Gemma-4
    layer on a V100, which the adapter must honour as an explicit ``--attention-backend``: no
    layer would reach the plugin backend. A backend the user chose (set before the hook ran)
    is never touched; on devices the adapter does not route the hook's result stands.
    """
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    overrides: dict[str, type] = {}
    for arch in PER_LAYER_HEAD_SIZE_ARCHS:
        base = MODELS_CONFIG_MAP.get(arch)
        if base is None:
            continue
        base = getattr(base, "volta_base", base)  # always over vLLM's own hook (idempotent)

        def verify_and_update_config(
            vllm_config: Any, _base: Any = base, _arch: str = arch
        ) -> None:
            attention_config = vllm_config.attention_config
            chosen_before = attention_config.backend
            _base.verify_and_update_config(vllm_config)
            forced = attention_config.backend
            if (
                chosen_before is None
                and forced == AttentionBackendEnum.TRITON_ATTN
                and routes_now()
            ):
                attention_config.backend = None
                log.info(
                    "vllm-volta: %s: vLLM chose TRITON_ATTN for every layer (head sizes "
                    "differ); the Volta platform chooses per layer instead",
                    _arch,
                )
                report.event("attention_backend_unforced", architecture=_arch, vllm=forced.name)

        overrides[arch] = type(
            f"Volta{base.__name__}",
            (base,),
            {
                "__doc__": f"vLLM's {base.__name__}, routed per layer on 7.x (vllm-volta).",
                "volta_base": base,
                "verify_and_update_config": staticmethod(verify_and_update_config),
            },
        )
    return overrides


def register_model_config_overrides(overrides: dict[str, type]) -> None:
    """Put the overrides in vLLM's per-architecture hook registry (looked up per engine)."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    MODELS_CONFIG_MAP.update(overrides)
    if overrides:
        report.event("model_config_override", architectures=sorted(overrides))
