"""Probe of this call (not shipped code): decode tiles at head size 512 on the H100.

Run from the repository root with ``PYTHONPATH=core/src:plugins/attn_v100/src``; prints one line
per tile, KV dtype, head split and shape (``probe_tiles.log``).
"""

from volta_attn_v100 import bench, ops
from volta_attn_v100.configs import Tiles

VARIANTS = [
    None,
    Tiles(16, 16, 8, 2),
    Tiles(16, 64, 8, 2),
    Tiles(16, 32, 4, 2),
    Tiles(16, 32, 8, 3),
    Tiles(16, 64, 8, 3),
    Tiles(16, 64, 16, 2),
]


def main() -> None:
    copy_bw = bench.copy_bandwidth()
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    shipped_halves = ops.head_halves
    for halves in (False, True):
        ops.head_halves = (lambda fp8, cap, hs: fp8) if halves else shipped_halves
        for kv in ("fp8_e5m2",) if halves else ("fp8_e5m2", "float16"):
            for tiles in VARIANTS:
                if halves and tiles is not None and tiles.num_warps == 16:
                    continue
                for batch, ctx in ((1, 8192), (16, 8192)):
                    with bench._launcher_tiles(decode=tiles):
                        r = bench.decode_case(batch, ctx, 32, 16, kv, copy_bw, head_size=512)
                    print(
                        f"halves={halves} {kv:9s} {tiles!s:55s} {batch}x{ctx} "
                        f"{r['ms'] * 1e3:8.1f} us {100 * r['fraction_of_copy']:5.1f}%",
                        flush=True,
                    )
    ops.head_halves = shipped_halves


if __name__ == "__main__":
    main()
