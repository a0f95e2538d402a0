"""Routed (token, expert) pairs sorted into per-expert blocks for the fused MoE kernel.

vLLM routes first and hands over ``topk_ids`` ``[tokens, top_k]``. The fused kernel
(:func:`volta_ct_wna16.kernels.wna16_moe_kernel`) runs one program per block of ``block_m``
rows of one expert, so the pairs (``p = token * top_k + slot``) are grouped by expert and
each expert's run padded to whole blocks. Everything here is fixed-size torch arithmetic on
the device: no count comes back to the host, so a decode step that routes this way can be
captured in a CUDA graph and replayed with new routing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def route(ids: torch.Tensor, num_experts: int, block_m: int) -> Blocks:
    """Group the pairs of ``ids`` (local expert per pair, flattened ``[pairs]``; negative: an
    expert of another rank, never run) by expert, in the pairs' own order within an expert."""
    num_pairs = ids.numel()
    device = ids.device
    blocks = max_blocks(num_pairs, num_experts, block_m)
    bucket = torch.where(ids < 0, num_experts, ids.long())  # other ranks' pairs sort last
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))
    per_expert = (counts[:num_experts] + block_m - 1) // block_m
    block_end = torch.cumsum(per_expert, 0)
    # Where each expert's first block and first pair lie; the other ranks' bucket starts past
    # the last block, so its pairs land in a tail that is cut off below.
    block_start = torch.cat([block_end - per_expert, block_end.new_full((1,), blocks)])
    pair_start = torch.cumsum(counts, 0) - counts
    order = torch.sort(bucket, stable=True).indices
    sorted_bucket = bucket[order]
    rank = torch.arange(num_pairs, device=device) - pair_start[sorted_bucket]
    slot = block_start[sorted_bucket] * block_m + rank
    pairs = torch.full((blocks * block_m + num_pairs,), num_pairs, dtype=torch.int32, device=device)
    pairs.scatter_(0, slot, order.to(torch.int32))
    block = torch.arange(blocks, device=device)
    experts = torch.searchsorted(block_end, block, right=True).to(torch.int32)
    return Blocks(pairs[: blocks * block_m], experts, num_pairs, num_experts, block_m)
