"""Run 16 call 9: the split-K kernel's unmasked build (``WHOLE``) against the masked one.

Compiled for sm_90, the 16-token slot-dot tile took 1688 SASS instructions with its loads
masked along inputs and outputs and 1496 without (``ISETP`` 130 -> 53, ``SEL`` 121 -> 13),
the 1-token GEMVs 8-10% fewer. Every benchmark layer's tiles
lie inside it, so the launcher now takes the unmasked build there
(``configs.whole_tiles``). For every benchmark shape, int4 group 128, both symmetries, at 1,
4, 16 and 32 tokens, the table's launch is timed with it and with ``whole_tiles`` answering
False (the masked build), alternating twice, each checked against ``x @ dequant(W).T`` first.
Run from the repository root with PYTHONPATH=core/src:plugins/ct_wna16/src.
"""

from __future__ import annotations

import sys

import torch
from probe_counts import timed

from volta_core.kernels.bench import time_cuda_graph
from volta_ct_wna16 import configs
from volta_ct_wna16.bench import SHAPES, weights
from volta_ct_wna16.ops import dequantize_dense, wna16_linear

MS = (1, 4, 16, 32)
_whole_tiles = configs.whole_tiles


def masked(*args) -> bool:
    return False


def layer_lines(n: int, k: int, sym: bool) -> list[str]:
    pws = weights(n, k, sym, max(2, min(8, -(-(256 << 20) // (n * k // 2)))))
    dense = [dequantize_dense(p, torch.float16).t().contiguous() for p in pws[:2]]
    cap = torch.cuda.get_device_capability()
    lines = []
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(2)]
        launch = configs.choose(m, n, cap, 4, k=k)
        ref = (x.double() @ dense[0].double().t()).float()
        variants = {"whole": _whole_tiles, "masked": masked}
        for name, rule in variants.items():
            configs.whole_tiles = rule
            got = wna16_linear(x, pws[0])
            err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
            assert err < 5e-3, (n, k, sym, m, name, err)
        fp16 = (
            time_cuda_graph(
                lambda i, x=x, outs=outs: torch.matmul(x, dense[i].t(), out=outs[i]),
                [(0,), (1,)],
                replays=7,
            ).median_ms
            * 1e3
        )
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(2):
            for name, rule in variants.items():
                configs.whole_tiles = rule
                times[name].append(timed(x, pws, outs, launch))
        configs.whole_tiles = _whole_tiles
        w, msk = min(times["whole"]), min(times["masked"])
        line = (
            f"{n:>6}x{k:<6}{'y' if sym else 'n':>2}{m:>4}  whole {w:6.1f} ({fp16 / w:4.2f}x)"
            f"  masked {msk:6.1f} ({fp16 / msk:4.2f}x)  fp16 {fp16:6.1f}"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def main() -> int:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    lines = []
    for n, k in SHAPES:
        for sym in (True, False):
            lines += layer_lines(n, k, sym)
            torch.cuda.empty_cache()
    print("\n== us (x fp16), best of two alternating runs, the table's launch")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
