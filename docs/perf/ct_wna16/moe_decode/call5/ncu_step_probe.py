# Nsight Compute probe of call 5 (docs/perf/ct_wna16/moe_decode/README.md): runs against commit
# 367b189, the only tree with the one-launch step (MoEStep, ops.moe_step); kept as the record.
import sys
sys.path.insert(0, "plugins/ct_wna16/benchmarks"); sys.path.insert(0, "plugins/ct_wna16/tests")
import torch
from ct_wna16_moe_bench import stack, routings
from volta_ct_wna16 import ops
from volta_ct_wna16.tables import MoEStep, choose_moe_decode
w = stack(256, 2048, 512, True)
gen = torch.Generator().manual_seed(0)
sets = routings(1, 256, 8, 4, gen)
x = torch.randn(1, 2048, device="cuda", dtype=torch.float16)
steps = [MoEStep(64, 256, 4096, 4), MoEStep(16, 256, 8192, 1)]
dec = choose_moe_decode(1, (9, 0))
for i in range(3):
    _, wt, ids = sets[i]
    for st in steps:
        ops.moe_step(x, w.w13, w.w2, wt, ids, st)
    ops.moe_decode(x, w.w13, w.w2, wt, ids, dec)
torch.cuda.synchronize()
