"""The fused-MoE routing's two launches: (token, slot) pairs sorted by expert into blocks of
``BLOCK_M`` rows (:func:`volta_ct_wna16.routing.route`), with no count read back to the host.

Their result has the layout of vLLM's ``moe_align_block_size``
(``vllm/model_executor/layers/fused_moe/moe_align_block_size.py``): each expert's pairs padded
to whole blocks with the pair count, and one expert per block.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: The routing's integer arguments Triton's JIT does not specialize (it would otherwise build
#: another kernel for an argument's value of 1 and for multiples of 16,
#: ``triton/runtime/jit.py``; it matches them by name, so each kernel takes those it has), so
#: that one build serves every batch and model, as the gate and warmup declare it: the pair and
#: block counts only bound the pairs and slots, and the expert count is compared with each
#: pair's expert.
ROUTING_UNSPECIALIZED = ("PAIRS", "EXPERTS", "BLOCKS")


@triton.jit(do_not_specialize=ROUTING_UNSPECIALIZED)
def moe_count_kernel(
    ids_ptr,
    map_ptr,
    count_ptr,
    rank_ptr,
    local_ptr,
    PAIRS,
    EXPERTS,
    HAS_MAP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``local[p] = e``, ``rank[p] = count[e]`` before pair ``p``'s add, ``count[e] += 1``, for
    ``e`` pair ``p``'s local expert: the first of the two routing launches.

    ``ids_ptr`` holds each pair's expert (int32 or int64), mapped through ``map_ptr`` when
    ``HAS_MAP`` (expert parallelism: -1 for another rank's expert). The rank is the expert's
    count before the pair's atomic add on ``count_ptr`` (zeroed by the launcher): unique within
    the expert, in whatever order the adds land, which is all the second launch needs and
    costs no sort. ``local_ptr`` gets the expert, ``EXPERTS`` for a pair no local expert runs.
    """
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = p < PAIRS
    e = tl.load(ids_ptr + p, mask=ok, other=-1).to(tl.int32)
    if HAS_MAP:
        e = tl.load(map_ptr + e, mask=ok & (e >= 0), other=-1).to(tl.int32)
    local = ok & (e >= 0) & (e < EXPERTS)
    ones = tl.full([BLOCK], 1, tl.int32)
    rank = tl.atomic_add(count_ptr + e, ones, mask=local, sem="relaxed")
    tl.store(rank_ptr + p, rank, mask=local)
    tl.store(local_ptr + p, tl.where(local, e, EXPERTS), mask=ok)


