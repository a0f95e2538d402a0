"""Probe (H100): the two masked-loop forms where the partitions hold 4096 keys or a little less.

The adopted rule (``configs.one_stage_tail``) gives split launches with partitions of at most
4096 keys the one-stage masked loop; fp8 partitions of exactly 4096 keys also take scores
ahead. Here each shape is timed with the form forced either way (``ops.one_stage_tail``
replaced), in one CUDA graph with rotating inputs (``bench.decode_case``), best of two
alternating runs. Head size 512 (32/16 heads) is the Gemma-4 global layer of the benchmark.

Run from the repository root: PYTHONPATH=<root>/core/src:<root>/plugins/attn_v100/src python3
docs/perf/attn_v100/constexpr_tail/probe_tail_where.py
"""

from __future__ import annotations

import torch
import triton

from volta_attn_v100 import bench, ops

#: (head size, heads, KV heads, batch, context, KV dtype)
SHAPES = (
    (512, 32, 16, 16, 8192, "fp8_e5m2"),
    (512, 32, 16, 4, 8192, "fp8_e5m2"),
    (512, 32, 16, 4, 8192, "float16"),
    (128, 32, 8, 16, 8192, "fp8_e5m2"),
    (128, 64, 8, 16, 8192, "fp8_e5m2"),
    (128, 32, 8, 16, 8192, "float16"),
    (128, 32, 8, 8, 8192, "fp8_e5m2"),
)


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    copy_bw = bench.copy_bandwidth()
    rule = ops.one_stage_tail
    best: dict[tuple, float] = {}
    for _ in range(2):
        for shape in SHAPES:
            head, heads, kv, batch, ctx, kv_dtype = shape
            for tail in (False, True):
                ops.one_stage_tail = lambda *args, tail=tail: tail
                r = bench.decode_case(batch, ctx, heads, kv, kv_dtype, copy_bw, head_size=head)
                key = (*shape, r["splits"], tail)
                best[key] = min(best.get(key, float("inf")), r["ms"] * 1e3)
    ops.one_stage_tail = rule
    print("head | heads | batch x context | kv | partitions | pipelined us | one stage us | ratio")
    for key, us in best.items():
        if key[-1]:
            continue
        one = best[(*key[:-1], True)]
        head, heads, kv, batch, ctx, kv_dtype, splits = key[:-1]
        print(
            f"{head} | {heads}/{kv} | {batch} x {ctx} | {kv_dtype} | {splits} | {us:.1f} | "
            f"{one:.1f} | {one / us:.3f}"
        )


if __name__ == "__main__":
    main()
