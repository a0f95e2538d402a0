"""The float64 gated delta rule that gpu_fla.py checks vLLM's FLA kernels against.

Its step-by-step form agrees with the chunked WY form written independently, with a token
worked by hand, and its gating with the formula; its error measure catches one wrong value.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import gdn_reference as ref


def _inputs(lengths: list[int], h: int, hv: int, dk: int, dv: int, h0: bool) -> ref.Inputs:
    gen = torch.Generator().manual_seed(7)
    t = sum(lengths)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return ref.Inputs(
        q=torch.randn(t, h, dk, generator=gen, dtype=ref.F64),
        k=torch.randn(t, h, dk, generator=gen, dtype=ref.F64),
        v=torch.randn(t, hv, dv, generator=gen, dtype=ref.F64),
        # decays from nearly 1 to about exp(-3): long and short memories
        g=-3 * torch.rand(t, hv, generator=gen, dtype=ref.F64) ** 4,
        beta=torch.rand(t, hv, generator=gen, dtype=ref.F64),
        h0=torch.randn(len(lengths), hv, dv, dk, generator=gen, dtype=ref.F64) if h0 else None,
        cu_seqlens=cu,
    )


@pytest.mark.parametrize(
    ("lengths", "h0"),
    [([100], True), ([37, 40, 23], True), ([40], False)],
    ids=["one sequence", "three sequences", "no initial state"],
)
def test_recurrent_and_chunked_forms_agree(lengths: list[int], h0: bool) -> None:
    """Token by token and 16-token chunks (sequences ending mid-chunk), 2 key heads shared by
    4 value heads: the same outputs and final states to float64 rounding."""
    x = _inputs(lengths, h=2, hv=4, dk=16, dv=8, h0=h0)
    o, s = ref.recurrent(x)
    o_chunked, s_chunked = ref.chunked(x, chunk=16)
    assert torch.allclose(o, o_chunked, rtol=0, atol=1e-12)
    assert torch.allclose(s, s_chunked, rtol=0, atol=1e-12)
    assert o.abs().max() > 0.1


def test_one_token_by_hand() -> None:
    """S1 = a S0 + b (v - a S0 k) k^T and o = S1 q / sqrt(K) after FLA's l2norm of q and k
    (one head, K 4, V 2)."""
    k = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]], dtype=ref.F64)
    q = torch.tensor([[[0.0, 2.0, 0.0, 0.0]]], dtype=ref.F64)
    v = torch.tensor([[[3.0, -1.0]]], dtype=ref.F64)
    s0 = torch.tensor([[[[1.0, 2.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]]], dtype=ref.F64)
    a, b = 0.5, 0.25
    x = ref.Inputs(
        q, k, v, torch.full((1, 1), math.log(a), dtype=ref.F64),
        torch.full((1, 1), b, dtype=ref.F64), s0, [0, 1],
    )  # fmt: skip
    o, s = ref.recurrent(x)
    k_norm = 1 / math.sqrt(1 + ref.L2NORM_EPS)  # k = k_norm e_1 after l2norm
    q_norm = 2 / math.sqrt(4 + ref.L2NORM_EPS)  # q = q_norm e_2
    # S0 k = k_norm (1, 0), so delta = b (v - a k_norm (1, 0))
    delta = b * torch.tensor([3.0 - a * k_norm, -1.0], dtype=ref.F64)
    expected_s = a * s0[0, 0] + torch.outer(delta, k_norm * k[0, 0])
    assert torch.allclose(s[0, 0], expected_s, rtol=0, atol=1e-15)
    # o = S1 q / sqrt(4); S1's second column is a S0's: (1.0, 0.5)
    expected_o = torch.tensor([1.0, 0.5], dtype=ref.F64) * q_norm / 2
    assert torch.allclose(o[0, 0], expected_o, rtol=0, atol=1e-15)


def test_sigmoid_gating_is_the_formula() -> None:
    """g = -exp(A_log) softplus(a + dt_bias), linear above the threshold; beta = sigmoid(b)."""
    a = torch.tensor([[-1.0, 0.0, 30.0]], dtype=ref.F64)
    b = torch.tensor([[0.0, 2.0, -2.0]], dtype=ref.F64)
    a_log = torch.log(torch.tensor([1.0, 2.0, 4.0], dtype=ref.F64))
    dt_bias = torch.tensor([0.5, -0.5, 0.0], dtype=ref.F64)
    g, beta = ref.sigmoid_gating(a_log, a, b, dt_bias)
    expected = [-math.log1p(math.exp(-0.5)), -2 * math.log1p(math.exp(-0.5)), -4 * 30.0]
    assert g[0].tolist() == pytest.approx(expected, rel=1e-12)
    assert beta[0].tolist() == pytest.approx([0.5, 1 / (1 + math.exp(-2)), 1 / (1 + math.exp(2))])


def test_error_catches_one_wrong_value() -> None:
    """fp16 rounding everywhere is within the bounds; one value off by its size is not,
    though the RMS alone would hide it."""
    r = torch.randn(4096, 64, generator=torch.Generator().manual_seed(1), dtype=ref.F64)
    rounded = r.half()
    assert ref.error(rounded, r).within(2e-3, 1e-2)
    wrong = rounded.clone()
    wrong[7, 3] = -wrong[7, 3]
    err = ref.error(wrong, r)
    assert err.rms_rel < 5e-3
    assert not err.within(5e-3, 5e-2)
    assert not ref.error(torch.full_like(r, float("nan")), r).within(1.0, 1.0)
