"""The vLLM adapter's modules, without an engine: the typed KV-scale source of a verdict, the
KV-cache method it implies, and modules of one job each.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from volta_core.device import Device
from volta_core.host.types import (
    CheckpointKV,
    KVDecision,
    KVRequest,
    KVScaleScheme,
    KVVerdict,
    QuantConfig,
)
from volta_core.vllm import kv_cache
from volta_core.vllm.kv_cache import KVMethod, ScaleSource, attention_kv_method, scale_source

ADAPTER = Path(importlib.import_module("volta_core.vllm").__file__ or "").parent
SM70 = Device((7, 0))


@pytest.mark.parametrize(
    ("scales", "source"),
    [
        ("unit", ScaleSource.UNIT),
        ("checkpoint", ScaleSource.CHECKPOINT),
        ("checkpoint:per_tensor", ScaleSource.CHECKPOINT),
        ("checkpoint:per_attention_head", ScaleSource.CHECKPOINT),
        ("", ScaleSource.UNSTATED),
        ("checkpoint:none", ScaleSource.UNSTATED),
        ("checkpointed", ScaleSource.UNSTATED),
    ],
)
def test_a_verdicts_scales_are_read_word_for_word(scales: str, source: ScaleSource) -> None:
    assert scale_source(KVVerdict.accept("ok", scales=scales)) is source


def _e5m2(scheme: KVScaleScheme, *verdicts: KVVerdict) -> KVDecision:
    request = KVRequest("fp8_e5m2", CheckpointKV(scheme), SM70)
    return KVDecision(request, True, tuple((f"p{i}", v) for i, v in enumerate(verdicts)))


CT_KV = QuantConfig("compressed-tensors", {"kv_cache_scheme": {"num_bits": 8}})


@pytest.mark.parametrize(
    ("scheme", "scales", "method"),
    [
        (KVScaleScheme.PER_TENSOR, "checkpoint:per_tensor", KVMethod.CHECKPOINT_SCALES),
        (KVScaleScheme.PER_ATTENTION_HEAD, "checkpoint", KVMethod.CHECKPOINT_SCALES),
        (KVScaleScheme.PER_TENSOR, "unit", KVMethod.UNIT_SCALES),
        (KVScaleScheme.PER_TENSOR, "", KVMethod.UNIT_SCALES),
        (KVScaleScheme.NONE, "checkpoint", KVMethod.UNIT_SCALES),
    ],
)
def test_an_accepted_e5m2_cache_keeps_checkpoint_scales_only_where_a_verdict_says_so(
    scheme: KVScaleScheme, scales: str, method: KVMethod
) -> None:
    decision = _e5m2(scheme, KVVerdict.accept("ok", scales=scales))
    assert attention_kv_method(CT_KV, decision) is method


def test_a_rejecting_verdicts_scales_do_not_count() -> None:
    decision = _e5m2(
        KVScaleScheme.PER_TENSOR,
        KVVerdict.accept("ok", scales="unit"),
        KVVerdict("reject", "no", (), "checkpoint"),
    )
    assert attention_kv_method(CT_KV, decision) is KVMethod.UNIT_SCALES


def test_no_decision_and_weight_only_checkpoints() -> None:
    assert attention_kv_method(CT_KV, None) is KVMethod.ENGINE
    weight_only = QuantConfig("compressed-tensors", {})
    assert attention_kv_method(weight_only, None) is KVMethod.UNIT_SCALES


def test_no_adapter_module_parses_a_verdicts_scales() -> None:
    """The verdict's ``scales`` text is read in one place (:func:`scale_source`)."""
    readers = [
        path.name
        for path in sorted(ADAPTER.glob("*.py"))
        if any(
            isinstance(node, ast.Attribute) and node.attr == "scales"
            for node in ast.walk(ast.parse(path.read_text()))
        )
    ]
    assert readers == ["kv_cache.py"]
    assert "startswith" not in Path(kv_cache.__file__ or "").read_text()


def test_no_adapter_module_is_large() -> None:
    sizes = {path.name: len(path.read_text().splitlines()) for path in ADAPTER.glob("*.py")}
    assert max(sizes.values()) <= 500, sizes
