"""Probe (H100): the partition count of batch-1 decode on the adopted kernel.

For 1 x 8K and 1 x 32K (head size 128, block 16, 32/8 and 64/8 heads, fp16 and fp8_e5m2),
the benchmark's timing (``bench.decode_case``: one CUDA graph, rotating inputs past L2) with
the partition count forced to each of ``SPLITS`` (a ``SplitPolicy`` whose only bound is the
count), best of two alternating runs, % of copy bandwidth for fp16.

Run from the repository root: PYTHONPATH=<root>/core/src:<root>/plugins/attn_v100/src python3
docs/perf/attn_v100/constexpr_tail/probe_splits.py
"""

from __future__ import annotations

import torch
import triton

from volta_attn_v100 import bench
from volta_attn_v100.configs import SplitPolicy

SPLITS = (16, 24, 32, 40, 48, 64)
SHAPES = ((1, 8192), (1, 32768))


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    copy_bw = bench.copy_bandwidth()
    best: dict[tuple, dict] = {}
    for _ in range(2):
        for (batch, ctx), (heads, kv), kv_dtype, splits in (
            (shape, hk, dt, s)
            for shape in SHAPES
            for hk in ((32, 8), (64, 8))
            for dt in ("float16", "fp8_e5m2")
            for s in SPLITS
        ):
            policy = SplitPolicy(programs_per_sm=64, min_keys_per_split=1, max_splits=splits)
            r = bench.decode_case(batch, ctx, heads, kv, kv_dtype, copy_bw, policy)
            key = (batch, ctx, f"{heads}/{kv}", kv_dtype, r["splits"])
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
    print("shape | heads | kv | partitions | us | % of copy")
    for (batch, ctx, heads, kv_dtype, splits), r in best.items():
        print(
            f"{batch} x {ctx} | {heads} | {kv_dtype} | {splits} | {r['ms'] * 1e3:.2f} | "
            f"{100 * r['fraction_of_copy']:.1f}%"
        )


if __name__ == "__main__":
    main()
