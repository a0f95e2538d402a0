"""Probe (H100, after 3 stages shipped): scores ahead on 3 stages for short fp8 partitions.

Scores ahead is taken from 4096 keys a partition (``configs.AHEAD_MIN_KEYS``): on 2 stages it
lost where partitions were shorter (probe 1). On 3 stages it gained 3-4% more where it is
taken (``probe_stages.log``). For each shape with short partitions this times, alternating,
twice each: fp16 as shipped, fp8 as shipped (no scores ahead there), and fp8 with scores ahead
forced (3 stages, as the launcher takes them); the variant's output on the first input set is
compared with the shipped fp8 output first. Run from the repository root with
PYTHONPATH=core/src:plugins/attn_v100/src.
"""

from __future__ import annotations

import sys

import torch
from probe_tiles import FP8, ahead

from volta_attn_v100 import bench

SHAPES = ((32, 128, 2048), (64, 128, 2048), (32, 8, 8192), (32, 1, 32768), (32, 1, 8192))


def main() -> int:
    copy_bw = bench.copy_bandwidth()
    print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy_bw / 1e9:.0f} GB/s")
    lines = []
    for heads, batch, ctx in SHAPES:
        ref = bench._decode_output(batch, ctx, heads, 8, FP8, None)
        with ahead(True):
            out = bench._decode_output(batch, ctx, heads, 8, FP8, None)
        assert bench._max_abs_diff(out, ref) < 2e-3, (heads, batch, ctx)
        best: dict[str, float] = {}
        for _ in range(2):
            for key in ("fp16", "fp8", "fp8 ahead s3"):
                dtype = "float16" if key == "fp16" else FP8
                with ahead(True if key == "fp8 ahead s3" else None):
                    row = bench.decode_case(batch, ctx, heads, 8, dtype, copy_bw)
                us = row["ms"] * 1e3
                best[key] = min(best.get(key, float("inf")), us)
                print(f"{heads}/8 {batch} x {ctx} {key} [{row['splits']}]: {us:.1f} us", flush=True)
        f16 = best["fp16"]
        cells = " | ".join(
            f"{k} {best[k]:7.1f} ({best[k] / f16:.3f}x)" for k in ("fp8", "fp8 ahead s3")
        )
        lines.append(f"{heads}/8 {batch:>3} x {ctx:<6} fp16 {f16:8.1f} | {cells}")
    print("\n== us, best of two alternating runs (x fp16 time)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
