"""One launch of the CUDA step and one of the shipped Triton step (one token, Qwen3.5 layer),
for Nsight Compute."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

root = Path(__file__).resolve().parents[5]
sys.path[:0] = [str(root / "plugins/ct_wna16/benchmarks"), str(root / "plugins/ct_wna16/tests")]

from ct_wna16_moe_bench import MODELS, routings, stack  # noqa: E402
from probe_cuda import build, run_cuda  # noqa: E402

from volta_ct_wna16 import ops  # noqa: E402
from volta_ct_wna16.tables import choose_moe_decode  # noqa: E402

experts, top_k, hidden, inter = MODELS["Qwen3.5-35B-A3B"]
wts = stack(experts, hidden, inter, True)
_, w, ids = routings(1, experts, top_k, 1, torch.Generator().manual_seed(2))[0]
x = torch.randn(1, hidden, device="cuda", dtype=torch.float16)
kern = build(False, 32, 16, 4)
out = torch.empty(1, hidden, device="cuda", dtype=torch.float16)
for _ in range(2):
    run_cuda(kern, 32, 16, x, wts, w, ids, out)
    ops.moe_decode(x, wts.w13, wts.w2, w, ids, choose_moe_decode(1, (9, 0)))
torch.cuda.synchronize()
