"""The gated delta rule in float64, written from its formula, to check vLLM's FLA kernels.

The rule is Gated DeltaNet's (Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2
with Delta Rule", ICLR 2025, https://arxiv.org/abs/2412.06464, eq. 10), as the
flash-linear-attention kernels vLLM copies compute it
(https://github.com/fla-org/flash-linear-attention, ``fla/ops/gated_delta_rule``: state
``[V, K]`` per value head, ``fused_recurrent_gated_delta_rule_fwd_kernel``). Per value head,
with the decay ``alpha_t = exp(g_t)`` (``g`` is in log space) and the writing strength
``beta_t``::

    S_t = alpha_t * S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
        = alpha_t * S_{t-1} + beta_t (v_t - alpha_t S_{t-1} k_t) k_t^T
    o_t = S_t (scale * q_t)

with ``q`` and ``k`` first L2-normalized as ``x / sqrt(sum(x^2) + 1e-6)`` when the op applies
it (``use_qk_l2norm_in_kernel``, as vLLM's Qwen3.5 layer calls it), ``scale`` defaulting to
``K ** -0.5``, and the query/key heads shared by ``HV // H`` consecutive value heads (value
head ``h`` reads key head ``h // (HV // H)``, the kernels' ``i_h = i_hv // (HV // H)``).

:func:`recurrent` is that recurrence step by step (the reference); :func:`chunked` is the same
rule in the chunked WY form the prefill kernels use (the paper's section 3.3, FLA's
``chunk_gated_delta_rule``), written independently so that the two float64 forms check each
other. :func:`sigmoid_gating` is the decode kernel's gating (``fused_sigmoid_gating``):
``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

F64 = torch.float64

#: FLA's L2-norm epsilon (``l2norm_fwd`` and the recurrent kernels' in-kernel norm).
L2NORM_EPS = 1e-6

#: FLA's chunk length (``chunk_size=64`` throughout ``chunk.py``).
CHUNK = 64


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """FLA's L2 normalization over the last dimension."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def sigmoid_gating(
    a_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, beta)`` in float64 from the layer's gate inputs ``a, b`` ``[T, HV]`` and its
    ``A_log, dt_bias`` ``[HV]``, as ``fused_sigmoid_gating_delta_rule_update`` computes them
    (softplus linear above ``threshold``)."""
    x = a.to(F64) + dt_bias.to(F64)
    bx = softplus_beta * x
    softplus = torch.where(bx <= threshold, torch.log1p(torch.exp(bx)) / softplus_beta, x)
    return -torch.exp(a_log.to(F64)) * softplus, torch.sigmoid(b.to(F64))


@dataclass(frozen=True)
class Inputs:
    """One flattened batch as vLLM hands it to the ops: ``q, k`` ``[T, H, K]``, ``v``
    ``[T, HV, V]``, ``g, beta`` ``[T, HV]``, ``h0`` ``[N, HV, V, K]`` or None (zeros), and the
    sequence boundaries ``cu_seqlens`` (``N + 1`` offsets)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    h0: torch.Tensor | None
    cu_seqlens: list[int]
    scale: float | None = None
    qk_l2norm: bool = True


