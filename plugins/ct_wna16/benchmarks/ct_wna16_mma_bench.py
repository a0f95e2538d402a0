"""Tensor-core GEMM rows: ``python plugins/ct_wna16/benchmarks/ct_wna16_mma_bench.py --out DIR``
(needs CUDA, NVRTC 12 with cuda-bindings, and ``volta_ct_wna16`` and the devkit importable).

For each layer of the main benchmark (int4, group 128; symmetric, and asymmetric on
27648 x 5120) and M = 8 to 256 tokens, one run times on this GPU, as the main benchmark does
(inside one captured CUDA graph, rotating weight copies past the L2):

* the CUDA GEMM on ``mma.m8n8k4`` (:mod:`volta_ct_wna16.cuda`), built for this GPU with the
  V100 table's launch for M (on Hopper the PTX ISA's m8n8k4 is emulated: slow, and no speed
  target; the figures prove it runs, not how fast a V100 runs it);
* the Triton path this GPU's table takes for M;
* fp16 ``torch.matmul`` (cuBLAS) on the dequantized weight.

Beside them the SM70 estimates (:func:`volta_ct_wna16.dispatch.linear_cost`, no V100 here): the
tensor-core GEMM (its padded products at 125 TFLOP/s, or its bytes at 900 GB/s), the Triton dot
path (the product at the FMA units' 15.7 TFLOP/s, or the bytes), and what a V100 without NVRTC
runs (the SM70 table's Triton launch: dequantize-then-cuBLAS above 32 tokens). Each CUDA launch
is first checked against ``x @ dequant(W).T`` by cuBLAS (max |error| / max |reference|).

Writes ``DIR/ct_wna16_mma_bench.json``; prints the table last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import ct_wna16_bench as bench
import torch

from volta_core.kernel_api import CudaCompileError, CudaToolkitUnavailable
from volta_ct_wna16.dispatch import linear_cost, table_launch
from volta_ct_wna16.ops import dequantize_dense, wna16_linear
from volta_ct_wna16.tables import SM70, SM70_MMA, Launch
from volta_devkit.bench import time_cuda_graph

MS = (8, 16, 32, 64, 128, 256)
#: The layer issue 34's target names, timed asymmetric too.
TARGET_SHAPE = (27648, 5120)
REPLAYS = 5


def mma_launch(m: int):
    """The V100 table's tensor-core launch for ``m`` tokens."""
    return next(launch for most, launch in SM70_MMA if m <= most)


def estimates(m: int, n: int, k: int, weight_bytes: int) -> dict[str, float]:
    """The SM70 estimates in microseconds (dispatch's costs at the V100's rates): tensor
    cores, the Triton dot path (on the FMA units), the SM70 table's Triton launch (what a V100
    without NVRTC runs)."""
    triton = table_launch(m, n, k, 4, (7, 0))

    def us(launch: Launch) -> float:
        return linear_cost(m, n, k, launch, 4, weight_bytes, (7, 0)).seconds() * 1e6

    return {
        "sm70_mma_us": us(mma_launch(m)),
        "sm70_dot_us": us(SM70.decode),
        "sm70_table_us": us(triton),
        "sm70_table_path": triton.path,
    }


def _time(fn, count: int) -> float:
    return time_cuda_graph(fn, [(i,) for i in range(count)], replays=REPLAYS).median_ms * 1e3


def measure(n: int, k: int, symmetric: bool) -> list[dict[str, Any]]:
    copies = max(2, min(bench.MAX_COPIES, -(-bench.ROTATE_BYTES // (n * k // 2))))
    pws = bench.weights(n, k, symmetric, copies)
    fp16_copies = max(1, min(bench.MAX_COPIES, -(-bench.ROTATE_BYTES // (n * k * 2))))
    dense = [dequantize_dense(pw, torch.float16).t().contiguous() for pw in pws[:fp16_copies]]
    rows = []
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(2)]
        launch = mma_launch(m)
        outs[0].fill_(float("nan"))
        wna16_linear(x, pws[0], launch=launch, out=outs[0])
        error = bench.max_rel_error(outs[0], torch.matmul(x, dense[0].t()))
        mma_us = _time(
            lambda i, x=x, o=outs, w=pws, ln=launch: wna16_linear(x, w[i], launch=ln, out=o[i % 2]),
            copies,
        )
        triton_us = _time(lambda i, x=x, o=outs, w=pws: wna16_linear(x, w[i], out=o[i % 2]), copies)
        fp16_us = _time(
            lambda i, x=x, o=outs, w=dense: torch.matmul(x, w[i].t(), out=o[i % 2]), len(dense)
        )
        row = {
            "n": n,
            "k": k,
            "m": m,
            "symmetric": symmetric,
            "mma_block_m": launch.block_m,
            "mma_us": mma_us,
            "mma_max_rel_error": error,
            "triton_us": triton_us,
            "triton_path": table_launch(m, n, k, 4, torch.cuda.get_device_capability()).path,
            "fp16_us": fp16_us,
            **estimates(m, n, k, pws[0].nbytes()),
        }
        rows.append(row)
        print(line(row), flush=True)
    del pws, dense
    torch.cuda.empty_cache()
    return rows


#: Measured on this GPU (us): the CUDA GEMM, its error, this GPU's Triton launch, fp16 cuBLAS.
#: Estimated for a V100 (us): the CUDA GEMM, the Triton dot path, the SM70 table's launch.
HEADER = (
    f"{'N':>6} {'K':>6} {'sym':>3} {'M':>4} | {'mma':>8} {'err':>7} {'triton':>8} {'path':>14} "
    f"{'fp16':>7} | {'sm70 mma':>8} {'sm70 dot':>8} {'sm70 tbl':>8} {'tbl path':>14} "
    f"{'mma/dot':>7}"
)


def line(r: dict[str, Any]) -> str:
    """One row: the measured times, then the SM70 model's."""
    return (
        f"{r['n']:>6} {r['k']:>6} {'y' if r['symmetric'] else 'n':>3} {r['m']:>4} | "
        f"{r['mma_us']:>8.1f} {r['mma_max_rel_error']:>7.1e} {r['triton_us']:>8.1f} "
        f"{r['triton_path']:>14} {r['fp16_us']:>7.1f} | {r['sm70_mma_us']:>8.1f} "
        f"{r['sm70_dot_us']:>8.1f} {r['sm70_table_us']:>8.1f} {r['sm70_table_path']:>14} "
        f"{r['sm70_mma_us'] / r['sm70_dot_us']:>7.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        wna16_linear(
            torch.zeros(8, 128, device="cuda", dtype=torch.float16),
            bench.weights(128, 128, True, 1)[0],
            launch=mma_launch(8),
        )
    except (CudaToolkitUnavailable, CudaCompileError) as exc:
        print(f"the tensor-core GEMM cannot be built here: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    print(HEADER, flush=True)
    for n, k in bench.SHAPES:
        for symmetric in (True, False) if (n, k) == TARGET_SHAPE else (True,):
            rows += measure(n, k, symmetric)
    result = {**bench.versions(), "rows": rows}
    (args.out / "ct_wna16_mma_bench.json").write_text(json.dumps(result, indent=1))
    print(f"{result['device']}, torch {torch.__version__}")
    print("measured on this GPU (us) | estimated for a V100 by the SM70 model (us)")
    print(HEADER)
    print("\n".join(line(r) for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
