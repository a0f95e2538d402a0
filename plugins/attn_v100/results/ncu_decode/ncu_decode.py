"""Run a few eager decode launches of one shape, for ncu (not shipped code)."""
import sys
import torch
from volta_attn_v100 import bench
batch, ctx, kv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
inputs = bench.make_decode_inputs(batch, ctx, 32, 8, kv)
out = torch.empty_like(inputs[0])
run = bench.decode_call(ctx, kv, out)
for _ in range(4):
    run(*inputs)
torch.cuda.synchronize()