def _prepared(x: Inputs) -> tuple[torch.Tensor, ...]:
    """q, k (normalized, scaled q, expanded to the value heads), v, g, beta, h0 in float64."""
    hv, h = x.v.shape[1], x.q.shape[1]
    if hv % h:
        raise ValueError(f"value heads {hv} are not a multiple of key heads {h}")
    q, k = x.q.to(F64), x.k.to(F64)
    if x.qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    scale = x.scale if x.scale is not None else x.k.shape[-1] ** -0.5
    q = (q * scale).repeat_interleave(hv // h, dim=1)
    k = k.repeat_interleave(hv // h, dim=1)
    n = len(x.cu_seqlens) - 1
    shape = (n, hv, x.v.shape[-1], x.k.shape[-1])
    h0 = x.h0.to(F64) if x.h0 is not None else torch.zeros(shape, dtype=F64, device=x.v.device)
    if tuple(h0.shape) != shape:
        raise ValueError(f"initial state has shape {tuple(h0.shape)}, expected {shape}")
    return q, k, x.v.to(F64), x.g.to(F64), x.beta.to(F64), h0


def recurrent(x: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o [T, HV, V], final state [N, HV, V, K])``, one token at a time, in float64."""
    q, k, v, g, beta, h0 = _prepared(x)
    o = torch.empty_like(v)
    final = torch.empty_like(h0)
    for n, (bos, eos) in enumerate(zip(x.cu_seqlens[:-1], x.cu_seqlens[1:], strict=True)):
        s = h0[n].clone()
        for t in range(bos, eos):
            s = s * torch.exp(g[t])[:, None, None]
            delta = beta[t][:, None] * (v[t] - torch.einsum("hvk,hk->hv", s, k[t]))
            s = s + delta[:, :, None] * k[t][:, None, :]
            o[t] = torch.einsum("hvk,hk->hv", s, q[t])
        final[n] = s
    return o, final


def chunked(x: Inputs, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as :func:`recurrent`, ``chunk`` tokens at a time in the WY form.

    Within a chunk starting from state ``S0``, with ``G_i`` the cumulative log decay up to
    token ``i`` and ``A_ij = beta_i exp(G_i - G_j) k_i.k_j`` for ``j < i``, the pseudo-values
    ``delta = (I + A)^-1 (beta v - beta exp(G) k S0^T)`` give
    ``o_i = exp(G_i) S0 q_i + sum_{j<=i} exp(G_i - G_j) (q_i.k_j) delta_j`` and
    ``S_end = exp(G_last) S0 + sum_j exp(G_last - G_j) delta_j k_j^T``.
    """
    q, k, v, g, beta, h0 = _prepared(x)
    o = torch.empty_like(v)
    final = torch.empty_like(h0)
    for n, (bos, eos) in enumerate(zip(x.cu_seqlens[:-1], x.cu_seqlens[1:], strict=True)):
        s = h0[n].clone()  # [HV, V, K]
        for start in range(bos, eos, chunk):
            sl = slice(start, min(start + chunk, eos))
            # Heads first: [HV, C, ...].
            qc, kc, vc = (t[sl].transpose(0, 1) for t in (q, k, v))
            gc, bc = (t[sl].transpose(0, 1) for t in (g, beta))
            cum = gc.cumsum(-1)  # [HV, C]
            diff = cum[:, :, None] - cum[:, None, :]
            size = cum.shape[-1]
            strict = torch.ones(size, size, dtype=torch.bool, device=cum.device).tril(-1)
            lower = strict | torch.eye(size, dtype=torch.bool, device=cum.device)
            decay = torch.where(lower, torch.exp(torch.where(lower, diff, 0.0)), 0.0)
            a = torch.where(strict, bc[:, :, None] * decay * (kc @ kc.transpose(1, 2)), 0.0)
            eye = torch.eye(size, dtype=F64, device=cum.device)
            rhs = bc[:, :, None] * vc - (bc * torch.exp(cum))[:, :, None] * (kc @ s.transpose(1, 2))
            delta = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
            o_inter = torch.exp(cum)[:, :, None] * (qc @ s.transpose(1, 2))
            o_intra = (decay * (qc @ kc.transpose(1, 2))) @ delta
            o[sl] = (o_inter + o_intra).transpose(0, 1)
            last = cum[:, -1]
            weights = torch.exp(last[:, None] - cum)  # [HV, C]
            s = (
                torch.exp(last)[:, None, None] * s
                + (weights[:, :, None] * delta).transpose(1, 2) @ kc
            )
        final[n] = s
    return o, final


@dataclass(frozen=True)
class Error:
    """How far a kernel's tensor is from the reference: the largest absolute difference,
    that over the reference's largest magnitude, and the RMS difference over the reference's
    RMS (flash-linear-attention's ``get_err_ratio``, tests/ops/test_gated_delta.py)."""

    max_abs: float
    max_rel: float
    rms_rel: float
    finite: bool

    def within(self, rms_bound: float, max_bound: float) -> bool:
        return self.finite and self.rms_rel <= rms_bound and self.max_rel <= max_bound


def error(got: torch.Tensor, ref: torch.Tensor) -> Error:
    """The :class:`Error` of ``got`` against the float64 ``ref`` (same shape)."""
    if tuple(got.shape) != tuple(ref.shape):
        raise ValueError(
            f"shape {tuple(got.shape)} differs from the reference's {tuple(ref.shape)}"
        )
    x, r = got.to(F64), ref.to(F64)
    finite = bool(torch.isfinite(x).all())
    diff = (x - r).abs()
    ref_max = float(r.abs().max()) or 1.0
    ref_rms = float(r.square().mean().sqrt()) or 1.0
    return Error(
        max_abs=float(diff.max()),
        max_rel=float(diff.max()) / ref_max,
        rms_rel=float(diff.square().mean().sqrt()) / ref_rms,
        finite=finite,
    )
