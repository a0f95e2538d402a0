"""Probe (H100): stream-K launches of the split-K kernel against the shipped split counts.

Run 16 and run 19 found the small layers' decode launches paying for wave quantization: a
grid of ``tiles x splits`` programs rarely fills the SMs evenly (5120x5120 at 16 tokens: 200
programs on 132 SMs, 68 of them running two), and the split-count sawtooth at the wave edge.
The kernel's ``STREAM_K`` deals the input steps of all output tiles out to a fixed number of
programs in equal runs (CUTLASS's stream-K), a run crossing a tile's end adding one atomic
partial to each tile it touches. This script times, for the benchmark's four layers, int4
group 128, symmetric and asymmetric, M in ``MS``:

* ``shipped``: ``wna16_linear`` with the table's launch;
* ``sk P``: the same launch with ``stream_k=True`` and ``programs_per_sm=P`` (lanes = P x SMs);
* the fp16 baseline (``torch.matmul`` by the dequantized weight) and the read floor, as
  ``bench.measure`` times them.

Every variant is checked against float64 on the GPU first (and the accumulators and counters
zero after), then timed as the benchmark times (one CUDA graph, rotating weight copies past
L2), twice in alternating rounds; the best of the two is printed.

    PYTHONPATH=core/src:plugins/ct_wna16/src \\
        python3 docs/perf/ct_wna16/run21/probe_stream_k.py
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import torch

from volta_core.kernels.bench import time_cuda_graph
from volta_core.kernels.counters import arrival_counters, zeroed_accumulators
from volta_core.kernels.read_floor import read_floor
from volta_ct_wna16 import bench, configs
from volta_ct_wna16.layout import dequantize
from volta_ct_wna16.ops import dequantize_dense, device_facts, wna16_linear

LAYERS = ((5120, 5120), (7168, 5120), (27648, 5120), (5120, 27648))
MS = (1, 4, 16, 32)
GEMV_PER_SM = (4, 6, 8)
DOT_PER_SM = (1, 2, 3)
TOLERANCE = 2e-3


def variants(m: int, n: int, k: int, capability: tuple[int, int]) -> list[tuple[str, object]]:
    table = configs.choose(m, n, capability, 4, k=k)
    out: list[tuple[str, object]] = [("shipped", None)]
    for p in GEMV_PER_SM if m == 1 else DOT_PER_SM:
        out.append((f"sk {p}", replace(table, stream_k=True, programs_per_sm=p)))
    return out


def check(x, pw, launch, label: str) -> float:
    ref = x.double() @ dequantize(pw).t()
    out = torch.full((x.shape[0], pw.n), float("nan"), dtype=torch.float16, device=x.device)
    for _ in range(2):
        wna16_linear(x, pw, launch=launch, out=out)
    torch.cuda.synchronize()
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    if not err < TOLERANCE:
        raise AssertionError(f"{label}: relative error {err:.2e}")
    if arrival_counters(x.device).any() or zeroed_accumulators(x.device).any():
        raise AssertionError(f"{label}: counters or accumulators left non-zero")
    return err


def time_us(fn, count: int) -> float:
    return time_cuda_graph(fn, [(i,) for i in range(count)], replays=bench.REPLAYS).median_ms * 1e3


def layer_rows(n: int, k: int, sym: bool, capability: tuple[int, int]) -> list[tuple]:
    dev = torch.device("cuda")
    copies = max(2, min(bench.MAX_COPIES, -(-bench.ROTATE_BYTES // (n * k // 2))))
    pws = bench.weights(n, k, sym, copies)
    fp16_copies = max(1, min(bench.MAX_COPIES, -(-bench.ROTATE_BYTES // (n * k * 2))))
    dense = [dequantize_dense(p, torch.float16).t().contiguous() for p in pws[:fp16_copies]]
    floor = read_floor([pw.qweight for pw in pws]).median_ms * 1e3
    label = f"{n}x{k} {'sym' if sym else 'asym'}"
    rows = []
    for m in MS:
        x = torch.randn(m, k, device=dev, dtype=torch.float16)
        outs = [torch.empty(m, n, device=dev, dtype=torch.float16) for _ in range(2)]
        cases = variants(m, n, k, capability)
        for name, ln in cases:
            err = check(x, pws[0], ln, f"{label} m={m} {name}")
            print(f"  check {label} m={m} {name}: {err:.1e}", flush=True)
        best: dict[str, float] = {}
        for _ in range(2):
            for name, ln in cases:

                def ours(i: int, ln=ln, x=x, outs=outs) -> torch.Tensor:
                    return wna16_linear(x, pws[i], launch=ln, out=outs[i % 2])

                best[name] = min(best.get(name, 1e9), time_us(ours, len(pws)))

        def fp16_matmul(i: int, x=x, outs=outs) -> torch.Tensor:
            return torch.matmul(x, dense[i].t(), out=outs[i % 2])

        fp16 = time_us(fp16_matmul, len(dense))
        rows.append((label, m, fp16, floor, best))
        line = " ".join(f"{a} {b:.2f}" for a, b in best.items())
        print(f"{label} m={m}: fp16 {fp16:.2f} floor {floor:.2f} | {line}", flush=True)
    return rows


def main() -> int:
    capability, sms = device_facts(torch.empty(1, device="cuda"))
    print(torch.cuda.get_device_name(), capability, sms, "SMs", torch.__version__, flush=True)
    rows = []
    for n, k in LAYERS:
        for sym in (True, False):
            rows += layer_rows(n, k, sym, capability)
            torch.cuda.empty_cache()
    print("\n== us, best of two rounds; x = fp16 time / ours")
    print("| layer | M | fp16 | floor | shipped (x) | best stream-K (x) | all stream-K |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, m, fp16, floor, best in rows:
        sk = {a: b for a, b in best.items() if a != "shipped"}
        bname = min(sk, key=lambda a: sk[a])
        print(
            f"| {label} | {m} | {fp16:.2f} | {floor:.2f} | "
            f"{best['shipped']:.2f} ({fp16 / best['shipped']:.2f}x) | {sk[bname]:.2f} {bname} "
            f"({fp16 / sk[bname]:.2f}x) | {' / '.join(f'{v:.2f}' for v in sk.values())} |"
        )
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"wall {time.time() - t0:.0f} s")
    sys.exit(rc)
