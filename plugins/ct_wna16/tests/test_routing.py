"""Routed pairs grouped into per-expert blocks (:mod:`volta_ct_wna16.routing`), checked pair by
pair against the ids they came from, on random routings with idle experts, experts holding
several blocks and another rank's pairs."""

from __future__ import annotations

import pytest
import torch

from volta_ct_wna16.routing import max_blocks, route


def _check(ids: torch.Tensor, experts: int, block_m: int) -> None:
    blocks = route(ids, experts, block_m)
    pairs = blocks.pairs.view(blocks.blocks, block_m)
    n = ids.numel()
    assert blocks.blocks == max_blocks(n, experts, block_m)
    assert blocks.pairs.dtype == blocks.experts.dtype == torch.int32
    seen: list[int] = []
    used = 0
    for b in range(blocks.blocks):
        e = int(blocks.experts[b])
        rows = [int(p) for p in pairs[b] if int(p) != n]
        if e == experts:  # past the routed pairs: nothing in it
            assert not rows
            continue
        used = b + 1
        assert rows, f"block {b} of expert {e} is empty"
        assert all(int(ids[p]) == e for p in rows)
        # Padding only at the end of a block.
        assert [int(p) for p in pairs[b][: len(rows)]] == rows
        seen += rows
    # Blocks of one expert are contiguous and in expert order, pairs in their own order.
    local = [p for p in range(n) if int(ids[p]) >= 0]
    assert seen == sorted(local, key=lambda p: (int(ids[p]), p))
    counts = torch.bincount(ids[ids >= 0], minlength=experts)
    assert used == int(((counts + block_m - 1) // block_m).sum())


@pytest.mark.parametrize("block_m", [1, 4, 16])
@pytest.mark.parametrize("seed", range(6))
def test_every_pair_lands_once_in_a_block_of_its_expert(block_m: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    experts = int(torch.randint(1, 12, (1,), generator=gen))
    n = int(torch.randint(1, 90, (1,), generator=gen))
    ids = torch.randint(-1, experts, (n,), generator=gen)  # -1: another rank's expert
    _check(ids, experts, block_m)


def test_the_block_count_bound_is_reached() -> None:
    """Every expert one pair past a whole block: the most blocks any routing needs."""
    ids = torch.arange(3).repeat_interleave(5)  # 3 experts x 5 pairs, blocks of 4
    blocks = route(ids, 3, 4)
    assert blocks.blocks == max_blocks(15, 3, 4) == 6
    assert int((blocks.experts < 3).sum()) == 6
    _check(ids, 3, 4)


def test_no_pairs_and_only_other_ranks_pairs() -> None:
    empty = route(torch.zeros(0, dtype=torch.long), 4, 16)
    assert empty.blocks == 0
    assert empty.pairs.numel() == 0
    foreign = route(torch.full((5,), -1), 4, 16)
    assert bool((foreign.experts == 4).all())
    assert bool((foreign.pairs == 5).all())
