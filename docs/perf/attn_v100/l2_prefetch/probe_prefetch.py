"""Probe (H100): split decode launches asking L2 for their partition's rows at the start.

For each shape this times, alternating, twice each: the launch without prefetch and with
``configs.decode_prefetch`` capped at 256, 512 and 1024 keys (``ops.decode_prefetch``
replaced), fp16 and fp8_e5m2 KV. The prefetching launches' outputs on the first input set
are compared with the plain launch's first (a prefetch only warms L2: they must be equal).
Run from the repository root with PYTHONPATH=<root>/core/src:<root>/plugins/attn_v100/src.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import torch

from volta_attn_v100 import bench, configs, ops

FP8 = "fp8_e5m2"
#: ``(query heads, batch, context)``, 8 KV heads.
SHAPES = (
    (32, 1, 8192),
    (64, 1, 8192),
    (32, 1, 1024),
    (64, 1, 1024),
    (32, 1, 32768),
    (32, 2, 8192),
    (32, 4, 8192),
    (64, 4, 8192),
    (32, 8, 8192),
    (32, 16, 8192),
)
#: ``PROBE_SHAPES=0,1,5`` times only those rows of :data:`SHAPES`.
PICK = [int(i) for i in os.environ.get("PROBE_SHAPES", "").split(",") if i]
#: ``PROBE_SECTORS=1``: one prefetch per 32-byte sector (the second call).
SECTORS = os.environ.get("PROBE_SECTORS") == "1"
#: ``(label, most keys prefetched)``; 0: no prefetch.
CAPS = (("off", 0), ("pf256", 256), ("pf512", 512), ("pf1024", 1024))
if SECTORS:
    CAPS = CAPS[:2]


def _sectors(*args, max_keys: int):
    """As :func:`configs.decode_prefetch`, one prefetch per 32-byte sector instead of line."""
    keys, lines = configs.decode_prefetch(*args, max_keys=max_keys)
    return keys, 4 * lines


@contextlib.contextmanager
def prefetch(max_keys: int):
    shipped = ops.decode_prefetch
    if max_keys == 0:
        ops.decode_prefetch = lambda *args: (0, 0)
    elif SECTORS:
        ops.decode_prefetch = functools.partial(_sectors, max_keys=max_keys)
    else:
        ops.decode_prefetch = functools.partial(configs.decode_prefetch, max_keys=max_keys)
    try:
        yield
    finally:
        ops.decode_prefetch = shipped


def main() -> int:
    copy_bw = bench.copy_bandwidth()
    props = torch.cuda.get_device_properties(0)
    print(
        torch.cuda.get_device_name(),
        torch.__version__,
        f"copy {copy_bw / 1e9:.0f} GB/s",
        f"L2 {props.L2_cache_size >> 20} MiB",
    )
    lines = []
    for heads, batch, ctx in [s for i, s in enumerate(SHAPES) if not PICK or i in PICK]:
        for dtype in ("float16", FP8):
            with prefetch(0):
                ref = bench._decode_output(batch, ctx, heads, 8, dtype, None)
            diff = 0.0
            for _, cap in CAPS[1:]:
                with prefetch(cap):
                    out = bench._decode_output(batch, ctx, heads, 8, dtype, None)
                diff = max(diff, bench._max_abs_diff(out, ref))
            best: dict[str, float] = {}
            for _ in range(2):
                for label, cap in CAPS:
                    with prefetch(cap):
                        row = bench.decode_case(batch, ctx, heads, 8, dtype, copy_bw)
                    us = row["ms"] * 1e3
                    best[label] = min(best.get(label, float("inf")), us)
                    print(
                        f"{heads}/8 {batch} x {ctx} {dtype} {label}: {us:.2f} us "
                        f"({100 * row['fraction_of_copy']:.1f}%)",
                        flush=True,
                    )
            off = best["off"]
            cells = " | ".join(f"{k} {best[k]:7.2f} ({best[k] / off:.3f})" for k, _ in CAPS[1:])
            shape = f"{heads}/8 {batch:>2} x {ctx:<6} {dtype:<8}"
            lines.append(f"{shape} off {off:7.2f} | {cells} | diff {diff:.1e}")
    print("\n== us, best of two alternating runs (x no prefetch)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
