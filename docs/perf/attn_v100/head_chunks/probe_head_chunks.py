"""Probe (H100): a head group split over programs at small batches.

At one or a few sequences the decode launch's last program combines every partition of the
rows it owns: 8 rows x 32 partitions x 128 floats at 64/8 heads, twice 32/8's. This probe
gives each program a share of its KV head's query heads (``heads per program``, a
``head chunk`` each, as the launcher already does for head groups over 16) so that the
combine covers fewer rows, and with fewer partitions the grid stays one wave; every chunk
reads its KV head's tiles, the second through L2.

The launcher's two lines are patched in-process (no code change): the heads per program
capped at ``PROBE["hpp"]``, and the combine's rows taken from the heads a program owns (the
same value as the shipped ``group_pad * kv_per_prog`` wherever the cap is off). Each variant's
output is compared with the shipped launch's on the same inputs before it is timed.

Timing is the benchmark's (``bench.decode_case``: one CUDA graph, rotating inputs past L2),
best of two alternating rounds.

Run from the repository root: PYTHONPATH=<root>/core/src:<root>/plugins/attn_v100/src python3
docs/perf/attn_v100/head_chunks/probe_head_chunks.py
"""

from __future__ import annotations

import inspect
import math

import torch
import triton

from volta_attn_v100 import bench, ops
from volta_attn_v100.configs import SplitPolicy

PROBE: dict[str, int | None] = {"hpp": None}
SHAPES = ((1, 1024), (1, 8192), (1, 32768), (2, 8192), (4, 8192))
HEADS = ((32, 8), (64, 8))
DTYPES = ("float16", "fp8_e5m2")
FORCED = (None, 8, 16, 24, 32)


def patch_launcher() -> None:
    src = inspect.getsource(ops._launch_decode)
    old_hpp = "heads_per_prog = min(a.group_pad, tiles.block_m // q_pad)"
    old_rows = "tiles.block_m, q_pad, a.group_pad * kv_per_prog, head_size, capability, wide"
    if old_hpp not in src or old_rows not in src:
        raise RuntimeError("the launcher's lines moved; update the probe")
    src = src.replace(old_hpp, old_hpp[:-1] + ', PROBE["hpp"] or 1 << 30)')
    src = src.replace(old_rows, "tiles.block_m, q_pad, heads_per_prog, head_size, capability, wide")
    ops.PROBE = PROBE
    exec(compile(src, ops.__file__, "exec"), ops.__dict__)


def variants(group: int) -> list[tuple[int | None, int | None]]:
    out: list[tuple[int | None, int | None]] = [(None, None)]
    hpp = group // 2
    while hpp >= 2:
        out += [(hpp, s) for s in FORCED]
        hpp //= 2
    return out


def policy(splits: int | None) -> SplitPolicy | None:
    if splits is None:
        return None
    return SplitPolicy(programs_per_sm=64, min_keys_per_split=1, max_splits=splits)


def check(batch, ctx, heads, kv, dtype, hpp, splits) -> float:
    torch.manual_seed(7)
    q, cache, table, lens, start = bench.make_decode_inputs(batch, ctx, heads, kv, dtype)
    outs = []
    for cap, pol in ((None, None), (hpp, policy(splits))):
        PROBE["hpp"] = cap
        out = torch.full_like(q, float("nan"))
        bench.decode_call(ctx, dtype, out, pol)(q, cache, table, lens, start)
        outs.append(out.float())
    PROBE["hpp"] = None
    return (outs[0] - outs[1]).abs().max().item()


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    patch_launcher()
    copy_bw = bench.copy_bandwidth()
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    cases = [
        (shape, hk, dt, v)
        for shape in SHAPES
        for hk in HEADS
        for dt in DTYPES
        for v in variants(hk[0] // hk[1])
    ]
    worst = 0.0
    for (batch, ctx), (heads, kv), dt, (hpp, splits) in cases:
        if hpp is not None:
            diff = check(batch, ctx, heads, kv, dt, hpp, splits)
            if not diff < 2e-2:  # NaN fails too
                raise RuntimeError(f"{(batch, ctx, heads, dt, hpp, splits)} differs by {diff}")
            worst = max(worst, diff)
    print(f"every variant agrees with the shipped launch within {worst:.2e}", flush=True)
    best: dict[tuple, float] = {}
    for rnd in range(2):
        for (batch, ctx), (heads, kv), dt, (hpp, splits) in cases if rnd == 0 else cases[::-1]:
            PROBE["hpp"] = hpp
            r = bench.decode_case(batch, ctx, heads, kv, dt, copy_bw, policy(splits))
            key = (batch, ctx, f"{heads}/{kv}", dt, hpp or heads // kv, splits or "policy")
            best[key] = min(best.get(key, math.inf), r["ms"] * 1e3)
        print(f"round {rnd} done", flush=True)
    PROBE["hpp"] = None
    print("shape | heads | kv | heads per program | partitions | us | x shipped")
    shipped = {}
    for key, us in best.items():
        batch, ctx, hk, dt, hpp, splits = key
        if splits == "policy" and hpp == int(hk.split("/")[0]) // int(hk.split("/")[1]):
            shipped[(batch, ctx, hk, dt)] = us
    for key, us in best.items():
        batch, ctx, hk, dt, hpp, splits = key
        ref = shipped[(batch, ctx, hk, dt)]
        print(f"{batch} x {ctx} | {hk} | {dt} | {hpp} | {splits} | {us:.2f} | {us / ref:.3f}")


if __name__ == "__main__":
    main()
