"""Probe (not shipped): fp16 decode with the partition bounds known on the host, H100."""

import importlib

from volta_attn_v100 import bench

x_bench = importlib.import_module("volta_attn_v100x.bench")


def main() -> None:
    copy_bw = bench.copy_bandwidth()
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    for rep in range(3):
        for batch, ctx in [(1, 8192), (1, 1024), (1, 32768), (4, 8192), (8, 8192)]:
            a = bench.decode_case(batch, ctx, 32, 8, "float16", copy_bw)
            b = x_bench.decode_case(batch, ctx, 32, 8, "float16", copy_bw)
            print(
                f"rep {rep} {batch:2d}x{ctx:5d} shipped {a['ms'] * 1e3:6.2f} us "
                f"({100 * a['fraction_of_copy']:4.1f}%)  host-bounds {b['ms'] * 1e3:6.2f} us "
                f"({100 * b['fraction_of_copy']:4.1f}%)",
                flush=True,
            )


if __name__ == "__main__":
    main()
