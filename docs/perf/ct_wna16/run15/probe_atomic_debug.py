"""Run 15 call 5: why the atomic split reduction read wrong sums on the H100 (calls 3 and 4).

For 5120x5120 (int4, group 128, symmetric) and the sanitizer test's 600x1280, at 2 and 16
tokens, each launch variant (tile width, stages, programs per SM) runs three ways:

* ``in-kernel``: as shipped; error of the output against cuBLAS on the dequantized weight;
* ``after``: the tile counters preset to a large negative count so no program is the last
  arriver; the fp32 accumulators are then read after the kernel: are the atomic adds right?
* ``state``: after an in-kernel launch, are the accumulators and counters back at zero?

Run from the repository root with PYTHONPATH=core/src:plugins/ct_wna16/src. Call 5 ran it when
the choice was ``Launch.atomic_steps`` (atomic where a split ran at most 4 steps, which every
variant here did); it reads ``Launch.atomic`` since.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from volta_core.kernels.counters import arrival_counters, zeroed_accumulators
from volta_ct_wna16 import configs
from volta_ct_wna16.bench import weights
from volta_ct_wna16.ops import dequantize_dense, device_facts, wna16_linear


def err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def main() -> int:
    base = configs.SM90.decode
    variants = {
        "n256s3p2": base,
        "n256s1p2": replace(base, num_stages=1),
        "n128s3p4": replace(base, block_n=128, programs_per_sm=4),
        "n64s3p8": replace(base, block_n=64, programs_per_sm=8),
        "n256s3p8": replace(base, programs_per_sm=8),
    }
    for n, k in ((5120, 5120), (600, 1280)):
        pw = weights(n, k, True, 1)[0]
        dense = dequantize_dense(pw, torch.float16).t().contiguous()
        for m in (2, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            ref = x @ dense.t()
            for name, ln in variants.items():
                splits, per = configs.split_count(n, k, ln, device_facts(x)[1])
                tiles = -(-n // ln.block_n) * -(-m // ln.block_m)
                atomic = ln.atomic and splits > 1
                inkernel = err(wna16_linear(x, pw, launch=ln), ref)
                torch.cuda.synchronize()
                acc = zeroed_accumulators(x.device)
                cnt = arrival_counters(x.device)
                state = f"acc0 {not acc.any().item()} cnt0 {not cnt.any().item()}"
                after = float("nan")
                if atomic:
                    cnt[:tiles] = -(10**6)
                    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
                    wna16_linear(x, pw, launch=ln, out=out)
                    torch.cuda.synchronize()
                    sums = acc[: m * n].view(m, n)
                    after = err(sums, ref)
                    untouched = bool(out.isnan().all().item())
                    sums.zero_()
                    cnt[:tiles] = 0
                    state += f" out untouched {untouched}"
                print(
                    f"{n}x{k} m={m:<3}{name:<10} splits {splits:>3} x {per // ln.block_k:>2} steps"
                    f"  {'atomic' if atomic else 'tree  '}  in-kernel err {inkernel:.2e}"
                    f"  after-kernel err {after:.2e}  {state}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
