"""The checking helpers catch what they promise to: poison, NaN, and wrong values."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from volta_devkit.testing import (  # noqa: E402
    POISON_BYTE,
    assert_rel_close,
    poison_,
    rel_error,
)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_poison_fills_floats_with_nan(dtype: torch.dtype) -> None:
    t = torch.zeros(4, 6, dtype=dtype)
    assert poison_(t) is t
    assert bool(t.isnan().all())


@pytest.mark.parametrize("dtype", [torch.float8_e5m2, torch.float8_e4m3fn])
def test_poison_fills_fp8_with_nan_bytes(dtype: torch.dtype) -> None:
    t = poison_(torch.zeros(8, dtype=dtype))
    assert bool(t.float().isnan().all())
    assert bool((t.view(torch.uint8) == 0xFF).all())


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64])
def test_poison_fills_every_byte_of_integers(dtype: torch.dtype) -> None:
    t = torch.zeros(3, 8, dtype=dtype)[:, ::2]  # a strided view too
    poison_(t)
    assert bool((t.contiguous().view(torch.uint8) == POISON_BYTE).all())


def test_rel_error_is_the_float64_norm_ratio() -> None:
    ref = torch.tensor([3.0, 4.0])
    assert rel_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.5 / 5.0, rel=1e-12)
    assert rel_error(ref.half(), ref) == 0.0
    assert rel_error(torch.tensor([3.0, math.nan]), ref) == math.inf
    assert rel_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert rel_error(torch.ones(2), torch.zeros(2)) == math.inf
    with pytest.raises(ValueError, match="shape"):
        rel_error(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="reference has NaN"):
        rel_error(torch.zeros(2), torch.tensor([math.inf, 1.0]))


def test_assert_rel_close_names_the_worst_element() -> None:
    ref = torch.ones(3, 4)
    out = ref.clone()
    out[2, 1] = 1.5
    out[0, 0] = 1.01
    with pytest.raises(AssertionError, match=r"^gemm: relative error .* index \(2, 1\): got 1\.5"):
        assert_rel_close(out, ref, 1e-3, "gemm")
    assert_rel_close(out, ref, 0.2, "gemm")


def test_assert_rel_close_fails_on_any_poisoned_element_even_within_tolerance() -> None:
    ref = torch.ones(1000)
    out = ref.clone()
    poison_(out[500:501])
    with pytest.raises(AssertionError, match=r"1 of 1000 elements are NaN.*index \(500,\)"):
        assert_rel_close(out, ref, 1.0, "kv write")


def test_assert_rel_close_checks_shapes() -> None:
    with pytest.raises(AssertionError, match=r"out: output shape \(2, 2\) != reference"):
        assert_rel_close(torch.ones(2, 2), torch.ones(4), 1.0, "out")
