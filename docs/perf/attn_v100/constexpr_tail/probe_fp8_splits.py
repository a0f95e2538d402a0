"""Probe (H100): the partition count of fp8 decode at 2 to 8 sequences x 8K, adopted kernel.

fp8 e5m2 at 2, 4 and 8 sequences x 8K (head size 128, block 16, 32/8 and 64/8 heads), the
partition count forced to each of ``SPLITS`` (a ``SplitPolicy`` whose only bound is the
count), beside fp16 as the split policy launches it; the benchmark's timing
(``bench.decode_case``), best of two alternating runs; fp8 time over the fp16 time.

Run from the repository root: PYTHONPATH=<root>/core/src:<root>/plugins/attn_v100/src python3
docs/perf/attn_v100/constexpr_tail/probe_fp8_splits.py
"""

from __future__ import annotations

import torch
import triton

from volta_attn_v100 import bench
from volta_attn_v100.configs import SplitPolicy

SPLITS = (2, 3, 4, 6, 8, 12, 16)
BATCHES = (2, 4, 8)
CONTEXT = 8192


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    copy_bw = bench.copy_bandwidth()
    fp16: dict[tuple, float] = {}
    fp8: dict[tuple, tuple[float, int]] = {}
    for _ in range(2):
        for batch in BATCHES:
            for heads, kv in ((32, 8), (64, 8)):
                r = bench.decode_case(batch, CONTEXT, heads, kv, "float16", copy_bw)
                key = (batch, heads)
                fp16[key] = min(fp16.get(key, float("inf")), r["ms"] * 1e3)
                for splits in SPLITS:
                    policy = SplitPolicy(
                        programs_per_sm=64, min_keys_per_split=1, max_splits=splits
                    )
                    r = bench.decode_case(batch, CONTEXT, heads, kv, "fp8_e5m2", copy_bw, policy)
                    k8 = (batch, heads, r["splits"])
                    if k8 not in fp8 or r["ms"] * 1e3 < fp8[k8][0]:
                        fp8[k8] = (r["ms"] * 1e3, r["splits"])
    default = {
        (b, h): bench.default_num_splits(b, 8, CONTEXT, "cuda", "fp8_e5m2")
        for b in BATCHES
        for h in (32, 64)
    }
    print("batch x 8K | heads | fp16 us | fp8 partitions | fp8 us | fp8 / fp16 | shipped count")
    for (batch, heads, splits), (us, _) in sorted(fp8.items()):
        base = fp16[(batch, heads)]
        mark = "*" if default[(batch, heads)] == splits else ""
        print(f"{batch} | {heads}/8 | {base:.1f} | {splits} | {us:.1f} | {us / base:.3f} | {mark}")


if __name__ == "__main__":
    main()
