"""Probe (H100, one call): fp8_e5m2 decode tiles and split policies where the grid is small.

The shipped fp8 decode on SM80+ takes 128 keys per tile on 4 warps (255 registers at sm_90,
2 programs per SM) and the 2-per-SM split policy, chosen where decode is bandwidth-bound
(64 x 8K, 32 x 16K). At 1-16 sequences the fp8 step is 0.63-0.96x the fp16 one (1.2x at 1 x 1K),
where the fixed work of short partitions weighs more. For each shape (32/8 heads, head 128,
block 16) this times the shipped fp16 decode, the shipped fp8 decode, and fp8 with 64-key
tiles (fewer registers: more programs per SM) under the 2-, 3- and 4-per-SM split policies,
with the narrow and the wide combine; every variant's output on the first input set is
compared with the shipped fp8 output on the same set. Timing as the benchmark's
(``volta_attn_v100.bench.decode_case``: one CUDA graph, rotating input copies).
Run from the repository root with PYTHONPATH=core/src:plugins/attn_v100/src.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch

from volta_attn_v100 import bench, ops
from volta_attn_v100.configs import SplitPolicy, Tiles

SHAPES = ((1, 1024), (1, 8192), (1, 32768), (4, 8192), (8, 8192), (16, 8192))
TILES = {"128k": None, "64k": Tiles(16, 64, 4, 2), "64k3s": Tiles(16, 64, 4, 3)}
POLICIES = {"2/SM": None, "3/SM": SplitPolicy(3), "4/SM": SplitPolicy(4)}


@contextmanager
def wide(on: bool):
    """The launcher takes the wide combine for every launch (``on``) or as shipped."""
    shipped = ops.wide_combine
    if on:
        ops.wide_combine = lambda *args: True
    try:
        yield
    finally:
        ops.wide_combine = shipped


def main() -> int:
    copy_bw = bench.copy_bandwidth()
    print(torch.cuda.get_device_name(), torch.__version__, f"copy {copy_bw / 1e9:.0f} GB/s")
    lines = []
    for batch, ctx in SHAPES:
        fp16 = bench.decode_case(batch, ctx, 32, 8, "float16", copy_bw)["ms"] * 1e3
        ref = bench._decode_output(batch, ctx, 32, 8, "fp8_e5m2", None)
        cells = []
        for tname, tiles in TILES.items():
            for pname, policy in POLICIES.items():
                for wide_on in (False, True):
                    if tiles is None and wide_on:
                        continue  # 255 registers and more spills with it (README)
                    with bench._launcher_tiles(decode=tiles), wide(wide_on):
                        out = bench._decode_output(batch, ctx, 32, 8, "fp8_e5m2", policy)
                        row = bench.decode_case(batch, ctx, 32, 8, "fp8_e5m2", copy_bw, policy)
                    diff = bench._max_abs_diff(out, ref)
                    assert diff < 2e-3, (batch, ctx, tname, pname, wide_on, diff)
                    us = row["ms"] * 1e3
                    name = f"{tname} {pname}{' wide' if wide_on else ''} [{row['splits']}]"
                    cells.append(f"{name} {us:.1f} ({us / fp16:.2f}x)")
                    print(f"{batch} x {ctx}: {cells[-1]}", flush=True)
        lines.append(f"{batch:>3} x {ctx:<6} fp16 {fp16:7.1f} us | " + " | ".join(cells))
    print("\n== fp8 us (x fp16 time), [partitions]; first = shipped")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
