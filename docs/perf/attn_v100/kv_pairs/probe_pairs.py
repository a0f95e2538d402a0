"""Probe (H100): two KV heads per fp8 decode program, their tiles walked as one stream.

128 x 2K fp8 decode stays at 0.63-0.64x of fp16 while 64 x 4K, the same bytes in half as
many programs twice as long, reaches 0.59x with scores ahead (``docs/perf/attn_v100/ahead_stages/``). For
each shape this times, alternating, twice each: fp16 as shipped, fp8 with one KV head per
program and fp8 with two (``ops.kv_heads_per_program`` forced; scores ahead as the launcher
takes it for the doubled stream); the paired output on the first input set is compared with
the unpaired one first. Run from the repository root with
PYTHONPATH=core/src:plugins/attn_v100/src.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

from volta_attn_v100 import bench, ops

FP8 = "fp8_e5m2"
SHAPES = (
    (32, 128, 2048),
    (64, 128, 2048),
    (32, 256, 1024),
    (32, 128, 1024),
    (32, 64, 2048),
    (32, 64, 4096),
    (32, 128, 4096),
    (32, 16, 8192),
    (32, 8, 8192),
)
#: ``PROBE_SHAPES=0,1,5`` times only those rows of :data:`SHAPES`.
PICK = [int(i) for i in os.environ.get("PROBE_SHAPES", "").split(",") if i]


@contextlib.contextmanager
def pairs(kv_per_prog: int | None, splits: int | None = None):
    """Launch with ``kv_per_prog`` KV heads per program (None: as shipped) and, with
    ``splits``, that many partitions."""
    shipped = ops.kv_heads_per_program, ops.default_num_splits
    if kv_per_prog is not None:
        ops.kv_heads_per_program = lambda *args: kv_per_prog
    if splits is not None:
        ops.default_num_splits = lambda *args: splits
    try:
        yield
    finally:
        ops.kv_heads_per_program, ops.default_num_splits = shipped


#: ``(label, KV dtype, KV heads per program, partitions)``; None: as shipped.
VARIANTS = (
    ("fp16", "float16", None, None),
    ("fp8 1", FP8, 1, None),
    ("fp8 2", FP8, 2, None),
)
#: ``PROBE_P4=1`` adds four KV heads per program, as the split policy gives and unsplit (32/8
#: heads only: 16 rows).
if os.environ.get("PROBE_P4"):
    VARIANTS += (("fp8 4", FP8, 4, None), ("fp8 4u", FP8, 4, 1))


def main() -> int:
    copy_bw = bench.copy_bandwidth()
    print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy_bw / 1e9:.0f} GB/s")
    lines = []
    for heads, batch, ctx in [SHAPES[i] for i in PICK] if PICK else SHAPES:
        with pairs(1):
            ref = bench._decode_output(batch, ctx, heads, 8, FP8, None)
        with pairs(2):
            out = bench._decode_output(batch, ctx, heads, 8, FP8, None)
        diff = bench._max_abs_diff(out, ref)
        for _, _, kv_per_prog, splits in VARIANTS[3:]:
            with pairs(kv_per_prog, splits):
                out = bench._decode_output(batch, ctx, heads, 8, FP8, None)
            diff = max(diff, bench._max_abs_diff(out, ref))
        assert diff < 2e-3, (heads, batch, ctx, diff)
        best: dict[str, float] = {}
        for _ in range(2):
            for key, dtype, kv_per_prog, splits in VARIANTS:
                with pairs(kv_per_prog, splits):
                    row = bench.decode_case(batch, ctx, heads, 8, dtype, copy_bw)
                us = row["ms"] * 1e3
                best[key] = min(best.get(key, float("inf")), us)
                print(f"{heads}/8 {batch} x {ctx} {key}: {us:.1f} us", flush=True)
        f16 = best["fp16"]
        cells = " | ".join(f"{k} {best[k]:7.1f} ({best[k] / f16:.3f}x)" for k, *_ in VARIANTS[1:])
        lines.append(f"{heads}/8 {batch:>3} x {ctx:<6} fp16 {f16:8.1f} | {cells} | diff {diff:.1e}")
    print("\n== us, best of two alternating runs (x fp16 time); KV heads per program 1 or 2")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
