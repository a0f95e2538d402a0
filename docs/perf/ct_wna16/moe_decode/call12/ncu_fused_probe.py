# Nsight Compute probe of call 12 (docs/perf/ct_wna16/moe_decode/README.md): the SM90 table's
# one-launch decode step at one token on the Qwen3.5-35B-A3B layer, three launches (ncu profiles
# the third). Run from the repository root with PYTHONPATH as gpu_moe.sh sets; run it against
# the committed tree and against the commit before to compare the two builds.
import sys

sys.path.insert(0, "plugins/ct_wna16/benchmarks")
sys.path.insert(0, "plugins/ct_wna16/tests")
import torch
from ct_wna16_moe_bench import routings, stack

from volta_ct_wna16 import ops
from volta_ct_wna16.tables import choose_moe_decode

w = stack(256, 2048, 512, True)
sets = routings(1, 256, 8, 4, torch.Generator().manual_seed(0))
x = torch.randn(1, 2048, device="cuda", dtype=torch.float16)
for i in range(3):
    _, wt, ids = sets[i]
    ops.moe_decode(x, w.w13, w.w2, wt, ids, choose_moe_decode(1, (9, 0)))
torch.cuda.synchronize()
