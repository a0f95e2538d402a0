"""Probe (not shipped): the dot tile reading activations as 32-bit slot pairs (pipelined
``cp.async``) against the previous per-slot 2-byte gathers, on every benchmark layer at 4, 16
and 32 tokens; then candidate tiles for the new kernel. The previous kernels are a copy of
the last commit's package (``bench-results/scratch/volta_ct_wna16_old``)."""

import sys

from volta_core.kernels.bench import measure_copy_bandwidth
from volta_ct_wna16 import bench

sys.path.insert(0, "bench-results/scratch")
from volta_ct_wna16_old import bench as old_bench

SHAPES = ((5120, 5120), (27648, 5120), (5120, 27648), (7168, 5120))


def candidates(m):
    d = bench._dot
    return [
        d(256, 128, 4, 3, 3),
        d(256, 128, 4, 3, 4),
        d(256, 128, 4, 4, 2),
        d(256, 128, 8, 3, 2),
        d(256, 128, 8, 3, 4),
        d(256, 256, 4, 3, 2),
        d(128, 128, 4, 3, 4, 4),
        d(128, 128, 4, 3, 8, 4),
        d(128, 256, 4, 3, 4, 4),
        d(512, 128, 8, 3, 2),
    ]


def main():
    copy_bw = measure_copy_bandwidth()[0] * 1e9
    old_bench.sweep_candidates = lambda m: []
    bench.sweep_candidates = lambda m: []
    rows = []
    for n, k in SHAPES:
        for sym in (True, False):
            for rep in range(2):
                for tag, mod in (("old", old_bench), ("new", bench)):
                    for r in mod.sweep(n, k, sym, (4, 16, 32), copy_bw):
                        r["tag"] = f"{tag}{rep}"
                        rows.append(r)
    bench.sweep_candidates = candidates
    for n, k in SHAPES:
        for sym in (True, False):
            for r in bench.sweep(n, k, sym, (16,), copy_bw):
                r["tag"] = "cand"
                rows.append(r)
    print()
    for r in rows:
        print(r["tag"], bench.sweep_line(r))


if __name__ == "__main__":
    main()
