"""Probe: fp8/fp16 decode tiles at head 512 on the H100 (not shipped code)."""
import sys
import torch
from volta_attn_v100 import bench, ops
from volta_attn_v100.configs import Tiles

copy_bw = bench.copy_bandwidth()
print(f"copy {copy_bw/1e9:.0f} GB/s", flush=True)
variants = [None, Tiles(16, 16, 8, 2), Tiles(16, 64, 8, 2), Tiles(16, 32, 4, 2), Tiles(16, 32, 8, 3), Tiles(16, 64, 8, 3), Tiles(16, 64, 16, 2)]
for halves in (False, True):
    shipped_halves = ops.head_halves
    if halves:
        ops.head_halves = lambda fp8, cap, hs: fp8
    for kv in ("fp8_e5m2", "float16"):
        if halves and kv == "float16":
            continue
        for t in variants:
            if halves and t is not None and t.num_warps == 16:
                continue
            for batch, ctx in ((1, 8192), (16, 8192)):
                try:
                    with bench._launcher_tiles(decode=t):
                        r = bench.decode_case(batch, ctx, 32, 16, kv, copy_bw, head_size=512)
                    print(f"halves={halves} {kv:9s} {str(t):55s} {batch}x{ctx} {r['ms']*1e3:8.1f} us {100*r['fraction_of_copy']:5.1f}%", flush=True)
                except Exception as e:
                    print(f"halves={halves} {kv} {t} {batch}x{ctx} FAILED {type(e).__name__}: {str(e)[:100]}", flush=True)
    ops.head_halves = shipped_halves
