"""Probe (not shipped): fp8 decode tiles, shipped layout vs V^T in page, H100."""

import importlib

from volta_attn_v100 import bench
from volta_attn_v100.configs import Tiles

xb = importlib.import_module("volta_attn_v100x.bench")


def main():
    copy_bw = bench.copy_bandwidth()
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for batch, ctx in [(1, 8192), (16, 8192), (64, 8192), (128, 2048)]:
        f16 = bench.decode_case(batch, ctx, 32, 8, "float16", copy_bw)["ms"]
        line = f"{batch:3d}x{ctx:5d} fp16 {f16 * 1e3:7.1f} us |"
        for name, mod in (("ship", bench), ("vt", xb)):
            for tiles in (
                None,
                Tiles(16, 128, 4, 3),
                Tiles(16, 128, 8, 2),
                Tiles(16, 64, 4, 3),
                Tiles(16, 256, 8, 2),
            ):
                try:
                    with mod._launcher_tiles(decode=tiles):
                        ms = mod.decode_case(batch, ctx, 32, 8, "fp8_e5m2", copy_bw)["ms"]
                    fig = f"{ms / f16:.3f}"
                except Exception as exc:
                    fig = f"err {type(exc).__name__}"
                tag = (
                    "def"
                    if tiles is None
                    else f"{tiles.block_n}/{tiles.num_warps}/{tiles.num_stages}"
                )
                line += f" {name} {tag} {fig}"
        print(line, flush=True)
        rows.append(line)
    print("\nTABLE (fp8 time / fp16 time)\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
