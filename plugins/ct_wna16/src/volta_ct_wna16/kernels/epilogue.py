"""Output tiles' epilogues: the store (bias, cast) and the two ways split-K sums its splits in
the launch that computed them, a two-level tree (:func:`reduce_splits`, this plugin's own) or
atomic fp32 adds (:func:`accumulate_splits`, with :func:`take_sums` and :func:`store_out` the
host's: :mod:`volta_core.kernel_api`, which fp8w's split-K shares).

Both count arrivals as CUTLASS's serial split-K does (``SplitKSerial`` in
``cutlass/gemm/kernel/gemm.h``): a barrier puts every thread's writes before one release-acquire
increment at GPU scope, and the program that reads the count before last is the last to
arrive. The counters and accumulators come zeroed from the host
(:func:`volta_core.kernel_api.arrival_counters`, :func:`~volta_core.kernel_api.zeroed_accumulators`)
and the last arrivers put them back to zero, so the next launch (a CUDA graph replay included)
needs no memset.

The atomic adds are done by L2 while the other splits still run, so the tile's last arriver
reads one sum in one round trip where the tree reads several: that tail is most of a split that
runs only a few input steps (a layer with few output tiles and a short input). The last arriver
reads the sums by atomically adding zero, not by loads: loads past L1 (``.cg``, as the tree
reads its partials) returned sums missing some splits' adds on the H100, read by atomics they
were right (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run15). The order of the adds is the order
the splits reach L2, so the fp32 sum (and, rarely, the fp16 output's last bit) can differ
between launches; the tree's sums run in a fixed order.
"""

from __future__ import annotations

import triton
import triton.language as tl

from volta_core.kernel_api import accumulate_splits, store_out, take_sums

__all__ = ["accumulate_splits", "reduce_splits", "store_out", "take_sums"]


@triton.jit
def reduce_splits(
    res,
    ws_ptr,
    cnt_ptr,
    b_ptr,
    out_ptr,
    rm,
    rn,
    n_ok,
    tile_ok,
    M,
    N,
    stride_om,
    HAS_BIAS: tl.constexpr,
    FAN_IN: tl.constexpr,
):
    """Store this split's partial tile and, if it completes the tile, write the output.

    A two-level tree, so the partials are summed by many programs at once rather than one:
    the splits form groups of ``FAN_IN``; the last of a group to arrive (on the group's
    counter) sums the group's partials in one L2 round trip (its loads issue together) and
    stores the sum in the group's first slot; the last group to arrive (on the tile's counter)
    sums the group sums (one round trip per ``FAN_IN`` groups) and writes the output. With
    one group the group's last program writes the output itself. Each arrival is the serial
    split-K pattern: the barrier puts every thread's stores before the one release-acquire
    increment (GPU scope), the last arriver reads past L1 (``.cg``, no stale line) and puts
    the counter back to zero. Sums run in split order within a group and in group order
    across them, so the result is deterministic.

    Counters: ``cnt_ptr[tile]`` per output tile, then ``cnt_ptr[tiles + tile * groups + g]``.
    """
    splits = tl.num_programs(2)
    split = tl.program_id(2)
    tiles = tl.num_programs(0) * tl.num_programs(1)
    tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    size = M * N
    offs = rm[:, None] * N + rn[None, :]
    tl.store(ws_ptr + split * size + offs, res, mask=tile_ok)
    tl.debug_barrier()
    groups = tl.cdiv(splits, FAN_IN)
    group = split // FAN_IN
    first = group * FAN_IN
    members = tl.minimum(splits - first, FAN_IN)
    group_counter = cnt_ptr + tiles + tile * groups + group
    if tl.atomic_add(group_counter, 1, sem="acq_rel", scope="gpu") == members - 1:
        total = tl.zeros(res.shape, dtype=tl.float32)
        for j in tl.static_range(FAN_IN):
            total += _partial(ws_ptr, first + j, first + members, size, offs, tile_ok)
        tl.store(group_counter, 0)
        done = groups == 1
        if not done:
            tl.store(ws_ptr + first * size + offs, total, mask=tile_ok)
            tl.debug_barrier()
            tile_counter = cnt_ptr + tile
            if tl.atomic_add(tile_counter, 1, sem="acq_rel", scope="gpu") == groups - 1:
                total = tl.zeros(res.shape, dtype=tl.float32)
                for g0 in range(0, groups, FAN_IN):
                    for j in tl.static_range(FAN_IN):
                        total += _partial(ws_ptr, (g0 + j) * FAN_IN, splits, size, offs, tile_ok)
                tl.store(tile_counter, 0)
                done = True
        if done:
            store_out(total, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, stride_om, HAS_BIAS)


@triton.jit
def _partial(ws_ptr, slot, limit, tile_size, offs, tile_ok):
    """The fp32 tile in workspace slot ``slot``, read past L1 (zeros from slot ``limit`` on)."""
    ok = tile_ok & (slot < limit)
    return tl.load(ws_ptr + slot * tile_size + offs, mask=ok, other=0.0, cache_modifier=".cg")
