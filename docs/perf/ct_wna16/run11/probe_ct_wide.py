"""Probe (not shipped): the wide 1-token tile on 2 warps (run 9) against 4 (run 11), 27648x5120,
three repetitions each."""

from volta_core.kernels.bench import measure_copy_bandwidth
from volta_ct_wna16 import bench


def main():
    bench.sweep_candidates = lambda m: [bench._gemv(512, 32, 2, 3, 5, 16)]
    copy_bw = measure_copy_bandwidth()[0] * 1e9
    swept = []
    for _ in range(3):
        for sym in (True, False):
            swept += bench.sweep(27648, 5120, sym, (1,), copy_bw)
    print()
    for r in swept:
        print(bench.sweep_line(r))


if __name__ == "__main__":
    main()
