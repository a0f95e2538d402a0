"""Eager decode launches of one shape with the shipped or the V^T package, for ncu (probe)."""

import importlib
import sys

import torch

pkg = sys.argv[4]
bench = importlib.import_module(f"{pkg}.bench")
batch, ctx, kv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
inputs = bench.make_decode_inputs(batch, ctx, 32, 8, kv)
out = torch.empty_like(inputs[0])
run = bench.decode_call(ctx, kv, out)
for _ in range(4):
    run(*inputs)
torch.cuda.synchronize()
