"""The experts' arithmetic, without vLLM: ``sum_k w_k * down(SiLU(gate(x)) * up(x))``.

Each expert is two linear layers in the plugin's layout (``gate`` and ``up`` stacked as one
``[2 * inter, hidden]`` weight, ``down`` ``[hidden, inter]``) run by the same op the dense layers
use (:func:`volta_ct_wna16.ops.linear_op`: the Triton kernels on CUDA or under the interpreter,
dequantize-and-``F.linear`` on CPU). :mod:`volta_ct_wna16.moe` wraps this for vLLM; kept apart
so the GPU tests run it on a machine without vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch

from volta_ct_wna16 import ops
from volta_ct_wna16.layout import PackedWeights


@dataclass
class ExpertWeights:
    """Every local expert's gate/up (``w13``) and down (``w2``) weights in the kernels' layout.

    ``*_qweight`` int32 ``[experts, words, out]``, ``*_scales`` ``[experts, groups, out]``,
    ``*_zeros`` uint8 ``[experts, groups, out]`` or None (symmetric): one slice per expert is one
    layer's :class:`~volta_ct_wna16.layout.PackedWeights`.
    """

    w13_qweight: torch.Tensor
    w13_scales: torch.Tensor
    w13_zeros: torch.Tensor | None
    w2_qweight: torch.Tensor
    w2_scales: torch.Tensor
    w2_zeros: torch.Tensor | None
    hidden: int
    inter: int
    bits: int
    w13_group: int
    w2_group: int

    @classmethod
    def stack(cls, w13: Sequence[PackedWeights], w2: Sequence[PackedWeights]) -> ExpertWeights:
        """Each expert's gate/up and down :class:`PackedWeights` (from ``layout.prepare``) as one
        tensor per kind, the expert first."""

        def zeros(parts: Sequence[PackedWeights]) -> torch.Tensor | None:
            if parts[0].zeros is None:
                return None
            return torch.stack([cast(torch.Tensor, pw.zeros) for pw in parts])

        return cls(
            w13_qweight=torch.stack([pw.qweight for pw in w13]),
            w13_scales=torch.stack([pw.scales for pw in w13]),
            w13_zeros=zeros(w13),
            w2_qweight=torch.stack([pw.qweight for pw in w2]),
            w2_scales=torch.stack([pw.scales for pw in w2]),
            w2_zeros=zeros(w2),
            hidden=w13[0].k,
            inter=w2[0].k,
            bits=w13[0].bits,
            w13_group=w13[0].group,
            w2_group=w2[0].group,
        )

    @property
    def num_experts(self) -> int:
        return self.w13_qweight.shape[0]

    def gate_up(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """``x @ [gate; up]_e.T``: ``[tokens, 2 * inter]``."""
        zeros = self.w13_zeros[e] if self.w13_zeros is not None else None
        return ops.linear_op(
            x,
            self.w13_qweight[e],
            self.w13_scales[e],
            zeros,
            None,
            self.hidden,
            self.bits,
            self.w13_group,
        )

    def down(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """``x @ down_e.T``: ``[tokens, hidden]``."""
        zeros = self.w2_zeros[e] if self.w2_zeros is not None else None
        return ops.linear_op(
            x,
            self.w2_qweight[e],
            self.w2_scales[e],
            zeros,
            None,
            self.inter,
            self.bits,
            self.w2_group,
        )

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """``down(SiLU(gate(x)) * up(x))`` for one expert, in the activation dtype."""
        h = self.gate_up(e, x).float()
        act = torch.nn.functional.silu(h[:, : self.inter]) * h[:, self.inter :]
        return self.down(e, act.to(x.dtype))


def experts_forward(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: ExpertWeights,
    *,
    expert_map: torch.Tensor | None = None,
    weight_on_input: bool = False,
    every_expert: bool = False,
) -> torch.Tensor:
    """``sum_k w_k * expert_{id_k}(x)`` per token, accumulated in fp32, returned in ``x.dtype``.

    ``topk_ids`` are global expert ids; ``expert_map`` (expert parallelism) maps them to this
    rank's experts, -1 for another rank's. ``weight_on_input`` scales each token's input by its
    router weight instead of the output (vLLM's ``apply_router_weight_on_input``).

    By default each expert runs only the tokens routed to it, which needs the per-expert counts
    on the host (one synchronization). ``every_expert`` runs every local expert on every token
    and masks the unrouted ones out: no synchronization and no data-dependent shapes, so it can
    be captured in a CUDA graph (vLLM captures decode steps), at ``experts / top_k`` times the
    work.
    """
    m, top_k = topk_ids.shape
    experts = weights.num_experts
    out = torch.zeros((m, weights.hidden), dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    if expert_map is not None:
        ids = expert_map[ids].long()
    if every_expert:
        for e in range(experts):
            hit = ids == e
            w = torch.where(hit, topk_weights.float(), 0.0).sum(-1, keepdim=True)
            routed = hit.any(-1, keepdim=True)
            xe = (x.float() * w).to(x.dtype) if weight_on_input else x
            y = weights.expert(e, xe).float()
            out += torch.where(routed, y if weight_on_input else y * w, 0.0)
        return out.to(x.dtype)
    flat = ids.reshape(-1)
    flat = torch.where(flat < 0, experts, flat)  # another rank's experts: a bucket never run
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts + 1)[:experts].tolist()
    flat_weights = topk_weights.reshape(-1).float()
    start = 0
    for e, count in enumerate(counts):
        if not count:
            continue
        pairs = order[start : start + count]
        start += count
        tokens = pairs // top_k
        w = flat_weights[pairs].unsqueeze(-1)
        xe = x[tokens]
        if weight_on_input:
            xe = (xe.float() * w).to(x.dtype)
        y = weights.expert(e, xe).float()
        out.index_add_(0, tokens, y if weight_on_input else y * w)
    return out.to(x.dtype)
