"""Benchmark suite: ``python -m volta_ct_wna16.bench --out DIR [--sweep]`` (needs CUDA).

For each shape (N, K), int4 group 128, symmetric and asymmetric, and M tokens, one run times:

* the plugin's launch for M (:func:`volta_ct_wna16.ops.wna16_linear`, the device's table);
* the baseline: fp16 ``torch.matmul`` (cuBLAS) on the dequantized weight;
* the device's copy bandwidth (bytes read plus written by a large device-to-device copy).

Timing: the core harness's :func:`volta_core.kernels.bench.time_cuda_graph` (calls back to back
inside one captured CUDA graph, as vLLM runs decode), rotating weight copies (more bytes than
the L2 holds), CUDA events, median of several replays. Beside each figure an SM70 estimate: the
larger of bytes over 900 GB/s and FMA work over 15.7 TFLOP/s for the Triton paths (the V100's
FMA rate: ``tl.dot`` has no tensor cores there), or, on the dequantize-then-cuBLAS path SM70
takes above 32 tokens, the dequantization's bytes plus cuBLAS at the V100's 125 TFLOP/s.

``--sweep`` also times candidate tiles per (shape, M) for choosing the SM90 table; the table
itself is what the main figures use.

Writes ``DIR/ct_wna16_bench.json`` and ``DIR/ct_wna16_bench.png``; prints the table last.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from volta_core.kernels.bench import time_cuda_graph
from volta_ct_wna16 import __version__, configs
from volta_ct_wna16.layout import PackedWeights, prepare
from volta_ct_wna16.ops import dequantize_dense, wna16_linear
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.testing import fresh_checkpoint

SHAPES = ((5120, 5120), (27648, 5120), (5120, 27648), (7168, 5120))
MS = (1, 4, 16, 64, 256, 2048)
GROUP = 128

#: V100 figures for the SM70 estimate.
V100_BANDWIDTH = 900e9
V100_FMA_FLOPS = 15.7e12
V100_TENSOR_FLOPS = 125e12

#: Bytes of weights each timed run cycles through (well above an H100's 50 MB L2).
ROTATE_BYTES = 256 << 20
MAX_COPIES = 8
#: Graph replays per timing (each replay about 20 ms of calls; the median is reported).
REPLAYS = 7
#: Token counts whose times the summary sets against the launch floor.
DECODE_MS = (1, 16)


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy, counting reads and writes."""
    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    timing = time_cuda_graph(lambda: dst.copy_(src), [()], replays=5)
    return 2 * src.numel() * src.element_size() / (timing.median_ms * 1e-3)


