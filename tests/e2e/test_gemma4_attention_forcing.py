"""vLLM's Gemma-4 configuration hook against the adapter's per-layer routing, on real configs.

vLLM 0.32's ``Gemma4Config.verify_and_update_config`` sets ``--attention-backend TRITON_ATTN``
for the whole model whenever the layers' head sizes differ and FlashAttention 4 is unavailable,
which is every 7.x GPU (and this CPU host). The Volta platform must honour an explicit backend,
so without the adapter's override no Gemma-4 layer would reach the plugin backend on a V100,
whatever ``vllm-volta plan`` shows. These tests build the engine configuration of a tiny
Gemma-4-like text model with vLLM's own ``EngineArgs`` and run the hook, vLLM's and the
adapter's, on it. (The engine run with the override in place is
``plugins/attn_v100/tests/test_engine_dual_head.py``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_support import requires_vllm

pytestmark = requires_vllm
ARCH = "Gemma4ForCausalLM"


@pytest.fixture(scope="module")
def engine_config(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The engine configuration vLLM builds for a 256/512 head-size Gemma-4-like model."""
    pytest.importorskip("transformers")
    from transformers import Gemma4TextConfig
    from vllm.engine.arg_utils import EngineArgs

    path: Path = tmp_path_factory.mktemp("gemma4_config")
    Gemma4TextConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=256,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        per_layer_config={"02": {"head_dim": 512}},
        sliding_window=8,
        max_position_embeddings=512,
        hidden_size_per_layer_input=0,
        architectures=[ARCH],
        dtype="float16",
    ).save_pretrained(path)
    args = EngineArgs(model=str(path), skip_tokenizer_init=True, dtype="float16", max_model_len=256)
    return args.create_engine_config()


def run_hook(config: Any, hook: type, backend: Any = None) -> Any:
    """Run one configuration hook with the user's ``--attention-backend`` set to ``backend``."""
    config.attention_config.backend = backend
    hook.verify_and_update_config(config)
    return config.attention_config.backend


def test_vllm_forces_triton_attn_on_the_whole_model(engine_config: Any) -> None:
    """The behaviour the override exists for, pinned on vLLM's own hook."""
    from vllm.model_executor.models.config import Gemma4Config
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert run_hook(engine_config, Gemma4Config) == AttentionBackendEnum.TRITON_ATTN


def test_override_leaves_the_choice_per_layer_under_a_volta_platform(engine_config: Any) -> None:
    from volta_core.vllm import model_config_hooks

    override = model_config_hooks.make_model_config_overrides(lambda: True)[ARCH]
    assert run_hook(engine_config, override) is None


def test_override_changes_nothing_where_the_adapter_does_not_route(engine_config: Any) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from volta_core.vllm import model_config_hooks

    override = model_config_hooks.make_model_config_overrides(lambda: False)[ARCH]
    assert run_hook(engine_config, override) == AttentionBackendEnum.TRITON_ATTN


@pytest.mark.parametrize("chosen", ["TRITON_ATTN", "FLEX_ATTENTION"])
def test_a_backend_the_user_chose_is_never_taken_back(engine_config: Any, chosen: str) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from volta_core.vllm import model_config_hooks

    override = model_config_hooks.make_model_config_overrides(lambda: True)[ARCH]
    user = AttentionBackendEnum[chosen]
    assert run_hook(engine_config, override, user) == user


def test_registration_wraps_vllms_hook_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registered twice (the general plugin runs in every process, maybe more than once), the
    entry still wraps vLLM's own hook, not a previous override."""
    from vllm.model_executor.models import config as model_configs

    from volta_core.vllm import model_config_hooks

    for arch in model_config_hooks.PER_LAYER_HEAD_SIZE_ARCHS:  # restored after the test
        monkeypatch.setitem(model_configs.MODELS_CONFIG_MAP, arch, model_configs.Gemma4Config)
    for _ in range(2):
        model_config_hooks.register_model_config_overrides(
            model_config_hooks.make_model_config_overrides(lambda: True)
        )
    for arch in model_config_hooks.PER_LAYER_HEAD_SIZE_ARCHS:
        entry = model_configs.MODELS_CONFIG_MAP[arch]
        assert entry.volta_base is model_configs.Gemma4Config
        assert issubclass(entry, model_configs.Gemma4Config)


def test_the_multimodal_gemma4_architectures_are_routed_too() -> None:
    """Real Gemma-4 checkpoints are ``Gemma4ForConditionalGeneration``; vLLM gives it the same
    hook, so it needs the same override (its mm-prefix layers stay vLLM's in the selector)."""
    from vllm.model_executor.models import config as model_configs

    from volta_core.vllm import model_config_hooks

    overrides = model_config_hooks.make_model_config_overrides(lambda: True)
    hooked = {
        arch
        for arch, hook in model_configs.MODELS_CONFIG_MAP.items()
        if getattr(hook, "volta_base", hook) is model_configs.Gemma4Config
    }
    assert "Gemma4ForConditionalGeneration" in hooked
    assert hooked <= set(overrides)


def test_routed_platform_is_false_on_the_cpu_platform() -> None:
    from volta_core.vllm import model_config_hooks

    assert model_config_hooks.routed_platform() is False
