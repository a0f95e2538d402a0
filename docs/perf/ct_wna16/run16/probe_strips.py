"""Run 16 call 6: the 1-token GEMV as column strips that read the whole input, unsplit.

The table's GEMV cuts the input into splits (512 outputs a program) whose partials are summed
atomically, and the tail after the last split (counter, read of the sums, store) is paid on
every layer. On a layer with few outputs (5120x5120: 10 tiles of 512) the splits are what
fills the SMs. Narrow strips fill them instead: 8 to 64 outputs a program, each over the whole
input, need no partials, no counter and no tail (one program per tile: ``programs_per_sm=1``
leaves a layer of at least as many tiles as SMs unsplit; a narrower layer gets a few atomic
splits). Each launch is checked against ``x @ dequant(W).T`` and timed as in call 1 (best of
two alternating runs inside one CUDA graph), fp16 cuBLAS beside it; labels name outputs,
inputs per step, warps, stages and the split count.
Run from the repository root with PYTHONPATH=core/src:plugins/ct_wna16/src.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch
from probe_splits import layer_lines

from volta_ct_wna16 import configs
from volta_ct_wna16.bench import SHAPES

STRIPS = ((8, 256, 1, 4), (16, 256, 1, 4), (16, 512, 1, 3), (32, 256, 1, 4), (32, 512, 2, 3))


def variants(m: int, shipped: configs.Launch) -> dict[str, configs.Launch]:
    """The table's GEMV and the strips (uint8 zero points, atomic splits where split)."""
    out = {"shipped": shipped}
    for bn, bk, w, st in STRIPS:
        strip = replace(
            shipped, block_n=bn, block_k=bk, num_warps=w, num_stages=st, programs_per_sm=1
        )
        out[f"n{bn}k{bk}w{w}s{st}"] = replace(strip, byte_zeros=True, atomic=True)
    return out


def main() -> int:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    lines = []
    for n, k in SHAPES:
        for sym in (True, False):
            lines += layer_lines(n, k, sym, sms, (1,), variants)
            torch.cuda.empty_cache()
    print("\n== us (x fp16), best of two alternating runs; [splits]; 'shipped' is the table's")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
