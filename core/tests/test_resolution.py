"""The pure resolution functions: attention per layer, quant claims, KV verdicts, no-loss rule."""

from __future__ import annotations

from typing import Any

import pytest

from volta_core import V100, Device
from volta_core.errors import (
    KVCacheDtypeRejected,
    NoAttentionBackendError,
    PluginError,
    ReasoningTextLost,
)
from volta_core.host.builtins import TRITON_ATTN
from volta_core.host.resolution import (
    candidate_order,
    check_no_text_lost,
    combine_verdicts,
    refusal_reason,
    require_accepted,
    resolve_quant,
    select_backend,
)
from volta_core.host.types import (
    AttentionFeature,
    AttentionLayer,
    CheckpointKV,
    KVRequest,
    KVVerdict,
    QuantClaim,
    QuantDecline,
    QuantLayer,
    ReasoningSplit,
)

H100 = Device((9, 0))


def layer(head_size: int = 128, kv: str = "auto", **kw: object) -> AttentionLayer:
    fields: dict[str, object] = {
        "prefix": f"model.layers.0.attn.h{head_size}",
        "head_size": head_size,
        "num_heads": 8,
        "num_kv_heads": 2,
        "dtype": "float16",
        "kv_cache_dtype": kv,
    }
    fields.update(kw)
    return AttentionLayer(**fields)  # type: ignore[arg-type]


def test_head_size_fallback_per_layer(backend: Any) -> None:
    volta = backend("VOLTA", head_sizes={64, 128, 256})
    candidates = [volta, TRITON_ATTN]
    small = select_backend(layer(256), V100, candidates)
    assert small.backend is volta
    assert not small.is_fallback
    big = select_backend(layer(512), V100, candidates)
    assert big.backend is TRITON_ATTN
    assert [r.backend for r in big.refusals] == ["VOLTA"]
    assert "head size 512 is not one of its head sizes (64, 128, 256)" in big.refusals[0].reason


def test_builtin_is_no_fallback_for_fp8_kv_below_sm89(backend: Any) -> None:
    volta = backend("VOLTA", head_sizes={128})
    with pytest.raises(NoAttentionBackendError) as info:
        select_backend(layer(512, kv="fp8_e5m2"), V100, [volta, TRITON_ATTN])
    message = str(info.value)
    assert "model.layers.0.attn.h512" in message
    assert "VOLTA: head size 512" in message
    assert "TRITON_ATTN: KV-cache dtype fp8_e5m2 needs compute capability 8.9" in message
    # On an SM89+ device the built-in is valid for the same layer.
    assert (
        select_backend(layer(512, kv="fp8_e5m2"), Device((8, 9)), [TRITON_ATTN]).backend
        is TRITON_ATTN
    )


def test_priority_order_with_builtins_last(backend: Any) -> None:
    low, high = backend("LOW", priority=1), backend("HIGH", priority=50)
    assert [b.name for b in candidate_order([TRITON_ATTN, low, high])] == [
        "HIGH",
        "LOW",
        "TRITON_ATTN",
    ]
    assert select_backend(layer(), V100, [low, high, TRITON_ATTN]).backend is high


def test_backends_for_other_devices_are_not_reported_as_fallbacks(backend: Any) -> None:
    hopper_only = backend("HOPPER", min_capability=(9, 0), max_capability=(9, 0), priority=99)
    choice = select_backend(layer(), V100, [hopper_only, TRITON_ATTN])
    assert choice.backend is TRITON_ATTN
    assert choice.refusals == ()


@pytest.mark.parametrize(
    ("overrides", "layer_kw", "expected"),
    [
        ({"dtypes": {"float16"}}, {"dtype": "bfloat16"}, "activation dtype bfloat16"),
        ({}, {"kv_cache_dtype": "fp8"}, "KV-cache dtype fp8_e4m3 is not one of"),
        ({"block_size_multiple": 32}, {"block_size": 16}, "block size 16 is not a multiple of 32"),
        ({}, {"features": {AttentionFeature.ALIBI}}, "does not implement alibi"),
        ({"min_head_size": 256, "head_sizes": set()}, {}, "below its minimum 256"),
        ({"max_capability": (6, 1), "min_capability": (6, 0)}, {}, "outside 6.0..6.1"),
    ],
)
def test_refusal_reasons(overrides: dict, layer_kw: dict, expected: str, backend: Any) -> None:
    reason = refusal_reason(backend("B", **overrides), layer(**layer_kw), V100)
    assert reason is not None
    assert expected in reason


