"""The scale semantics a reader of this cache must follow (README "Cache format"), in float64.

K scale applied after Q·K and V scale applied to the probabilities before P·V give the same
attention as dequantizing K and V first; putting a scale anywhere else does not.
"""

from __future__ import annotations

import math

import pytest
import torch

from volta_fp8kv.format import (
    CacheFormat,
    attention_reference,
    attention_scale_folded,
    bytes_per_token,
    decode_reference,
)
from volta_fp8kv.ops import write_kv_cache
from volta_fp8kv.scales import kv_scales


def cached_codes(key, value, scales):
    """Write through the real kernel and read the codes back out of the cache, in token order."""
    tokens, heads, dim = key.shape
    cache = torch.zeros(-(-tokens // 16), heads, 16, 2 * dim, dtype=torch.uint8)
    write_kv_cache(key, value, cache, torch.arange(tokens), "fp8_e5m2", scales)
    rows = cache.permute(0, 2, 1, 3).reshape(-1, heads, 2 * dim)[:tokens]
    return rows[..., :dim], rows[..., dim:]


@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
def test_folding_scales_equals_attention_on_dequantized_kv(per_head):
    gen = torch.Generator().manual_seed(3)
    tokens, heads, group, dim = 40, 2, 3, 64
    key = (torch.randn(tokens, heads, dim, generator=gen) * 5).half()
    value = torch.randn(tokens, heads, dim, generator=gen).half()
    q = torch.randn(heads * group, dim, generator=gen)
    if per_head:
        scales = kv_scales(torch.tensor([0.02, 0.3]), torch.tensor([0.01, 0.07]), heads)
    else:
        scales = kv_scales(0.05, 0.003, heads)
    k_codes, v_codes = cached_codes(key, value, scales)
    softmax_scale = 1 / math.sqrt(dim)
    fmt, f64 = CacheFormat.FP8_E5M2, torch.float64

    dequantized = attention_reference(
        q,
        decode_reference(k_codes, scales.k, fmt, f64),
        decode_reference(v_codes, scales.v, fmt, f64),
        softmax_scale,
    )
    folded = attention_scale_folded(q, k_codes, v_codes, scales.k, scales.v, softmax_scale, fmt)
    torch.testing.assert_close(folded, dequantized, rtol=1e-12, atol=1e-12)

    # The algebra is not vacuous: a reader that skips or misplaces a scale is caught.
    unit = torch.ones(1)
    skipped_k = attention_scale_folded(q, k_codes, v_codes, unit, scales.v, softmax_scale, fmt)
    v_inside_softmax = attention_reference(
        q,
        decode_reference(k_codes, scales.k, fmt, f64),
        decode_reference(v_codes, unit, fmt, f64),
        softmax_scale,
    )
    for wrong in (skipped_k, v_inside_softmax):
        assert (wrong - dequantized).norm() > 1e-3 * dequantized.norm()


def test_round_trip_error_is_within_half_an_e5m2_step():
    """decode(encode(x / s)) · s is within 2^-3 relative of x for every normal-range value."""
    gen = torch.Generator().manual_seed(5)
    key = (torch.randn(64, 2, 64, generator=gen) * 40).half()
    scales = kv_scales(torch.tensor([0.25, 4.0]), 1.0, 2)
    k_codes, _ = cached_codes(key, key, scales)
    back = decode_reference(k_codes, scales.k, CacheFormat.FP8_E5M2)
    x = key.float()
    normal = x.abs() / scales.k.reshape(-1, 1) >= 2.0**-14
    assert normal.float().mean() > 0.99
    assert ((back - x).abs() <= x.abs() * 2.0**-3)[normal].all()


def test_e5m2_stores_exactly_half_the_bytes_of_fp16_per_token():
    for heads, hk, hv in [(8, 128, 128), (2, 512, 512), (4, 64, 32)]:
        fp16 = bytes_per_token(heads, hk, hv, CacheFormat.FLOAT16)
        assert fp16 == 2 * bytes_per_token(heads, hk, hv, CacheFormat.FP8_E5M2)
        assert fp16 == heads * (hk + hv) * 2
