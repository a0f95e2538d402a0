"""Probe (H100, first call): decode with each whole tile's scores taken one iteration ahead.

The fp8 decode loop (sm_90: 128 keys, 4 warps, 255 registers, 2 programs per SM) reads at
78-83% of copy bandwidth where fp16 reaches 99-100%; Nsight Compute had its pace set by each
iteration's dependent chain (`docs/perf/attn_v100/v_layout/`). ``AHEAD`` (``attend_ahead``) computes Q.K of
the next tile in the same loop body as the softmax and P.V of this one, which do not depend on
it. For each shape this times, alternating, twice each: fp16 as shipped, fp16 in halves with
scores ahead, fp8 as shipped, fp8 with scores ahead; each variant's output on the first input
set is compared with the shipped output of its dtype before timing. Timing as the benchmark's
(``volta_attn_v100.bench.decode_case``: one CUDA graph, rotating input copies).
Run from the repository root with PYTHONPATH=core/src:plugins/attn_v100/src.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch

from volta_attn_v100 import bench, ops

SHAPES = (
    (32, 1, 1024),
    (32, 1, 8192),
    (32, 1, 32768),
    (32, 8, 8192),
    (32, 16, 8192),
    (32, 32, 16384),
    (32, 64, 4096),
    (32, 64, 8192),
    (32, 128, 2048),
    (32, 128, 8192),
    (64, 1, 8192),
    (64, 32, 16384),
    (64, 128, 2048),
)


@contextmanager
def ahead(on: bool):
    """The launcher takes halves and scores ahead for both dtypes (``on``), or as shipped."""
    shipped = (ops.head_halves, ops.scores_ahead)
    if on:
        ops.head_halves = lambda *args: True
        ops.scores_ahead = lambda *args: True
    try:
        yield
    finally:
        ops.head_halves, ops.scores_ahead = shipped


def main() -> int:
    copy_bw = bench.copy_bandwidth()
    print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy_bw / 1e9:.0f} GB/s")
    lines = []
    for heads, batch, ctx in SHAPES:
        best: dict[str, float] = {}
        for dtype in ("float16", "fp8_e5m2"):
            ref = bench._decode_output(batch, ctx, heads, 8, dtype, None)
            with ahead(True):
                out = bench._decode_output(batch, ctx, heads, 8, dtype, None)
            diff = bench._max_abs_diff(out, ref)
            assert diff < 2e-3, (heads, batch, ctx, dtype, diff)
        for _ in range(2):
            for dtype in ("float16", "fp8_e5m2"):
                for on in (False, True):
                    with ahead(on):
                        row = bench.decode_case(batch, ctx, heads, 8, dtype, copy_bw)
                    key = f"{dtype}{' ahead' if on else ''}"
                    us = row["ms"] * 1e3
                    best[key] = min(best.get(key, float("inf")), us)
                    print(
                        f"{heads}/8 {batch} x {ctx} {key} [{row['splits']}]: {us:.1f} us "
                        f"{100 * row['fraction_of_copy']:.1f}%",
                        flush=True,
                    )
        f16, f16a = best["float16"], best["float16 ahead"]
        f8, f8a = best["fp8_e5m2"], best["fp8_e5m2 ahead"]
        lines.append(
            f"{heads}/8 {batch:>3} x {ctx:<6} fp16 {f16:8.1f} | fp16 ahead {f16a:8.1f} "
            f"({f16a / f16:.3f}) | fp8 {f8:8.1f} ({f8 / f16:.3f}x) | fp8 ahead {f8a:8.1f} "
            f"({f8a / f16:.3f}x fp16, {f8a / f8:.3f} of fp8)"
        )
    print("\n== us, best of two alternating runs (ratio)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
