"""Probe (not shipped): fp8 decode tiles and split policies at head 128, 32/8 heads."""

from volta_attn_v100 import bench
from volta_attn_v100.configs import SplitPolicy, Tiles


def main() -> None:
    copy_bw = bench.copy_bandwidth()
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    shapes = [(64, 8192), (32, 16384), (16, 8192), (8, 8192), (1, 8192)]
    variants = [
        ("shipped", None, None),
        ("n64w4s2 p2", Tiles(16, 64, 4, 2), SplitPolicy(2)),
        ("n64w4s2 p3", Tiles(16, 64, 4, 2), SplitPolicy(3)),
        ("n64w4s3 p3", Tiles(16, 64, 4, 3), SplitPolicy(3)),
        ("n128w4s2 p3", Tiles(16, 128, 4, 2), SplitPolicy(3)),
    ]
    for batch, ctx in shapes:
        fp16 = bench.decode_case(batch, ctx, 32, 8, "float16", copy_bw)["ms"]
        for name, tiles, policy in variants:
            with bench._launcher_tiles(decode=tiles):
                r = bench.decode_case(batch, ctx, 32, 8, "fp8_e5m2", copy_bw, split_policy=policy)
            print(
                f"{batch:3d}x{ctx:5d} {name:12s} {r['ms'] * 1e3:8.1f} us splits {r['splits']:2d} "
                f"fp8/fp16 {r['ms'] / fp16:5.3f} (fp16 {fp16 * 1e3:.1f} us)",
                flush=True,
            )


if __name__ == "__main__":
    main()
