"""Probe (H100, one call): fp16 decode tiles with deeper pipelines where the grid is small.

The fp8 probe of the same day (``docs/perf/attn_v100/fp8_small/``) found 3 stages worth 8% at 1 x 8K for
a 64-key tile with the wide combine (18.1 -> 15.5 us against 2 stages). The shipped fp16 tile
is 64 keys, 4 warps, 2 stages; a sweep before the wide combine had 3 stages 1-14% slower at
1 x 8K. Here, with the shipped combine choice (wide for small grids), 32/8 and 64/8 heads at
batch 1-4 and one bandwidth-bound shape, the shipped tile against 3 and 4 stages and 32-key
tiles; every variant's output on the first input set is compared with the shipped output.
Timing as the benchmark's (``volta_attn_v100.bench.decode_case``), alternating the variants
twice; the best of the two is printed.
Run from the repository root with PYTHONPATH=core/src:plugins/attn_v100/src.
"""

from __future__ import annotations

import sys

import torch

from volta_attn_v100 import bench
from volta_attn_v100.configs import Tiles

SHAPES = ((1, 1024, 32), (1, 8192, 32), (1, 8192, 64), (1, 32768, 32), (2, 8192, 32))
SHAPES += ((4, 8192, 32), (64, 8192, 32))
TILES = {
    "64k s2": None,
    "64k s3": Tiles(16, 64, 4, 3),
    "64k s4": Tiles(16, 64, 4, 4),
    "32k s3": Tiles(16, 32, 4, 3),
    "32k s4": Tiles(16, 32, 4, 4),
}


def main() -> int:
    copy_bw = bench.copy_bandwidth()
    print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy_bw / 1e9:.0f} GB/s")
    lines = []
    for batch, ctx, heads in SHAPES:
        ref = bench._decode_output(batch, ctx, heads, 8, "float16", None)
        best: dict[str, float] = {}
        for _ in range(2):
            for name, tiles in TILES.items():
                with bench._launcher_tiles(decode=tiles):
                    out = bench._decode_output(batch, ctx, heads, 8, "float16", None)
                    row = bench.decode_case(batch, ctx, heads, 8, "float16", copy_bw)
                diff = bench._max_abs_diff(out, ref)
                assert diff < 2e-3, (batch, ctx, heads, name, diff)
                us = row["ms"] * 1e3
                best[name] = min(best.get(name, us), us)
                print(f"{batch} x {ctx} {heads}/8 {name}: {us:.1f} us", flush=True)

        def pct(us: float, nbytes: int = row["bytes"]) -> float:
            return nbytes / (us * 1e-6) / copy_bw * 100

        shipped = best["64k s2"]
        lines.append(
            f"{batch:>3} x {ctx:<6} {heads}/8 [{row['splits']}] "
            + " | ".join(f"{n} {t:.1f} ({shipped / t:.3f}x)" for n, t in best.items())
            + f" | % of copy: shipped {pct(shipped):.1f}, best {pct(min(best.values())):.1f}"
        )
    print("\n== fp16 decode us, best of two (shipped / variant), [partitions]; first = shipped")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
