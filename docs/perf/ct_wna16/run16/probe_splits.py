"""Run 16 call 1: atomic split sums for the 1-token GEMV, and more splits once they are cheap.

Run 15 moved the 2-32-token dot tile's split sums from the reduction tree to atomic adds
(``Launch.atomic``); the 1-token GEMV kept the tree. Here, for every benchmark shape, int4
group 128, both symmetries:

* M=1: the table's GEMV (tree) against the same launch with atomic sums, at its programs per
  SM and at more (more splits: each is shorter, and atomics make the extra splits' sums cheap);
* M=2, 4, 16, 32: the table's dot tile (atomic, 2 programs per SM) against 3 and 4 per SM and
  a 128-output tile at 4 per SM.

Every variant is checked against ``x @ dequant(W).T`` first; times are best of two
alternating runs inside one CUDA graph (the benchmark's timing), fp16 cuBLAS beside them.
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

REPLAYS = 7


def variants(m: int, shipped: configs.Launch) -> dict[str, configs.Launch]:
    """The launches compared at ``m`` tokens, the shipped one first."""
    if m == 1:
        p = shipped.programs_per_sm
        return {
            "shipped": shipped,
            "tree": replace(shipped, atomic=False),
            f"at{p}": replace(shipped, atomic=True),
            f"at{p + 2}": replace(shipped, atomic=True, programs_per_sm=p + 2),
            f"at{2 * p}": replace(shipped, atomic=True, programs_per_sm=2 * p),
        }
    return {
        "shipped": shipped,
        "p3": replace(shipped, programs_per_sm=3),
        "p4": replace(shipped, programs_per_sm=4),
        "n128p4": replace(shipped, block_n=128, programs_per_sm=4),
    }


def timed(x, pws, outs, launch) -> float:
    return (
        time_cuda_graph(
            lambda i: wna16_linear(x, pws[i], launch=launch, out=outs[i % 2]),
            [(i,) for i in range(len(pws))],
            replays=REPLAYS,
        ).median_ms
        * 1e3
    )


def layer_lines(
    n: int, k: int, sym: bool, sms: int, ms: tuple[int, ...], variants=variants
) -> list[str]:
    pws = weights(n, k, sym, max(2, min(8, -(-(256 << 20) // (n * k // 2)))))
    dense = [dequantize_dense(p, torch.float16).t().contiguous() for p in pws[:2]]
    cap = torch.cuda.get_device_capability()
    lines = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(2)]
        shipped = configs.choose(m, n, cap, 4)
        vs = variants(m, shipped)
        ref = (x.double() @ dense[0].double().t()).float()
        for name, ln in vs.items():
            for _ in range(2):  # twice: the accumulators must be back at zero after the first
                got = wna16_linear(x, pws[0], launch=ln)
                err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
                assert err < 5e-3, (n, k, sym, m, name, err)
        fp16 = (
            time_cuda_graph(
                lambda i, x=x, outs=outs: torch.matmul(x, dense[i].t(), out=outs[i]),
                [(0,), (1,)],
                replays=REPLAYS,
            ).median_ms
            * 1e3
        )
        times: dict[str, list[float]] = {name: [] for name in vs}
        for _ in range(2):
            for name, ln in vs.items():
                times[name].append(timed(x, pws, outs, ln))
        line = (
            f"{n:>6}x{k:<6}{'y' if sym else 'n':>2}{m:>4}  "
            + "  ".join(
                f"{name}[{configs.split_count(n, k, vs[name], sms)[0]}] {min(t):6.1f}"
                f" ({fp16 / min(t):4.2f}x)"
                for name, t in times.items()
            )
            + f"  fp16 {fp16:6.1f}"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def main() -> int:
    ms = tuple(int(a) for a in sys.argv[1:]) or (1, 2, 4, 16, 32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    lines = []
    for n, k in SHAPES:
        for sym in (True, False):
            lines += layer_lines(n, k, sym, sms, ms)
            torch.cuda.empty_cache()
    print("\n== us (x fp16), best of two alternating runs; [splits]; 'shipped' is the table's")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
