# Nsight Compute probe of call 13 (docs/perf/ct_wna16/moe_decode/README.md): the one-launch step
# on the Qwen3.5-35B-A3B layer, three launches (ncu profiles the third). argv: block_j block_k
# block_n warps stages, the plugin folder of the tree under test, tokens (default 1).
import sys
sys.path.insert(0, sys.argv[6] + "/benchmarks")
sys.path.insert(0, sys.argv[6] + "/tests")
import torch
from ct_wna16_moe_bench import routings, stack
from volta_ct_wna16 import ops
from volta_ct_wna16.launch import MoEFused
f = MoEFused(*map(int, sys.argv[1:6]))
m = int(sys.argv[7]) if len(sys.argv) > 7 else 1
w = stack(256, 2048, 512, True)
sets = routings(m, 256, 8, 4, torch.Generator().manual_seed(0))
x = torch.randn(m, 2048, device="cuda", dtype=torch.float16)
for i in range(3):
    _, wt, ids = sets[i]
    ops.moe_decode(x, w.w13, w.w2, wt, ids, f)
torch.cuda.synchronize()
