"""Probe (not shipped): more warps per program for the 1-token GEMV and the 4-16-token dot tile
(same grids), ct_wna16 on the H100."""

from volta_core.kernels.bench import measure_copy_bandwidth
from volta_ct_wna16 import bench


def candidates(m):
    if m == 1:
        return [
            bench._gemv(512, 32, 2, 3, 5, 16),
            *(bench._gemv(512, 32, 4, 3, p, 16) for p in (4, 5, 8)),
            bench._gemv(1024, 32, 4, 3, 3, 16),
            bench._gemv(512, 64, 4, 3, 4, 16),
        ]
    return [
        bench._dot(256, 128, 4, 3, 2),
        *(bench._dot(256, 128, 8, 3, p) for p in (2, 3)),
        bench._dot(256, 128, 8, 4, 2),
        bench._dot(128, 128, 8, 3, 4),
        bench._dot(256, 256, 8, 3, 2),
    ]


def main():
    bench.sweep_candidates = candidates
    copy_bw = measure_copy_bandwidth()[0] * 1e9
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    swept = []
    for n, k in bench.SHAPES:
        swept += bench.sweep(n, k, True, (1, 16), copy_bw)
        swept += bench.sweep(n, k, False, (1, 16), copy_bw)
    print()
    print(bench.best_of_sweep(swept))


if __name__ == "__main__":
    main()
