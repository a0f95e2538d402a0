"""Probe (not shipped): the dot tile with activations read as 32-bit slot pairs and, where a
tile lies in one group, weights as exact fp16 subnormals ``(q - z) * 2**-24`` scaled once per
tile after the dots, against the last commit's kernels (a copy of its package in
``bench-results/scratch/volta_ct_wna16_old``), at 4, 16 and 32 tokens, twice; then tiles and
programs per SM for the new kernel at 16 tokens."""

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
        d(128, 128, 4, 3, 4, 4),
        d(128, 128, 4, 3, 8, 4),
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
