"""Run 15 call 3: the dense split-K dot tile's two reductions against each other.

For every benchmark shape, int4 group 128, both symmetries and M in 2..32, the table's launch
is timed as shipped, with the tree forced and with atomics forced, alternating twice, each
checked against ``x @ dequant(W).T`` first; fp16 cuBLAS beside them. Calls 4 and 6 ran it
when the choice was ``Launch.atomic_steps`` (atomic where a split ran at most 4 input steps;
the tree as ``atomic_steps=0``, atomics as ``10**6``); call 6 showed atomics as fast or faster
everywhere, and the field became the boolean ``Launch.atomic`` (this file since).
Run from the repository root with PYTHONPATH=core/src:plugins/ct_wna16/src.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from volta_core.kernels.bench import time_cuda_graph
from volta_ct_wna16 import configs
from volta_ct_wna16.bench import SHAPES, weights
from volta_ct_wna16.ops import dequantize_dense, wna16_linear

MS = (2, 4, 8, 16, 32)
REPLAYS = 7


def timed(x, pws, outs, launch) -> float:
    return (
        time_cuda_graph(
            lambda i: wna16_linear(x, pws[i], launch=launch, out=outs[i % 2]),
            [(i,) for i in range(len(pws))],
            replays=REPLAYS,
        ).median_ms
        * 1e3
    )


def layer_lines(n: int, k: int, sym: bool, sms: int) -> list[str]:
    pws = weights(n, k, sym, max(2, min(8, -(-(256 << 20) // (n * k // 2)))))
    dense = [dequantize_dense(p, torch.float16).t().contiguous() for p in pws[:2]]
    cap = torch.cuda.get_device_capability()
    lines = []
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(2)]
        shipped = configs.choose(m, n, cap, 4)
        variants = {
            "shipped": shipped,
            "tree": replace(shipped, atomic=False),
            "atomic": replace(shipped, atomic=True),
        }
        ref = x @ dense[0].t()
        for name, ln in variants.items():
            got = wna16_linear(x, pws[0], launch=ln)
            err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            assert err < 1e-2, (n, k, sym, m, name, err)
        fp16 = (
            time_cuda_graph(
                lambda i, x=x, outs=outs: torch.matmul(x, dense[i].t(), out=outs[i]),
                [(0,), (1,)],
                replays=REPLAYS,
            ).median_ms
            * 1e3
        )
        times = {name: [] for name in variants}
        for _ in range(2):
            for name, ln in variants.items():
                times[name].append(timed(x, pws, outs, ln))
        splits, per = configs.split_count(n, k, shipped, sms)
        steps = per // shipped.block_k
        atomic = shipped.atomic and splits > 1
        line = (
            f"{n:>6}x{k:<6}{'y' if sym else 'n':>2}{m:>4} splits {splits:>3} x {steps:>3} steps"
            f"  {'atomic' if atomic else 'tree':>6}  "
            + "  ".join(
                f"{name} {min(t):6.1f} ({fp16 / min(t):4.2f}x)" for name, t in times.items()
            )
            + f"  fp16 {fp16:6.1f}"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def main() -> int:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), flush=True)
    lines = []
    for n, k in SHAPES:
        for sym in (True, False):
            lines += layer_lines(n, k, sym, sms)
            torch.cuda.empty_cache()
    print("\n== us (x fp16), best of two alternating runs; 'shipped' is the table's choice")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