def test_e4m3_needs_the_declared_capability(backend: Any) -> None:
    spec = backend(
        "B",
        kv_cache_dtypes={"float16", "fp8_e5m2", "fp8_e4m3"},
        max_capability=(9, 0),
        kv_dtype_min_capability={"fp8_e4m3": (8, 9)},
    )
    assert "needs compute capability 8.9" in (refusal_reason(spec, layer(kv="fp8"), V100) or "")
    assert refusal_reason(spec, layer(kv="fp8"), H100) is None


def test_forced_backend_only_tries_that_backend(backend: Any) -> None:
    volta = backend("VOLTA", head_sizes={128})
    assert select_backend(layer(128), V100, [volta, TRITON_ATTN], forced="VOLTA").backend is volta
    with pytest.raises(NoAttentionBackendError, match=r"h256: .*VOLTA: head size 256"):
        select_backend(layer(256), V100, [volta, TRITON_ATTN], forced="VOLTA")
    with pytest.raises(NoAttentionBackendError, match="'NOPE' is not declared"):
        select_backend(layer(128), V100, [volta], forced="NOPE")


def test_no_candidates_at_all() -> None:
    with pytest.raises(NoAttentionBackendError, match="no backend is declared"):
        select_backend(layer(), V100, [])


def _request(dtype: str = "fp8_e5m2") -> KVRequest:
    return KVRequest(dtype, CheckpointKV(), V100)


def test_any_reject_wins_and_lists_every_reason() -> None:
    decision = combine_verdicts(
        _request("fp8"),
        [
            ("a", KVVerdict.accept("fine", "careful")),
            ("b", KVVerdict.reject("no e4m3 on sm_70")),
            ("c", None),
            ("d", KVVerdict.reject("second reason")),
        ],
    )
    assert decision.accepted is False
    assert decision.reasons == ("b: no e4m3 on sm_70", "d: second reason")
    with pytest.raises(KVCacheDtypeRejected) as info:
        require_accepted(decision)
    assert "b: no e4m3 on sm_70" in str(info.value)
    assert "d: second reason" in str(info.value)


def test_accept_with_warnings_and_no_opinion() -> None:
    decision = combine_verdicts(
        _request(), [("a", KVVerdict.accept("ok", "w1", "w2", scales="unit"))]
    )
    assert decision.accepted is True
    assert decision.warnings == ("a: w1", "a: w2")
    assert require_accepted(decision) is decision
    silent = combine_verdicts(_request(), [("a", None)])
    assert silent.accepted is None
    assert silent.verdicts == ()


def test_quant_highest_priority_claim_wins_and_declines_are_kept() -> None:
    qlayer = QuantLayer("linear", "model.layers.0.mlp.down_proj", 17408, 5120)
    answers = [
        ("low", QuantClaim("m1", "a:B", priority=1)),
        ("high", QuantClaim("m2", "a:C", priority=5)),
        ("picky", QuantDecline("m3", "g_idx is not supported")),
        ("silent", None),
    ]
    resolution = resolve_quant(qlayer, answers)
    assert resolution.source == "high"
    assert resolution.claim is not None
    assert resolution.claim.method == "m2"
    assert resolution.declines == (("picky", QuantDecline("m3", "g_idx is not supported")),)


def test_quant_tie_is_an_error_naming_both_plugins() -> None:
    qlayer = QuantLayer("linear", "l")
    answers = [("one", QuantClaim("m1", "a:B")), ("two", QuantClaim("m2", "a:C"))]
    with pytest.raises(PluginError, match="'one' \\(m1\\) and 'two' \\(m2\\)"):
        resolve_quant(qlayer, answers)


def test_quant_without_claims_leaves_it_to_the_engine() -> None:
    resolution = resolve_quant(QuantLayer("attention", "a"), [("x", None)])
    assert resolution.claim is None
    assert resolution.source is None


def test_no_text_lost_rule() -> None:
    text = "<think> a b </think>\n\nanswer"
    assert check_no_text_lost(text, ReasoningSplit("a b", "answer")).content == "answer"
    with pytest.raises(ReasoningTextLost, match="keeps 2 of 8"):
        check_no_text_lost(text, ReasoningSplit("a b", None))
    with pytest.raises(ReasoningTextLost):
        check_no_text_lost(text, ReasoningSplit("a b", "answers"))
