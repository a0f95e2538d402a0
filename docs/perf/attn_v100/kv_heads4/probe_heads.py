"""Probe (H100): one, two or four KV heads per fp8 decode program, against the shipped policy.

The shipped ``configs.kv_heads_per_program`` takes four heads where the four-head grid still
fills the 2-per-SM waves unsplit (else two, else one); this times, alternating, twice each:
fp16 as shipped, fp8 as shipped, and fp8 with 1, 2 and 4 KV heads per program forced (``pairs``
of ``docs/perf/attn_v100/kv_pairs/probe_pairs.py``; the launcher runs a forced 2 or 4 unsplit, 1 under the
split policy). Outputs of the forced launches are compared with the one-head launch first.
Run from the repository root with
PYTHONPATH=<root>/core/src:<root>/plugins/attn_v100/src.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kv_pairs"))

from probe_pairs import pairs

from volta_attn_v100 import bench

FP8 = "fp8_e5m2"
#: ``(query heads, batch, context)``, 8 KV heads.
SHAPES = (
    (32, 128, 2048),
    (64, 128, 2048),
    (32, 128, 1024),
    (64, 128, 1024),
    (32, 64, 2048),
    (32, 64, 4096),
    (64, 64, 4096),
    (32, 128, 4096),
    (64, 128, 4096),
)
#: ``(label, KV dtype, KV heads per program)``; None: as shipped.
VARIANTS = (
    ("fp16", "float16", None),
    ("fp8 shipped", FP8, None),
    ("fp8 1", FP8, 1),
    ("fp8 2", FP8, 2),
    ("fp8 4", FP8, 4),
)


def main() -> int:
    copy_bw = bench.copy_bandwidth()
    print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy_bw / 1e9:.0f} GB/s")
    lines = []
    for heads, batch, ctx in SHAPES:
        with pairs(1):
            ref = bench._decode_output(batch, ctx, heads, 8, FP8, None)
        diff = 0.0
        for kv_per_prog in (2, 4):
            with pairs(kv_per_prog):
                out = bench._decode_output(batch, ctx, heads, 8, FP8, None)
            diff = max(diff, bench._max_abs_diff(out, ref))
        assert diff < 2e-3, (heads, batch, ctx, diff)
        best: dict[str, float] = {}
        for _ in range(2):
            for key, dtype, kv_per_prog in VARIANTS:
                with pairs(kv_per_prog):
                    row = bench.decode_case(batch, ctx, heads, 8, dtype, copy_bw)
                us = row["ms"] * 1e3
                best[key] = min(best.get(key, float("inf")), us)
                print(f"{heads}/8 {batch} x {ctx} {key}: {us:.1f} us", flush=True)
        f16 = best["fp16"]
        cells = " | ".join(f"{k} {best[k]:7.1f} ({best[k] / f16:.3f}x)" for k, *_ in VARIANTS[1:])
        lines.append(f"{heads}/8 {batch:>3} x {ctx:<6} fp16 {f16:8.1f} | {cells} | diff {diff:.1e}")
    print("\n== us, best of two alternating runs (x fp16 time)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
