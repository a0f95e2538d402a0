"""Probe (H100): the wide combine, and fp16 partials, for fp8 decode at small batches.

At 1 x 32K the saved bytes leave fp8 decode room for 0.6x of the fp16 time (README: fp16 time
minus the two read floors' difference is 0.58-0.59x), but it measures 0.65-0.68x. Its 256
programs (32 partitions of 1024 keys) end in a combine of 32 partitions: for 32/8 heads 4 rows
x 128 floats each, which the narrow combine (``configs.COMBINE_FLOATS``) loads in four serial
L2 round trips. fp8 launches never take the wide combine (``configs.wide_combine``: one step),
since at 8 x 8K, where 4 partitions are combined, it was slower (65.2 against 62.1 us), and
4-row combines keep fp32 partials (``configs.fp16_partials``: fp8 1 x 8K 23% slower in fp16).
This times, for fp8 shapes of 1 to 8 sequences: fp16 as shipped, fp8 as shipped, fp8 with
the wide combine forced, and fp8 with the wide combine and fp16 partials forced; alternating
over three rounds, best of each. Each variant's output on the first input set is compared with
the shipped fp8 output first. Run from the repository root with
PYTHONPATH=core/src:plugins/attn_v100/src.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch

from volta_attn_v100 import bench, ops

FP8 = "fp8_e5m2"
#: (query heads, batch, context); 8 KV heads, head size 128.
SHAPES = (
    (32, 1, 32768),
    (64, 1, 32768),
    (32, 1, 8192),
    (64, 1, 8192),
    (32, 1, 1024),
    (32, 2, 32768),
    (32, 4, 8192),
    (32, 8, 8192),
)
VARIANTS = ("fp16", "fp8", "fp8 wide", "fp8 wide f16")
ROUNDS = 3


@contextmanager
def forced(name: str):
    """The launch's combine as the variant names it (the shipped rules otherwise)."""
    shipped = (ops.wide_combine, ops.fp16_partials)
    if "wide" in name:
        ops.wide_combine = lambda *args: True
    if "f16" in name:
        ops.fp16_partials = lambda *args: True
    try:
        yield
    finally:
        ops.wide_combine, ops.fp16_partials = shipped


def main() -> int:
    copy_bw = bench.copy_bandwidth()
    print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy_bw / 1e9:.0f} GB/s")
    lines = []
    for heads, batch, ctx in SHAPES:
        ref = bench._decode_output(batch, ctx, heads, 8, FP8, None)
        diffs = {}
        for name in VARIANTS[2:]:
            with forced(name):
                out = bench._decode_output(batch, ctx, heads, 8, FP8, None)
            diffs[name] = bench._max_abs_diff(out, ref)
            assert diffs[name] < 2e-3, (heads, batch, ctx, name, diffs[name])
        best: dict[str, float] = {}
        for _ in range(ROUNDS):
            for name in VARIANTS:
                dtype = "float16" if name == "fp16" else FP8
                with forced(name):
                    row = bench.decode_case(batch, ctx, heads, 8, dtype, copy_bw)
                us = row["ms"] * 1e3
                best[name] = min(best.get(name, float("inf")), us)
                label = f"{heads}/8 {batch} x {ctx} {name} [{row['splits']}]"
                print(f"{label}: {us:.2f} us", flush=True)
        f16 = best["fp16"]
        cells = " | ".join(f"{k} {best[k]:7.2f} ({best[k] / f16:.3f}x)" for k in VARIANTS[1:])
        diff = ", ".join(f"{d:.1e}" for d in diffs.values())
        lines.append(f"{heads}/8 {batch:>2} x {ctx:<6} fp16 {f16:7.2f} | {cells} | diff {diff}")
    print(f"\n== us, best of {ROUNDS} alternating runs (x fp16 time)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
