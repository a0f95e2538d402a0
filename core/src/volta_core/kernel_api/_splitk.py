"""Split-K's serial reduction, as Triton device functions: one implementation for every plugin.

A split-K launch cuts one output tile's input across programs (``tl.program_id(2)``, the grid
``(row blocks, output blocks, splits)``) and sums their fp32 partials in the same launch, by
the rule of CUTLASS's serial split-K (``kSplitKSerial``, ``cutlass/gemm/kernel/gemm.h``: one
semaphore word per output tile, a program's writes ordered before its one signal, and the
tile's final partition resets the word to zero for subsequent grids), without the turn-taking:
each split adds its partial atomically, in any order, into fp32 accumulators that are zero, a
barrier puts every thread's adds before one release-acquire increment of the tile's counter at
GPU scope, and the program that reads ``splits - 1`` there is the last to arrive; it reads the
sums, writes zeros back, resets the counter and writes the output. The counters and
accumulators come zeroed from the host (:func:`volta_core.kernel_api.arrival_counters`,
:func:`~volta_core.kernel_api.zeroed_accumulators`) and are zero again after every launch, so
the next one (a CUDA graph replay included) needs no memset.

The tensor-core GEMMs in CUDA C++ follow the same rule through the SM70 prelude's
``splitk_mma_epilogue`` (:data:`volta_core.kernel_api.SM70_PRELUDE`).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def store_out(acc, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, stride_om, HAS_BIAS: tl.constexpr):
    """Add the bias (``b_ptr[rn]``, when ``HAS_BIAS``) to an fp32 output tile, cast it to the
    output's dtype and store it at ``out_ptr[rm, rn]`` (rows ``stride_om`` apart)."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    o = out_ptr + rm[:, None] * stride_om + rn[None, :]
    tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=tile_ok)


@triton.jit
def take_sums(acc_ptrs, ok):
    """The last arriver's read of atomically added fp32 sums: read by atomically adding zero,
    not by loads (loads past L1, ``.cg``, returned sums missing some splits' adds on the H100,
    docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run15; atomics are performed in L2), with zeros
    written back so that the next launch finds the accumulators zero."""
    zero = tl.zeros(acc_ptrs.shape, dtype=tl.float32)
    total = tl.atomic_add(acc_ptrs, zero, mask=ok, sem="relaxed", scope="gpu")
    tl.store(acc_ptrs, zero, mask=ok)
    return total


@triton.jit
def accumulate_splits(
    res, ws_ptr, cnt_ptr, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, N, stride_om, HAS_BIAS
):
    """Add this split's fp32 partial tile ``res`` into the tile's accumulators and, if it
    completes the tile, write the output (:func:`store_out`).

    The adds are atomic (relaxed, their results unused), done by L2 while the other splits
    still run, so the tile's last arriver reads one sum in one round trip. The arrival: a
    barrier, then one release-acquire increment of ``cnt_ptr[tile]`` at GPU scope; the last
    arriver reads the sums with :func:`take_sums` (zeros written back) and resets the counter.
    The adds land in the order the splits reach L2, so the fp32 sum (and, rarely, the output's
    last bit) can differ between launches. ``ws_ptr`` is ``[M, N]`` fp32; the output tile is
    ``tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)``, its splits
    ``tl.num_programs(2)``.
    """
    splits = tl.num_programs(2)
    tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    acc_ptrs = ws_ptr + rm[:, None] * N + rn[None, :]
    tl.atomic_add(acc_ptrs, res, mask=tile_ok, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    counter = cnt_ptr + tile
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == splits - 1:
        total = take_sums(acc_ptrs, tile_ok)
        tl.store(counter, 0)
        store_out(total, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, stride_om, HAS_BIAS)
