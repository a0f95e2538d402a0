"""Run 16 call 7: more warps for the dot tile and the narrow GEMV, where few tiles run.

With the split counts balanced (call 2), the 16-token tile still takes 14.0 us on 5120x5120,
twice its read floor. A program of the tile (16x256 outputs, 128 inputs a step, 4 warps,
168 registers at sm_90) dequantizes 256 weights per thread per step, and an SM runs one or
two of them: one or two warps per scheduler, so each step waits on its own chain. This probe
times tiles with more warps per SM (8 warps a program, or narrower tiles of which an SM holds
more) at several split counts each: every count ``configs.balanced_splits`` gives for 1 to 4
resident programs, and the table's. At one token: the narrow GEMV on 2 (the table's) and 4
warps at 4-6 programs per SM. Every launch is checked against ``x @ dequant(W).T`` first;
times are the best of two alternating runs inside one CUDA graph, fp16 cuBLAS beside them.
Run from the repository root with PYTHONPATH=core/src:plugins/ct_wna16/src.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch
from probe_counts import _real_split_count, forced, timed

from volta_core.kernels.bench import time_cuda_graph
from volta_ct_wna16 import configs
from volta_ct_wna16.bench import SHAPES, weights
from volta_ct_wna16.ops import dequantize_dense, wna16_linear

MS = (1, 4, 16)


def tiles(m: int, shipped: configs.Launch) -> dict[str, configs.Launch]:
    if m == 1:
        return {
            "shipped": shipped,
            "w4p4": replace(shipped, num_warps=4, programs_per_sm=4),
            "w4p6": replace(shipped, num_warps=4, programs_per_sm=6),
            "w2p6": replace(shipped, programs_per_sm=6),
        }
    return {
        "shipped": shipped,
        "w8": replace(shipped, num_warps=8),
        "n128": replace(shipped, block_n=128),
        "n128w8": replace(shipped, block_n=128, num_warps=8),
        "k64": replace(shipped, block_k=64),
    }


def counts(n, k, m, launch, sms) -> list[int]:
    """The table's count and the balanced ones for 1-4 resident programs (dot tiles)."""
    out = {_real_split_count(n, k, launch, sms, m)[0]}
    if launch.split_cost is not None:
        for resident in (1, 2, 3, 4):
            ln = replace(launch, programs_per_sm=resident)
            out.add(_real_split_count(n, k, ln, sms, m)[0])
    return sorted(out)


def layer_lines(n: int, k: int, sym: bool, sms: int) -> list[str]:
    pws = weights(n, k, sym, max(2, min(8, -(-(256 << 20) // (n * k // 2)))))
    dense = [dequantize_dense(p, torch.float16).t().contiguous() for p in pws[:2]]
    cap = torch.cuda.get_device_capability()
    lines = []
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(2)]
        shipped = configs.choose(m, n, cap, 4)
        runs = {
            (name, s): ln
            for name, ln in tiles(m, shipped).items()
            for s in counts(n, k, m, ln, sms)
        }
        ref = (x.double() @ dense[0].double().t()).float()
        for (name, s), ln in runs.items():
            configs.split_count = forced(s)
            for _ in range(2):
                got = wna16_linear(x, pws[0], launch=ln)
                err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
                assert err < 5e-3, (n, k, sym, m, name, s, err)
        configs.split_count = _real_split_count
        fp16 = (
            time_cuda_graph(
                lambda i, x=x, outs=outs: torch.matmul(x, dense[i].t(), out=outs[i]),
                [(0,), (1,)],
                replays=7,
            ).median_ms
            * 1e3
        )
        times: dict[tuple[str, int], list[float]] = {key: [] for key in runs}
        for _ in range(2):
            for (name, s), ln in runs.items():
                configs.split_count = forced(s)
                times[(name, s)].append(timed(x, pws, outs, ln))
        configs.split_count = _real_split_count
        table = (_real_split_count(n, k, shipped, sms, m)[0],)
        line = (
            f"{n:>6}x{k:<6}{'y' if sym else 'n':>2}{m:>4}  "
            + "  ".join(
                f"{name}/{s}{'*' if name == 'shipped' and s in table else ''}:{min(t):.1f}"
                for (name, s), t in times.items()
            )
            + f"  fp16 {fp16:6.1f}"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def main() -> int:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    lines = []
    for n, k in SHAPES:
        for sym in (True, False):
            lines += layer_lines(n, k, sym, sms)
            torch.cuda.empty_cache()
    print("\n== us by tile/split count (* the table's), best of two alternating runs")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
