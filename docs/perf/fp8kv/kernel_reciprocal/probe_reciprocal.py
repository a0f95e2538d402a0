"""A/B of the cache write's reciprocal scales, on one GPU in one process, alternating rounds.

A: the kernel before (old_cache_write.py, HEAD of 2026-11-27) given reciprocals made once;
B: the same kernel given reciprocals made at every call with torch.reciprocal (what a host writer
   handed the layer's scale tensors must do with it, as attn_v100's own write did);
C: the kernel now (IEEE division of the loaded scale, once per program), given the scales;
D: C with the scales' load and division moved to the program's start (hoisted_cache_write.py).
Each case: median time per call inside one CUDA graph (volta_devkit.bench.time_cuda_graph),
e5m2, per-head scales, 8 KV heads x 128, four rotating input sets; codes compared A == C.

Run as README.md beside this file says (on an H100, from this folder).
"""

import torch
from hoisted_cache_write import cache_write_kernel as hoisted_kernel
from old_cache_write import cache_write_kernel as old_kernel

from volta_devkit.bench import time_cuda_graph
from volta_fp8kv import configs
from volta_fp8kv.kernels.cache_write import cache_write_kernel as new_kernel

HEADS, D, BS = 8, 128, 16


def inputs(tokens, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    blocks = max(tokens // BS, 1) * 2
    key = torch.randn(tokens, HEADS, D, device="cuda", generator=gen).half()
    value = torch.randn(tokens, HEADS, D, device="cuda", generator=gen).half()
    slots = torch.randperm(blocks * BS, device="cuda", generator=gen)[:tokens]
    cache = torch.zeros(blocks, HEADS, BS, 2 * D, dtype=torch.uint8, device="cuda")
    k = torch.linspace(0.5, 2.0, HEADS, device="cuda")
    v = torch.linspace(0.25, 1.0, HEADS, device="cuda")
    return key, value, cache, slots, k, v


def launch(kernel, key, value, cache, slots, ks, vs):
    tokens = key.shape[0]
    block_t, warps = configs.tile((9, 0), D)
    kernel[(-(-tokens // block_t), HEADS)](
        key, value, cache, slots, ks, vs, tokens, cache.shape[0] * BS, BS, D, D,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2), 1,
        FMT=1, HEAD_PAD=D, FULL=True, BLOCK_T=block_t, num_warps=warps, num_stages=1,
    )


def case_a(key, value, cache, slots, k, v, k_inv, v_inv):
    launch(old_kernel, key, value, cache, slots, k_inv, v_inv)


def case_b(key, value, cache, slots, k, v, k_inv, v_inv):
    launch(old_kernel, key, value, cache, slots, torch.reciprocal(k), torch.reciprocal(v))


def case_c(key, value, cache, slots, k, v, k_inv, v_inv):
    launch(new_kernel, key, value, cache, slots, k, v)


def case_d(key, value, cache, slots, k, v, k_inv, v_inv):
    launch(hoisted_kernel, key, value, cache, slots, k, v)


for tokens in (64, 8192):
    sets = []
    for s in range(4):
        key, value, cache, slots, k, v = inputs(tokens, s)
        sets.append((key, value, cache, slots, k, v, torch.reciprocal(k), torch.reciprocal(v)))
    a_cache = sets[0][2]
    case_a(*sets[0])
    a_codes = a_cache.clone()
    a_cache.zero_()
    case_c(*sets[0])
    assert torch.equal(a_codes, a_cache), "codes differ between A and C"
    a_cache.zero_()
    case_d(*sets[0])
    assert torch.equal(a_codes, a_cache), "codes differ between A and D"
    rows = {"A": [], "B": [], "C": [], "D": []}
    for _ in range(3):
        for name, fn in (("A", case_a), ("B", case_b), ("C", case_c), ("D", case_d)):
            rows[name].append(time_cuda_graph(fn, sets).median_ms * 1e3)
    for name, times in rows.items():
        print(f"tokens {tokens:5d} case {name}: " + " ".join(f"{t:7.2f}" for t in times) + " us")
