"""Routed pairs grouped into per-expert blocks (:mod:`volta_ct_wna16.routing`, two Triton
launches), checked pair by pair against the ids they came from, on random routings with idle
experts, experts holding several blocks, another rank's pairs and an expert map; under the
interpreter on CPU and on the GPU."""

from __future__ import annotations

import pytest
import torch

from volta_ct_wna16.launch import route_place_tile
from volta_ct_wna16.routing import max_blocks, route
from volta_devkit.testing import poison_


def _check(ids: torch.Tensor, experts: int, block_m: int, local: torch.Tensor) -> None:
    """``local``: each pair's local expert (negative: none), what the routing must follow."""
    blocks = route(ids, experts, block_m)
    _check_blocks(blocks, local, experts, block_m)


def _check_blocks(blocks, local: torch.Tensor, experts: int, block_m: int) -> None:
    n = local.numel()
    local = local.cpu()
    assert blocks.blocks == max_blocks(n, experts, block_m)
    assert blocks.pairs.dtype == blocks.experts.dtype == torch.int32
    pairs = blocks.pairs.cpu().view(blocks.blocks, block_m)
    block_experts = blocks.experts.cpu()
    seen: list[int] = []
    order: list[int] = []
    used = 0
    for b in range(blocks.blocks):
        e = int(block_experts[b])
        rows = [int(p) for p in pairs[b] if int(p) != n]
        if e == experts:  # past the routed pairs: nothing in it
            assert not rows
            continue
        assert 0 <= e < experts
        assert used == b, "blocks past the routed ones sit between routed blocks"
        used = b + 1
        assert rows, f"block {b} of expert {e} is empty"
        assert all(0 <= p < n and int(local[p]) == e for p in rows), (b, e, rows)
        # Padding only at the end of a block.
        assert [int(p) for p in pairs[b][: len(rows)]] == rows
        seen += rows
        order.append(e)
    # Every local pair exactly once; an expert's blocks contiguous and in expert order.
    assert sorted(seen) == [p for p in range(n) if int(local[p]) >= 0]
    assert order == sorted(order)
    counts = torch.bincount(local[local >= 0].long(), minlength=experts)
    assert used == int(((counts + block_m - 1) // block_m).sum())


@pytest.mark.parametrize("block_m", [1, 4, 16, 64])
@pytest.mark.parametrize("seed", range(6))
def test_every_pair_lands_once_in_a_block_of_its_expert(block_m: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    experts = int(torch.randint(1, 40, (1,), generator=gen))
    n = int(torch.randint(1, 700, (1,), generator=gen))  # up to 3 counting programs
    ids = torch.randint(-1, experts, (n,), generator=gen)  # -1: another rank's expert
    _check(ids, experts, block_m, ids)
    _check(ids.to(torch.int32), experts, block_m, ids)


def test_many_experts_take_the_narrow_place_tile() -> None:
    """300 experts: counts padded to 512, 16 pairs a program, several programs."""
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 300, (64, 8), generator=gen)
    assert route_place_tile(300) == (512, 16)
    _check(ids, 300, 16, ids.reshape(-1))


def test_the_expert_map_picks_this_ranks_pairs() -> None:
    gen = torch.Generator().manual_seed(3)
    expert_map = torch.full((24,), -1, dtype=torch.int32)
    expert_map[6:14] = torch.randperm(8, generator=gen).to(torch.int32)
    ids = torch.randint(0, 24, (37, 4), generator=gen, dtype=torch.int32)
    blocks = route(ids, 8, 4, expert_map)
    _check_blocks(blocks, expert_map[ids.reshape(-1).long()], 8, 4)


def test_the_block_count_bound_is_reached() -> None:
    """Every expert one pair past a whole block: the most blocks any routing needs."""
    ids = torch.arange(3).repeat_interleave(5)  # 3 experts x 5 pairs, blocks of 4
    blocks = route(ids, 3, 4)
    assert blocks.blocks == max_blocks(15, 3, 4) == 6
    assert int((blocks.experts < 3).sum()) == 6
    _check(ids, 3, 4, ids)


def test_no_pairs_and_only_other_ranks_pairs() -> None:
    empty = route(torch.zeros(0, dtype=torch.long), 4, 16)
    assert empty.blocks == 0
    assert empty.pairs.numel() == 0
    foreign = route(torch.full((5,), -1), 4, 16)
    assert bool((foreign.experts == 4).all())
    assert bool((foreign.pairs == 5).all())


def test_route_refuses_what_its_kernels_do_not_take() -> None:
    with pytest.raises(TypeError, match=r"expert ids must be int32 or int64, got torch\.float32"):
        route(torch.zeros(4), 4, 16)
    with pytest.raises(TypeError, match="the expert map must be int32"):
        route(torch.zeros(4, dtype=torch.long), 4, 16, torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match="1025 local experts: the fused routing takes 1 to 1024"):
        route(torch.zeros(4, dtype=torch.long), 1025, 16)


@pytest.mark.gpu
def test_gpu_routing_over_poisoned_tables() -> None:
    """Decode- and prefill-sized routings on the device, each over memory the caching
    allocator hands back poisoned (tensors of the tables' sizes, filled and freed just before),
    so a slot left neither a pair nor padding, or a block left with no expert, shows."""
    gen = torch.Generator().manual_seed(5)
    for tokens, experts, block_m in ((1, 128, 16), (16, 256, 16), (1024, 128, 64), (300, 512, 64)):
        ids = torch.randint(0, experts, (tokens, 8), generator=gen, dtype=torch.int32)
        count = max_blocks(ids.numel(), experts, block_m)
        for size in (count * block_m, count):
            poison_(torch.empty(size, dtype=torch.int32, device="cuda"))
        blocks = route(ids.cuda(), experts, block_m)
        _check_blocks(blocks, ids.reshape(-1), experts, block_m)
