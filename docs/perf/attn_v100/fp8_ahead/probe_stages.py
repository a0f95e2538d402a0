"""Probe (H100, after the shipped call): fp8 decode with scores ahead on 3 stages.

The shipped fp8 tile (128 keys, 4 warps, 2 stages) with scores ahead from 4K keys a partition
still takes 0.62x the fp16 time at 64 x 4K and 0.64x at 128 x 2K (`docs/perf/attn_v100/scores_ahead/`).
Without scores ahead, 3 stages were 6-9% slower (README, "fp8 KV in head halves"). For each
shape this times, alternating, twice each: fp16 as shipped, fp8 as shipped, and fp8 on 3
stages with scores ahead forced; the variant's output on the first input set is compared with
the shipped fp8 output first. Run from the repository root with
PYTHONPATH=core/src:plugins/attn_v100/src.
"""

from __future__ import annotations

import sys

import torch
from probe_tiles import FP8, ahead

from volta_attn_v100 import bench
from volta_attn_v100.configs import Tiles

SHAPES = ((32, 64, 4096), (32, 128, 2048), (32, 64, 8192), (32, 16, 8192), (32, 32, 16384))
STAGES3 = Tiles(16, 128, 4, 3)


def main() -> int:
    copy_bw = bench.copy_bandwidth()
    print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy_bw / 1e9:.0f} GB/s")
    lines = []
    for heads, batch, ctx in SHAPES:
        ref = bench._decode_output(batch, ctx, heads, 8, FP8, None)
        with bench._launcher_tiles(decode=STAGES3), ahead(True):
            out = bench._decode_output(batch, ctx, heads, 8, FP8, None)
        assert bench._max_abs_diff(out, ref) < 2e-3, (heads, batch, ctx)
        best: dict[str, float] = {}
        for _ in range(2):
            for key in ("fp16", "fp8", "fp8 s3 ahead"):
                dtype = "float16" if key == "fp16" else FP8
                tiles = STAGES3 if key == "fp8 s3 ahead" else None
                with bench._launcher_tiles(decode=tiles), ahead(True if tiles else None):
                    row = bench.decode_case(batch, ctx, heads, 8, dtype, copy_bw)
                us = row["ms"] * 1e3
                best[key] = min(best.get(key, float("inf")), us)
                print(f"{heads}/8 {batch} x {ctx} {key}: {us:.1f} us", flush=True)
        f16 = best["fp16"]
        cells = " | ".join(
            f"{k} {best[k]:7.1f} ({best[k] / f16:.3f}x)" for k in ("fp8", "fp8 s3 ahead")
        )
        lines.append(f"{heads}/8 {batch:>3} x {ctx:<6} fp16 {f16:8.1f} | {cells}")
    print("\n== us, best of two alternating runs (x fp16 time)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
