"""Probe (not shipped): fused-MoE tiles at 1-1024 tokens on the Qwen3-30B-A3B layer shape
(the two ``moe_linear`` calls only, each tile's output checked against the first tile's),
then the previous commit's MoE paths on the same layer (a copy of its package in
``bench-results/scratch/volta_ct_wna16_old``): every expert on every token inside a CUDA graph
(its captured path) and the routed per-expert loop timed eagerly (its host sync forbids
capture), beside the fused step eagerly.

Call 1 ran the first version of this file (commit 4d603a3: caller-allocated outputs, tiles
dequantized into input order, no split); call 2 this one, on one dot per word slot and
split decode tiles."""

import sys

import torch

from volta_core.kernels.bench import time_cuda_graph
from volta_ct_wna16 import bench_moe, configs, ops
from volta_ct_wna16.experts import experts_forward
from volta_ct_wna16.routing import route

sys.path.insert(0, "bench-results/scratch")
from volta_ct_wna16_old.experts import experts_forward as old_forward

NAME = "Qwen3-30B-A3B"
SMALL = (
    (16, 64, 128, 4, 3, 4),
    (16, 64, 128, 4, 3, 8),
    (16, 64, 128, 4, 4, 4),
    (16, 32, 128, 4, 3, 4),
    (16, 32, 128, 2, 3, 8),
    (16, 128, 128, 4, 3, 4),
    (16, 64, 256, 4, 3, 4),
    (16, 64, 128, 2, 3, 4),
    (16, 64, 128, 8, 3, 4),
)
LARGE = (
    (32, 64, 128, 4, 3, 4),
    (64, 128, 64, 4, 3, 4),
    (64, 128, 128, 4, 3, 4),
    (64, 128, 128, 8, 3, 4),
    (64, 64, 128, 4, 3, 4),
    (128, 128, 64, 8, 3, 4),
)


def tile(bm, bn, bk, w, st, p):
    return configs.Launch(
        configs.MOE, bm, bn, bk, True, num_warps=w, programs_per_sm=p, num_stages=st
    )


def label(ln):
    return (
        f"m{ln.block_m}n{ln.block_n}k{ln.block_k}w{ln.num_warps}s{ln.num_stages}"
        f"p{ln.programs_per_sm}"
    )


def run_tiles(weights, sets, x, act, top_k, ebytes, distinct, tiles, tag):
    experts = weights.num_experts
    ref = None
    for ln in tiles:
        blocks = [route(i.reshape(-1), experts, ln.block_m) for _, i in sets]

        def k(i, ln=ln, blocks=blocks):
            h = ops.moe_linear(x, weights.w13, blocks[i], ln, top_k)
            y = ops.moe_linear(act, weights.w2, blocks[i], ln, 1, sets[i][0].reshape(-1), True)
            return h, y

        try:
            h, y = k(0)
            torch.cuda.synchronize()
        except Exception as e:
            print(f"{tag} {label(ln)} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        h = h.float()
        if ref is None:
            ref = (h, y)
        err = max(
            ((h - ref[0]).abs().max() / ref[0].abs().max()).item(),
            ((y - ref[1]).abs().max() / ref[1].abs().max()).item(),
        )
        t = time_cuda_graph(k, [(i,) for i in range(len(sets))], replays=5).median_ms * 1e3
        gbps = distinct * ebytes / t / 1e3
        print(f"tile {tag} {label(ln):<22} {t:8.1f} us {gbps:7.0f} GB/s err {err:.1e}", flush=True)


def old_paths(weights, top_k, gen):
    experts, hidden = weights.num_experts, weights.hidden
    for m in (1, 16):
        sets = bench_moe.routings(m, experts, top_k, 4, gen)
        x = torch.randn(m, hidden, device="cuda", dtype=torch.float16)

        def every(w, i, x=x):
            return old_forward(x, w, i, weights, every_expert=True)

        t = time_cuda_graph(every, sets, replays=3).median_ms * 1e3
        print(f"old every-expert graph M={m}: {t:.1f} us", flush=True)
    for m in (1, 16, 256):
        sets = bench_moe.routings(m, experts, top_k, 8, gen)
        x = torch.randn(m, hidden, device="cuda", dtype=torch.float16)
        for tag, fn in (("old routed", old_forward), ("new fused", experts_forward)):
            for w, i in sets[:2]:
                fn(x, w, i, weights)
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for w, i in sets:
                fn(x, w, i, weights)
            b.record()
            torch.cuda.synchronize()
            print(f"{tag} eager M={m}: {a.elapsed_time(b) / len(sets) * 1e3:.1f} us", flush=True)


def main():
    experts, top_k, hidden, inter = bench_moe.MODELS[NAME]
    for sym in (True, False):
        weights = bench_moe.stack(experts, hidden, inter, sym)
        ebytes = (weights.w13.nbytes() + weights.w2.nbytes()) / experts
        gen = torch.Generator().manual_seed(1)
        for m in (1, 4, 16, 64, 256, 1024):
            sets = bench_moe.routings(m, experts, top_k, 24 if m < 64 else 4, gen)
            distinct = sum(int(i.unique().numel()) for _, i in sets) / len(sets)
            x = torch.randn(m, hidden, device="cuda", dtype=torch.float16)
            act = torch.randn(m * top_k, inter, device="cuda", dtype=torch.float16)
            tiles = [tile(*t) for t in (SMALL if m <= 16 else ()) + (LARGE if m >= 16 else ())]
            shipped = configs.choose_moe(m * top_k, experts, torch.cuda.get_device_capability())
            tiles = [shipped] + [t for t in tiles if t != shipped]
            tag = f"sym={sym} M={m:<5}"
            run_tiles(weights, sets, x, act, top_k, ebytes, distinct, tiles, tag)
        if sym:
            old_paths(weights, top_k, gen)


if __name__ == "__main__":
    main()
