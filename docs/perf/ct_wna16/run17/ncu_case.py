"""One ct_wna16 layer call for Nsight Compute: ``python ncu_case.py N K M [sym|asym]``.

Makes the library-written checkpoint of the benchmark (group 128, 4 bits), then calls the
shipped launcher three times on fresh activations; run under ``ncu -k regex:wna16 -s 2 -c 1``
the third launch is profiled (the first compiles, the second warms). Run from the repository
root with PYTHONPATH=core/src:plugins/ct_wna16/src.
"""

from __future__ import annotations

import sys

import torch

from volta_ct_wna16 import bench, configs, ops


def main() -> int:
    n, k, m = (int(a) for a in sys.argv[1:4])
    symmetric = sys.argv[4] != "asym" if len(sys.argv) > 4 else True
    (pw,) = bench.weights(n, k, symmetric, 1)
    capability, sm_count = ops.device_facts(torch.empty(0, device="cuda"))
    launch = configs.choose(m, n, capability, pw.bits, k=k)
    splitk = launch.path == configs.SPLITK
    splits = configs.split_count(n, k, launch, sm_count, m) if splitk else None
    print(f"{n}x{k} M={m} sym={symmetric}: {launch} splits={splits}", flush=True)
    for _ in range(3):
        x = torch.randn(m, k, dtype=torch.float16, device="cuda")
        ops.wna16_linear(x, pw)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
