"""Reading a checkpoint's quantization section, and naming devices."""

from __future__ import annotations

import pytest

from volta_core import parse_device
from volta_core.errors import UsageError
from volta_core.host.checkpoint import (
    checkpoint_kv,
    is_ignored,
    quant_config,
    unquantized_reason,
    weight_format,
)
from volta_core.host.types import KVScaleScheme, QuantConfig

W4A16 = {
    "quant_method": "compressed-tensors",
    "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
    "ignore": ["lm_head", "re:.*mlp\\.gate$"],
    "kv_cache_scheme": None,
}


def test_weight_only_checkpoint_has_no_kv_scales() -> None:
    cfg = quant_config(W4A16)
    assert cfg is not None
    kv = checkpoint_kv(cfg)
    assert kv.scheme is KVScaleScheme.NONE
    assert kv.calibrated_for is None
    assert kv.weight_format == "int4"


@pytest.mark.parametrize(
    ("strategy", "scheme"),
    [("tensor", KVScaleScheme.PER_TENSOR), ("attn_head", KVScaleScheme.PER_ATTENTION_HEAD)],
)
def test_compressed_tensors_kv_scheme(strategy: str, scheme: KVScaleScheme) -> None:
    raw = dict(W4A16, kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": strategy})
    kv = checkpoint_kv(quant_config(raw))
    assert kv.scheme is scheme
    assert kv.calibrated_for == "fp8_e4m3"


def test_unknown_kv_strategy_is_refused_not_guessed() -> None:
    raw = dict(W4A16, kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": "channel"})
    with pytest.raises(UsageError, match="'channel'"):
        checkpoint_kv(quant_config(raw))


def test_dense_fp8_and_unquantized() -> None:
    fp8 = quant_config({"quant_method": "fp8", "fmt": "e4m3"})
    assert weight_format(fp8) == "fp8"
    assert checkpoint_kv(fp8).scheme is KVScaleScheme.NONE
    algo = quant_config({"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"})
    assert checkpoint_kv(algo).scheme is KVScaleScheme.PER_TENSOR
    assert quant_config(None) is None
    assert checkpoint_kv(None).weight_format == "fp16"
    assert weight_format(quant_config({"quant_method": "awq", "bits": 4})) == "int4"


def test_ignore_list_exact_names_and_patterns() -> None:
    cfg = quant_config(W4A16)
    assert cfg is not None
    assert is_ignored(cfg, "lm_head")
    assert is_ignored(cfg, "model.layers.3.mlp.gate")
    assert not is_ignored(cfg, "model.layers.3.mlp.gate_proj")
    assert not is_ignored(cfg, "lm_head.extra")


@pytest.mark.parametrize(
    ("text", "capability"),
    [
        ("sm70", (7, 0)),
        ("sm_89", (8, 9)),
        ("SM90", (9, 0)),
        ("7.5", (7, 5)),
        ("cuda:8.0", (8, 0)),
        ("sm_120", (12, 0)),
    ],
)
def test_parse_device(text: str, capability: tuple[int, int]) -> None:
    assert parse_device(text).capability == capability


@pytest.mark.parametrize("text", ["sm7", "volta", "70.0", "sm_990", ""])
def test_parse_device_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="unknown device"):
        parse_device(text)


def test_device_capabilities() -> None:
    v100, ada = parse_device("sm70"), parse_device("sm89")
    assert not v100.has_fp8_e4m3
    assert not v100.has_bf16
    assert ada.has_fp8_e4m3
    assert ada.has_bf16


def test_why_a_module_of_a_quantized_checkpoint_runs_unquantized() -> None:
    """The plan's reason per module: the compressed-tensors ``ignore`` list; for vLLM's ``fp8``
    method its ``ignored_layers`` by exact name and the output head, which ``Fp8Config`` never
    quantizes; None for a module the checkpoint quantizes."""
    ct = QuantConfig("compressed-tensors", {"ignore": ["lm_head"]})
    assert unquantized_reason(ct, "lm_head") == "in the checkpoint's ignore list"
    assert unquantized_reason(ct, "model.layers.0.mlp.down_proj") is None
    fp8 = QuantConfig("fp8", {"modules_to_not_convert": ["model.layers.0.mlp.gate"]})
    assert "output head" in (unquantized_reason(fp8, "lm_head") or "")
    assert "output head" in (unquantized_reason(fp8, "mtp.lm_head") or "")
    assert (
        unquantized_reason(fp8, "model.layers.0.mlp.gate") == "in the checkpoint's ignored layers"
    )
    assert unquantized_reason(fp8, "model.layers.0.mlp.gate_proj") is None
