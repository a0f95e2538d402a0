"""Accuracy evidence on CPU: attention over an e5m2 cache versus over an fp16 cache.

Small shapes (the interpreter); the GPU measurement at full size is in the benchmark suite and
the README. Bounds are a few times the measured values, so a broken rounding or a misapplied
scale (which costs far more) fails.
"""

from __future__ import annotations

import torch

from volta_fp8kv.accuracy import calibrated_scales, error_table, realistic_activations
from volta_fp8kv.format import CacheFormat


def test_e5m2_attention_error_with_unit_and_per_head_scales():
    acts = realistic_activations(256, 2, 64, seed=11)
    table = error_table(acts, (CacheFormat.FP8_E5M2, CacheFormat.FP8_E4M3))
    print(table)
    e5_unit, e5_head = table["fp8_e5m2/unit"], table["fp8_e5m2/per_head_e4m3_calibrated"]
    e4_head = table["fp8_e4m3/per_head_e4m3_calibrated"]
    assert 0 < e5_unit < 0.25
    assert 0 < e5_head < 0.25
    # One more mantissa bit halves the error: e4m3 with calibrated scales is the yardstick.
    assert e4_head < e5_head


def test_without_outlier_channels_e5m2_error_is_small():
    acts = realistic_activations(256, 2, 64, seed=12, outlier_gain=1.0)
    table = error_table(acts, (CacheFormat.FP8_E5M2,))
    print(table)
    assert table["fp8_e5m2/unit"] < 0.15


def test_a_misapplied_scale_is_caught_by_the_error_measure():
    """Scales written but not applied on read would be far outside the bounds above."""
    acts = realistic_activations(64, 2, 64, seed=13)
    scales = calibrated_scales(acts, 448.0)
    from volta_fp8kv.accuracy import _roundtrip

    k, v = _roundtrip(acts, CacheFormat.FP8_E5M2, scales, 16)
    k_unscaled = k / scales.k.reshape(-1, 1)
    assert (k_unscaled - acts.k.float()).norm() > 10 * (k - acts.k.float()).norm()
    assert torch.isfinite(v).all()
