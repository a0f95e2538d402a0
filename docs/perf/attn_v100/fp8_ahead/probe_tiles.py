"""Probe (H100, third call): fp8 decode tiles of 64 keys where partitions are short.

With scores ahead taken from 4K keys a partition on (``configs.scores_ahead``), fp8 decode
stays above 0.6x the fp16 time at 128 x 2K (0.634x) and 64 x 4K (0.610-0.618x) in the first
two calls. The shipped fp8 tile (128 keys, 4 warps, 2 stages) takes 255 registers at sm_90, two
programs per SM. For each shape this times, alternating, twice each: fp16 as shipped, fp8 as
shipped, and fp8 on 64-key tiles with 2 and 3 stages, each with and without scores ahead;
each variant's output on the first input set is compared with the shipped fp8 output first.
Run from the repository root with PYTHONPATH=core/src:plugins/attn_v100/src.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack, contextmanager

import torch

from volta_attn_v100 import bench, ops
from volta_attn_v100.configs import Tiles

SHAPES = ((32, 128, 2048), (32, 64, 4096), (32, 64, 8192), (64, 128, 2048), (32, 16, 8192))
FP8 = "fp8_e5m2"
VARIANTS = {
    "fp8": (None, None),
    "64k s2": (Tiles(16, 64, 4, 2), False),
    "64k s2 ahead": (Tiles(16, 64, 4, 2), True),
    "64k s3": (Tiles(16, 64, 4, 3), False),
    "64k s3 ahead": (Tiles(16, 64, 4, 3), True),
}


@contextmanager
def ahead(on: bool | None):
    """Scores ahead always (True), never (False), or as shipped (None)."""
    shipped = ops.scores_ahead
    if on is not None:
        ops.scores_ahead = lambda *args: on
    try:
        yield
    finally:
        ops.scores_ahead = shipped


def variant(name: str) -> ExitStack:
    tiles, on = VARIANTS[name]
    stack = ExitStack()
    stack.enter_context(bench._launcher_tiles(decode=tiles))
    stack.enter_context(ahead(on))
    return stack


def main() -> int:
    copy_bw = bench.copy_bandwidth()
    print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy_bw / 1e9:.0f} GB/s")
    lines = []
    for heads, batch, ctx in SHAPES:
        ref = bench._decode_output(batch, ctx, heads, 8, FP8, None)
        for name in VARIANTS:
            with variant(name):
                out = bench._decode_output(batch, ctx, heads, 8, FP8, None)
            assert bench._max_abs_diff(out, ref) < 2e-3, (heads, batch, ctx, name)
        best: dict[str, float] = {}
        for _ in range(2):
            row = bench.decode_case(batch, ctx, heads, 8, "float16", copy_bw)
            best["fp16"] = min(best.get("fp16", float("inf")), row["ms"] * 1e3)
            for name in VARIANTS:
                with variant(name):
                    row = bench.decode_case(batch, ctx, heads, 8, FP8, copy_bw)
                us = row["ms"] * 1e3
                best[name] = min(best.get(name, float("inf")), us)
                print(f"{heads}/8 {batch} x {ctx} {name}: {us:.1f} us", flush=True)
        f16 = best["fp16"]
        cells = " | ".join(f"{k} {best[k]:7.1f} ({best[k] / f16:.3f}x)" for k in VARIANTS)
        lines.append(f"{heads}/8 {batch:>3} x {ctx:<6} fp16 {f16:8.1f} | {cells}")
    print("\n== us, best of two alternating runs (x fp16 time)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
