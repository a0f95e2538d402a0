"""Routed (token, expert) pairs sorted into per-expert blocks for the fused MoE kernel.

vLLM routes first and hands over ``topk_ids`` ``[tokens, top_k]``. The fused kernel
(:func:`volta_ct_wna16.kernels.moe.wna16_moe_kernel`) runs one program per block of ``block_m``
rows of one expert, so the pairs (``p = token * top_k + slot``) are grouped by expert and
each expert's run padded to whole blocks. Two Triton launches do it on the device
(:func:`~volta_ct_wna16.kernels.routing.moe_count_kernel`, then
:func:`~volta_ct_wna16.kernels.routing.moe_place_kernel`), sized by the pair count alone: no count
comes back to the host, so a decode step that routes this way can be captured in a CUDA
graph and replayed with new routing. (In torch the same grouping took about 25 small
launches: in a one-token step inside a graph, more time than the two expert kernels.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from volta_ct_wna16.launch import pow2_at_least, route_place_tile
from volta_ct_wna16.limits import MAX_ROUTED_EXPERTS
from volta_ct_wna16.tables import MAX_SELECT_TOP_K, ROUTE_COUNT_BLOCK


@dataclass(frozen=True)
class Blocks:
    """Pairs grouped by expert, in blocks of ``block_m`` rows.

    ``pairs`` int32 ``[blocks * block_m]``: each block's pair indices, ``num_pairs`` where a
    block is padded. ``experts`` int32 ``[blocks]``: each block's expert, ``num_experts`` for
    the blocks past the routed pairs (the kernel returns at once there). ``blocks`` is the most
    any routing of ``num_pairs`` pairs can need (:func:`max_blocks`), not the count this one
    needs.
    """

    pairs: torch.Tensor
    experts: torch.Tensor
    num_pairs: int
    num_experts: int
    block_m: int

    @property
    def blocks(self) -> int:
        return self.experts.numel()


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """The most blocks ``num_pairs`` pairs over ``num_experts`` experts fill: each expert with
    ``c`` pairs takes ``ceil(c / block_m) <= c // block_m + 1`` blocks, at most
    ``min(num_experts, num_pairs)`` experts have any, and the ``c // block_m`` sum to at most
    ``num_pairs // block_m``."""
    return num_pairs // block_m + min(num_experts, num_pairs)


def route(
    ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    expert_map: torch.Tensor | None = None,
) -> Blocks:
    """Group the pairs of ``ids`` (each pair's expert, any shape, read flat, int32 or int64)
    by expert. ``expert_map`` (int32) maps ids to local experts (-1: another rank's, never run);
    without it the ids are local, and a negative one is another rank's.

    Within an expert the pairs stand in the order their atomic counts landed: each pair's
    output row does not depend on its place in a block. Ids at or past ``num_experts`` are
    run by no block, as another rank's: vLLM's router and expert map give none (checking
    would need the host to read them, which a captured graph cannot).
    """
    from volta_ct_wna16 import kernels

    flat = ids.reshape(-1)
    if flat.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"expert ids must be int32 or int64, got {flat.dtype}")
    if expert_map is not None and expert_map.dtype != torch.int32:
        raise TypeError(f"the expert map must be int32 (vLLM's), got {expert_map.dtype}")
    num_pairs = flat.numel()
    device = flat.device
    blocks = max_blocks(num_pairs, num_experts, block_m)
    pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=device)
    experts = torch.empty(blocks, dtype=torch.int32, device=device)
    if num_pairs == 0:
        return Blocks(pairs, experts, 0, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=device)
    rank = torch.empty(num_pairs, dtype=torch.int32, device=device)
    local = torch.empty(num_pairs, dtype=torch.int32, device=device)
    count_block = ROUTE_COUNT_BLOCK
    kernels.moe_count_kernel[(-(-num_pairs // count_block),)](
        flat,
        flat if expert_map is None else expert_map,
        counts,
        rank,
        local,
        num_pairs,
        num_experts,
        HAS_MAP=expert_map is not None,
        BLOCK=count_block,
    )
    e_pow2, place_block = route_place_tile(num_experts)
    kernels.moe_place_kernel[(-(-(blocks * block_m) // place_block),)](
        counts,
        rank,
        local,
        pairs,
        experts,
        num_pairs,
        num_experts,
        blocks,
        BLOCK_M=block_m,
        E_POW2=e_pow2,
        BLOCK=place_block,
    )
    return Blocks(pairs, experts, num_pairs, num_experts, block_m)


#: Router logits' dtypes :func:`select_experts` reads.
LOGIT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def select_experts(
    router_logits: torch.Tensor, top_k: int, *, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ``top_k`` experts from the router's logits ``[tokens, experts]``: fp32
    weights (softmax probabilities, divided by their sum with ``renormalize``) and int32 ids,
    both ``[tokens, top_k]``, in one launch
    (:func:`~volta_ct_wna16.kernels.routing.topk_softmax_kernel`), as vLLM's ``fused_topk``
    (the Qwen3 MoE router: softmax, top-k, ``norm_topk_prob``). Bad logits or ``top_k`` raise
    before the launch."""
    from volta_ct_wna16 import kernels

    if router_logits.dim() != 2 or router_logits.dtype not in LOGIT_DTYPES:
        raise ValueError(
            f"router logits must be [tokens, experts] of {', '.join(map(str, LOGIT_DTYPES))}, "
            f"got {router_logits.dtype} {tuple(router_logits.shape)}"
        )
    tokens, experts = router_logits.shape
    if not 1 <= experts <= MAX_ROUTED_EXPERTS:
        raise ValueError(f"{experts} experts: the router's top-k takes 1 to {MAX_ROUTED_EXPERTS}")
    if not 1 <= top_k <= min(experts, MAX_SELECT_TOP_K):
        raise ValueError(
            f"top_k {top_k} for {experts} experts: it must be 1 to {experts} "
            f"(and at most {MAX_SELECT_TOP_K})"
        )
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    device = router_logits.device
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=device)
    if tokens:
        kernels.topk_softmax_kernel[(tokens,)](
            router_logits,
            weights,
            ids,
            experts,
            top_k,
            router_logits.stride(0),
            int(renormalize),
            TOPK_POW2=MAX_SELECT_TOP_K,
            E_POW2=pow2_at_least(experts, 16),
        )
    return weights, ids