def matmul_flops() -> float:
    """fp16 cuBLAS FLOP/s on an 8192-cube product (the same run's compute ceiling)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    timing = time_cuda_graph(lambda: a @ b, [()], replays=5)
    return 2 * 8192**3 / (timing.median_ms * 1e-3)


def launch_floor() -> float:
    """Seconds per call of a one-element fill replayed the same way: the per-launch floor."""
    t = torch.empty(1, device="cuda")
    return time_cuda_graph(lambda: t.fill_(1.0), [()], replays=5).median_ms * 1e-3


def weights(n: int, k: int, symmetric: bool, copies: int) -> list[PackedWeights]:
    out = []
    for i in range(copies):
        ckpt = fresh_checkpoint(n, k, WeightScheme(4, symmetric, GROUP), seed=i, device="cuda")
        t = ckpt.tensors
        out.append(
            prepare(
                f"bench.{n}x{k}",
                ckpt.scheme,
                n=n,
                k=k,
                weight_packed=t["weight_packed"],
                weight_scale=t["weight_scale"],
                weight_zero_point=t.get("weight_zero_point"),
                act_dtype=torch.float16,
            )
        )
    return out


def sm70_estimate(m: int, n: int, k: int, pw: PackedWeights) -> tuple[float, str]:
    """Seconds a V100 would need at best for the path it takes at ``m`` tokens, and why."""
    launch = configs.choose(m, n, (7, 0), pw.bits)
    io = m * k * 2 + m * n * 2
    if launch.path == configs.DEQUANT_MATMUL:
        dequant = (pw.nbytes() + n * k * 2) / V100_BANDWIDTH
        gemm = max((n * k * 2 + io) / V100_BANDWIDTH, 2 * m * n * k / V100_TENSOR_FLOPS)
        return dequant + gemm, "dequant+cuBLAS"
    memory = (pw.nbytes() + io) / V100_BANDWIDTH
    compute = 2 * m * n * k / V100_FMA_FLOPS
    return max(memory, compute), "memory" if memory >= compute else "FMA"


def measure(
    n: int, k: int, symmetric: bool, ms: tuple[int, ...], copy_bw: float
) -> list[dict[str, Any]]:
    copies = max(2, min(MAX_COPIES, -(-ROTATE_BYTES // (n * k // 2))))
    pws = weights(n, k, symmetric, copies)
    fp16_copies = max(1, min(MAX_COPIES, -(-ROTATE_BYTES // (n * k * 2))))
    # The unquantized layer's weight, [N, K] as vLLM's F.linear holds it.
    dense = [dequantize_dense(pw, torch.float16).t().contiguous() for pw in pws[:fp16_copies]]
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(2)]
        ours = (
            time_cuda_graph(
                lambda i, x=x, outs=outs, pws=pws: wna16_linear(x, pws[i], out=outs[i % 2]),
                [(i,) for i in range(len(pws))],
                replays=REPLAYS,
            ).median_ms
            * 1e-3
        )
        base = (
            time_cuda_graph(
                lambda i, x=x, outs=outs, ws=dense: torch.matmul(x, ws[i].t(), out=outs[i % 2]),
                [(i,) for i in range(len(dense))],
                replays=REPLAYS,
            ).median_ms
            * 1e-3
        )
        est, bound = sm70_estimate(m, n, k, pws[0])
        launch = configs.choose(m, n, torch.cuda.get_device_capability(), 4)
        wbytes = pws[0].nbytes()
        rows.append(
            {
                "n": n,
                "k": k,
                "m": m,
                "symmetric": symmetric,
                "path": launch.path,
                "launch": asdict(launch),
                "ours_us": ours * 1e6,
                "fp16_us": base * 1e6,
                "speedup": base / ours,
                "weight_bytes": wbytes,
                "weight_gbps": wbytes / ours / 1e9,
                "copy_fraction": wbytes / ours / copy_bw,
                "sm70_estimate_us": est * 1e6,
                "sm70_bound": bound,
            }
        )
    del dense, pws
    torch.cuda.empty_cache()
    return rows


def sweep_candidates(m: int) -> list[configs.Launch]:
    """Tiles tried per M by ``--sweep`` (4-bit sizes); few, so the sweep compiles quickly."""
    s = configs.SPLITK
    if m == 1:
        return [
            configs.Launch(s, block_m=1, block_n=bn, block_k=bk, num_warps=w, programs_per_sm=p)
            for bn, bk, w in ((512, 32, 2), (512, 64, 4), (1024, 32, 4), (256, 32, 1))
            for p in (4, 8)
        ]
    if m <= 16:
        return [
            configs.Launch(s, block_m=16, block_n=bn, block_k=bk, use_dot=True, programs_per_sm=p)
            for bn, bk in ((128, 64), (128, 128), (256, 128))
            for p in (2, 4)
        ]
    gemm = [
        configs.Launch(configs.GEMM, block_m=bm, block_n=bn, block_k=bk, num_warps=w)
        for bm, bn, bk, w in ((64, 64, 64, 4), (128, 128, 64, 8), (64, 128, 64, 4))
    ]
    return [*gemm, configs.Launch(configs.DEQUANT_MATMUL, block_n=256, block_k=32)]


def sweep(n: int, k: int, ms: tuple[int, ...]) -> list[dict[str, Any]]:
    pws = weights(n, k, True, max(2, min(MAX_COPIES, -(-ROTATE_BYTES // (n * k // 2)))))
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        for launch in sweep_candidates(m):
            try:
                t = (
                    time_cuda_graph(
                        lambda i, ln=launch, x=x, o=out, pws=pws: wna16_linear(
                            x, pws[i], launch=ln, out=o
                        ),
                        [(i,) for i in range(len(pws))],
                        replays=3,
                    ).median_ms
                    * 1e-3
                )
            except Exception as exc:  # a tile that does not compile here is a finding
                rows.append({"n": n, "k": k, "m": m, "launch": asdict(launch), "error": str(exc)})
                continue
            rows.append({"n": n, "k": k, "m": m, "launch": asdict(launch), "us": t * 1e6})
    del pws
    torch.cuda.empty_cache()
    return rows


def chart(rows: list[dict[str, Any]], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SHAPES), figsize=(4.2 * len(SHAPES), 3.6), sharey=True)
    for ax, (n, k) in zip(axes, SHAPES, strict=True):
        for symmetric, style in ((True, "o-"), (False, "s--")):
            pts = [r for r in rows if (r["n"], r["k"], r["symmetric"]) == (n, k, symmetric)]
            ax.plot(
                [r["m"] for r in pts],
                [r["speedup"] for r in pts],
                style,
                label="sym" if symmetric else "asym",
            )
        for target, m in ((3.0, 1), (2.0, 16), (0.6, 2048)):
            ax.plot([m], [target], "rx")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"N={n} K={k}")
        ax.set_xlabel("M (tokens)")
    axes[0].set_ylabel("speed-up over fp16 cuBLAS")
    axes[0].legend(title="int4 g128 (x: target)")
    fig.suptitle(f"ct_wna16 on {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(rows: list[dict[str, Any]], copy_bw: float) -> str:
    lines = [
        f"copy bandwidth {copy_bw / 1e9:.0f} GB/s",
        f"{'N':>6} {'K':>6} {'sym':>4} {'M':>5} {'path':>14} {'ours us':>9} {'fp16 us':>9} "
        f"{'x fp16':>7} {'GB/s':>6} {'%copy':>6} {'SM70 est us':>12}",
    ]
    for r in rows:
        lines.append(
            f"{r['n']:>6} {r['k']:>6} {'y' if r['symmetric'] else 'n':>4} {r['m']:>5} "
            f"{r['path']:>14} {r['ours_us']:>9.1f} {r['fp16_us']:>9.1f} {r['speedup']:>7.2f} "
            f"{r['weight_gbps']:>6.0f} {100 * r['copy_fraction']:>6.1f} "
            f"{r['sm70_estimate_us']:>9.1f} {r['sm70_bound'][:3]}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sweep", action="store_true", help="also time candidate tiles")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    copy_bw = copy_bandwidth()
    flops = matmul_flops()
    floor = launch_floor()
    rows: list[dict[str, Any]] = []
    for n, k in SHAPES:
        for symmetric in (True, False):
            rows += measure(n, k, symmetric, MS, copy_bw)
    swept: list[dict[str, Any]] = []
    result = {
        "device": device,
        "capability": list(torch.cuda.get_device_capability()),
        "versions": {
            "volta_ct_wna16": __version__,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
        "copy_bandwidth_gbps": copy_bw / 1e9,
        "fp16_matmul_tflops": flops / 1e12,
        "launch_floor_us": floor * 1e6,
        "rows": rows,
        "sweep": swept,
    }
    (args.out / "ct_wna16_bench.json").write_text(json.dumps(result, indent=1))
    chart(rows, args.out / "ct_wna16_bench.png", device)
    if args.sweep:  # after the main figures are saved, so a time limit cannot lose them
        for n, k in SHAPES[:2]:
            swept += sweep(n, k, (1, 16))
        (args.out / "ct_wna16_bench.json").write_text(json.dumps(result, indent=1))
    if swept:
        print(best_of_sweep(swept))
    print(f"{device}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"fp16 cuBLAS 8192^3: {flops / 1e12:.0f} TFLOP/s; one launch {floor * 1e6:.1f} us")
    print(against_floor(rows, floor))
    print(table(rows, copy_bw))
    return 0


def against_floor(rows: list[dict[str, Any]], floor: float) -> str:
    """Decode times in launches: how far each is from one launch of this timing method."""
    lines = [f"decode against one replayed launch ({floor * 1e6:.1f} us):"]
    for r in rows:
        if r["m"] in DECODE_MS:
            lines.append(
                f"  {r['n']}x{r['k']} {'sym' if r['symmetric'] else 'asym':<4} M={r['m']:<2} "
                f"{r['ours_us']:6.1f} us = {r['ours_us'] / (floor * 1e6):4.1f} launches "
                f"(fp16 {r['fp16_us']:.1f} us = {r['fp16_us'] / (floor * 1e6):.1f})"
            )
    return "\n".join(lines)


def best_of_sweep(swept: list[dict[str, Any]]) -> str:
    lines = ["best swept tile per (N, K, M):"]
    keys = sorted({(r["n"], r["k"], r["m"]) for r in swept})
    for key in keys:
        ok = [r for r in swept if (r["n"], r["k"], r["m"]) == key and "us" in r]
        if not ok:
            continue
        best = min(ok, key=lambda r: r["us"])
        ln = best["launch"]
        lines.append(
            f"  {key}: {best['us']:.1f} us {ln['path']} m{ln['block_m']} n{ln['block_n']} "
            f"k{ln['block_k']} dot={ln['use_dot']} pps={ln['programs_per_sm']} w={ln['num_warps']}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