@triton.jit(do_not_specialize=ROUTING_UNSPECIALIZED)
def moe_place_kernel(
    count_ptr,
    rank_ptr,
    local_ptr,
    pair_ptr,
    expert_ptr,
    PAIRS,
    EXPERTS,
    BLOCKS,
    BLOCK_M: tl.constexpr,
    E_POW2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``pair[start[e] * BLOCK_M + rank[p]] = p`` for every pair ``p`` of local expert ``e``,
    ``start[e] = sum(ceil(count[e'] / BLOCK_M) for e' < e)``; ``pair[i] = PAIRS`` for every
    other slot and ``expert[b] = e`` for the blocks ``start[e] <= b < start[e + 1]``
    (``EXPERTS`` past the last): the second routing launch.

    Every program reads all ``EXPERTS`` counts and takes each expert's first block from their
    running sum of whole blocks, so no launch in between adds them up. Program ``i`` covers
    ``BLOCK`` pairs and the same ``BLOCK`` slots of ``pair_ptr`` (``BLOCKS * BLOCK_M`` of them,
    never fewer than the pairs): it writes each of its pairs at ``first block * BLOCK_M +
    rank``, each of its slots that no rank reaches with ``PAIRS`` (the kernel's padding), and
    the expert of each block that starts in its slots (``EXPERTS`` past the routed ones). A slot
    is either a pair's or padding, never both, so the two kinds of store need no ordering.
    """
    ex = tl.arange(0, E_POW2)
    ex_ok = ex < EXPERTS
    counts = tl.load(count_ptr + ex, mask=ex_ok, other=0)
    per_expert = (counts + BLOCK_M - 1) // BLOCK_M
    end = tl.cumsum(per_expert, 0)
    start = end - per_expert
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e = tl.load(local_ptr + i, mask=i < PAIRS, other=EXPERTS)
    placed = e < EXPERTS
    rank = tl.load(rank_ptr + i, mask=placed, other=0)
    first = tl.sum(tl.where(e[:, None] == ex[None, :], start[None, :], 0), axis=1)
    tl.store(pair_ptr + first * BLOCK_M + rank, i, mask=placed)
    b = i // BLOCK_M
    r = i % BLOCK_M
    slot_ok = b < BLOCKS
    owner = tl.sum(((end[None, :] <= b[:, None]) & ex_ok[None, :]).to(tl.int32), axis=1)
    hit = owner[:, None] == ex[None, :]
    owner_start = tl.sum(tl.where(hit, start[None, :], 0), axis=1)
    owner_count = tl.sum(tl.where(hit, counts[None, :], 0), axis=1)
    padding = (b - owner_start) * BLOCK_M + r >= owner_count
    tl.store(pair_ptr + i, tl.full([BLOCK], 0, tl.int32) + PAIRS, mask=slot_ok & padding)
    tl.store(expert_ptr + b, owner, mask=slot_ok & (r == 0))


@triton.jit
def topk_softmax(
    row_ptr, EXPERTS, TOP_K, RENORMALIZE, TOPK_POW2: tl.constexpr, E_POW2: tl.constexpr
):
    """``(weights, ids)``, each ``[TOPK_POW2]``: the ``TOP_K`` experts (at most ``TOPK_POW2``)
    of one token's logits at ``row_ptr`` by descending ``softmax(logits)`` (ties to the lower
    id), and their probabilities (fp32), divided by their sum where ``RENORMALIZE`` is not 0;
    slots from ``TOP_K`` on hold 0. vLLM's ``fused_topk`` (``topk_softmax``, then
    ``renormalize``) for one token, the logits held in registers.

    Each round takes one maximum of a 64-bit key, the probability's bits (a non-negative fp32
    orders as its bits do) above the id's complement, so the probability and the lowest id
    holding it come out of one reduction instead of two.
    """
    ex = tl.arange(0, E_POW2)
    ok = ex < EXPERTS
    logits = tl.load(row_ptr + ex, mask=ok, other=-float("inf")).to(tl.float32)
    prob = tl.exp(logits - tl.max(logits, axis=0))
    prob = prob / tl.sum(prob, axis=0)
    bits = prob.to(tl.int32, bitcast=True).to(tl.int64)
    # The padding (and every taken expert) keys below any probability's.
    key = tl.where(ok, (bits << 32) | (E_POW2 - 1 - ex).to(tl.int64), -1)
    slots = tl.arange(0, TOPK_POW2)
    weights = tl.zeros([TOPK_POW2], dtype=tl.float32)
    ids = tl.zeros([TOPK_POW2], dtype=tl.int32)
    for j in range(0, TOP_K):
        best = tl.max(key, axis=0)
        pick = (E_POW2 - 1 - (best & 0xFFFFFFFF)).to(tl.int32)
        best_prob = (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        weights = tl.where(slots == j, best_prob, weights)
        ids = tl.where(slots == j, pick, ids)
        key = tl.where(ex == pick, -1, key)
    if RENORMALIZE != 0:
        weights = weights / tl.sum(weights, axis=0)
    return weights, ids


# Not specialized, so that one build serves every model, as the gate and warmup declare it
# (Triton's JIT would otherwise build another kernel for an argument's value of 1 and for
# multiples of 16, ``triton/runtime/jit.py``): the expert count masks the logits, whose row
# stride it is, and the launcher's ``RENORMALIZE`` is 0 or 1, never the plain integer the build
# declares; the top-k bounds the selection loop, and as the constant 1 would only unroll it.
@triton.jit(do_not_specialize=["EXPERTS", "TOP_K", "stride_l", "RENORMALIZE"])
def topk_softmax_kernel(
    logits_ptr,
    w_ptr,
    ids_ptr,
    EXPERTS,
    TOP_K,
    stride_l,
    RENORMALIZE,
    TOPK_POW2: tl.constexpr,
    E_POW2: tl.constexpr,
):
    """``ids[t]``, ``w[t]``: token ``t``'s top-k of :func:`topk_softmax`, one program per
    token."""
    t = tl.program_id(0).to(tl.int64)
    weights, ids = topk_softmax(
        logits_ptr + t * stride_l, EXPERTS, TOP_K, RENORMALIZE, TOPK_POW2, E_POW2
    )
    slots = tl.arange(0, TOPK_POW2)
    taken = slots < TOP_K
    tl.store(w_ptr + t * TOP_K + slots, weights, mask=taken)
    tl.store(ids_ptr + t * TOP_K + slots, ids, mask=taken)
