"""Probe (not shipped): fused-MoE tiles at 1-1024 tokens on the Qwen3-30B-A3B layer shape
(kernels only, each checked against the shipped tile's output first), then the previous
commit's MoE paths on the same layer (a copy of its package in
``bench-results/scratch/volta_ct_wna16_old``): every expert on every token inside a CUDA graph
(its captured path) and the routed per-expert loop timed eagerly (its host sync forbids
capture)."""

import sys

import torch

from volta_core.kernels.bench import time_cuda_graph
from volta_ct_wna16 import bench_moe, configs, ops
from volta_ct_wna16.routing import route

sys.path.insert(0, "bench-results/scratch")
from volta_ct_wna16_old.experts import experts_forward as old_forward

MOE = configs.MOE


def cand():
    out = []
    for bm, bn, bk, w, st in (
        (16, 64, 128, 4, 3),
        (16, 128, 128, 4, 3),
        (16, 64, 64, 4, 3),
        (16, 32, 128, 4, 3),
        (16, 64, 128, 4, 4),
        (16, 64, 128, 2, 3),
        (16, 128, 64, 4, 4),
        (32, 64, 128, 4, 3),
        (64, 128, 64, 4, 3),
        (64, 64, 64, 4, 3),
        (64, 128, 64, 8, 3),
        (64, 128, 128, 8, 3),
        (128, 128, 64, 8, 3),
        (64, 256, 64, 8, 3),
    ):
        out.append(configs.Launch(MOE, block_m=bm, block_n=bn, block_k=bk, use_dot=True,
                                  num_warps=w, num_stages=st))
    return out


def main():
    name = "Qwen3-30B-A3B"
    experts, top_k, hidden, inter = bench_moe.MODELS[name]
    for sym in (True, False):
        weights = bench_moe.stack(experts, hidden, inter, sym)
        ebytes = (weights.w13.nbytes() + weights.w2.nbytes()) / experts
        gen = torch.Generator().manual_seed(1)
        for m in (1, 4, 16, 64, 256, 1024):
            sets = bench_moe.routings(m, experts, top_k, 24 if m < 64 else 4, gen)
            distinct = sum(int(i.unique().numel()) for _, i in sets) / len(sets)
            x = torch.randn(m, hidden, device="cuda", dtype=torch.float16)
            act = torch.randn(m * top_k, inter, device="cuda", dtype=torch.float16)
            ref = None
            for ln in cand():
                if m * top_k <= experts * 2 and ln.block_m > 32:
                    continue
                if m * top_k > experts * 16 and ln.block_m < 32:
                    continue
                blocks = [route(i.reshape(-1), experts, ln.block_m) for _, i in sets]
                h = torch.full((m * top_k, 2 * inter), float("nan"), device="cuda").half()
                y = torch.zeros(m * top_k, hidden, device="cuda")

                def k(i, ln=ln, blocks=blocks, h=h, y=y):
                    ops.moe_linear(x, weights.w13, blocks[i], h, ln, top_k)
                    ops.moe_linear(act, weights.w2, blocks[i], y, ln, 1, sets[i][0].reshape(-1))

                try:
                    k(0)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    print(f"{sym} M={m} {ln} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                if ref is None:
                    ref = (h.clone(), y.clone())
                err = max(((h.float() - ref[0].float()).abs().max() / ref[0].float().abs().max()).item(),
                          ((y - ref[1]).abs().max() / ref[1].abs().max()).item())
                t = time_cuda_graph(k, [(i,) for i in range(len(sets))], replays=5).median_ms * 1e3
                print(f"tile sym={sym} M={m:<5} m{ln.block_m}n{ln.block_n}k{ln.block_k}w{ln.num_warps}s{ln.num_stages} "
                      f"{t:8.1f} us {distinct * ebytes / t / 1e3:7.0f} GB/s err {err:.1e}", flush=True)
        if not sym:
            continue
        for m in (1, 16):
            sets = bench_moe.routings(m, experts, top_k, 4, gen)
            x = torch.randn(m, hidden, device="cuda", dtype=torch.float16)
            t = time_cuda_graph(lambda w, i: old_forward(x, w, i, weights, every_expert=True),
                                sets, replays=3).median_ms * 1e3
            print(f"old every-expert graph M={m}: {t:.1f} us", flush=True)
        for m in (1, 16, 256):
            sets = bench_moe.routings(m, experts, top_k, 8, gen)
            x = torch.randn(m, hidden, device="cuda", dtype=torch.float16)
            for w, i in sets[:2]:
                old_forward(x, w, i, weights)
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for w, i in sets:
                old_forward(x, w, i, weights)
            b.record()
            torch.cuda.synchronize()
            print(f"old routed eager M={m}: {a.elapsed_time(b) / len(sets) * 1e3:.1f} us", flush=True)
            from volta_ct_wna16.experts import experts_forward
            for w, i in sets[:2]:
                experts_forward(x, w, i, weights)
            torch.cuda.synchronize()
            a.record()
            for w, i in sets:
                experts_forward(x, w, i, weights)
            b.record()
            torch.cuda.synchronize()
            print(f"new fused eager M={m}: {a.elapsed_time(b) / len(sets) * 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    main()
