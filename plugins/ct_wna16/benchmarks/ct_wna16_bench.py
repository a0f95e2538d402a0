"""Benchmark suite: ``python plugins/ct_wna16/benchmarks/ct_wna16_bench.py --out DIR [--sweep]``
(needs CUDA, and ``volta_ct_wna16`` and the devkit importable: installed, or on ``PYTHONPATH``).

For each shape (N, K), int4 group 128, symmetric and asymmetric, and M tokens, one run times:

* the plugin's launch for M (:func:`volta_ct_wna16.ops.wna16_linear`, the device's table);
* the baseline: fp16 ``torch.matmul`` (cuBLAS) on the dequantized weight;
* the device's copy bandwidth (bytes read plus written by a large device-to-device copy);
* per layer, the read floor: the fastest one-launch kernel that only streams the packed
  weights' bytes, timed the same way (:func:`volta_devkit.read_floor.read_floor`), so
  the part of a decode time no kernel reading those bytes could remove is measured, not
  assumed.

Timing: the core harness's :func:`volta_devkit.bench.time_cuda_graph` (calls back to back
inside one captured CUDA graph, as vLLM runs decode), rotating weight copies (more bytes than
the L2 holds), CUDA events, median of several replays. Beside each figure an SM70 estimate of the
path a V100 with NVRTC takes: dispatch's cost of it (:func:`volta_ct_wna16.dispatch.linear_cost`
at :data:`volta_core.kernel_api.V100_RATES`): the tensor-core GEMM at 8-256 tokens (bytes at
900 GB/s, or its padded products at 125 TFLOP/s); else the larger of bytes over 900 GB/s and
FMA work over 15.7 TFLOP/s for the Triton paths (``tl.dot`` has no tensor cores there), or, on
the dequantize-then-cuBLAS path above 256 tokens, the dequantization's bytes plus cuBLAS at the
V100's 125 TFLOP/s.

``--sweep`` also times candidate launches per (shape, M, symmetry) for choosing the SM90 table
(``--sweep-only``: nothing else, into ``DIR/ct_wna16_sweep.json``); the table itself is what the
main figures use. Every swept launch is checked against ``x @ dequant(W).T`` on the GPU first,
and only correct ones compete for the "best" table printed at the end.

Writes ``DIR/ct_wna16_bench.json`` and ``DIR/ct_wna16_bench.png``; prints the table last.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

# The checkpoint maker the tests use (plugins/ct_wna16/tests), not part of the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from ct_wna16_checkpoints import fresh_checkpoint

from volta_core.kernel_api import V100_RATES
from volta_ct_wna16 import __version__
from volta_ct_wna16.dispatch import linear_choice, linear_cost, table_launch
from volta_ct_wna16.layout import PackedWeights
from volta_ct_wna16.ops import dequantize_dense, wna16_linear
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import DEQUANT_MATMUL, GEMM, MMA, SM90, SPLITK, Launch
from volta_devkit.bench import measure_copy_bandwidth, time_cuda_graph
from volta_devkit.read_floor import read_floor

SHAPES = ((5120, 5120), (27648, 5120), (5120, 27648), (7168, 5120))
MS = (1, 4, 16, 32, 64, 128, 256, 2048)
GROUP = 128

#: Bytes of weights each timed run cycles through (well above an H100's 50 MB L2).
ROTATE_BYTES = 256 << 20
MAX_COPIES = 8
#: Graph replays per timing (each replay about 20 ms of calls; the median is reported).
REPLAYS = 7
#: Token counts whose times the summary sets against the launch floor.
DECODE_MS = (1, 16)


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
        out.append(ckpt.packed(f"bench.{n}x{k}"))
    return out


def sm70_estimate(m: int, n: int, k: int, pw: PackedWeights) -> tuple[float, str]:
    """Seconds a V100 with NVRTC would need at best for the path it takes at ``m`` tokens
    (:func:`volta_ct_wna16.dispatch.linear_choice`), by dispatch's cost of it at
    :data:`~volta_core.kernel_api.V100_RATES`, and what bounds it: the tensor-core GEMM at
    8-256 tokens, else the table's Triton launch."""
    launch = linear_choice(m, n, k, pw.bits, pw.nbytes(), (7, 0)).launch
    cost = linear_cost(m, n, k, launch, pw.bits, pw.nbytes(launch.byte_zeros), (7, 0))
    seconds, bound = cost.seconds(V100_RATES), cost.bound(V100_RATES)
    if launch.path == MMA:
        return seconds, "memory (tensor cores)" if bound == "HBM" else "tensor cores"
    if launch.path == DEQUANT_MATMUL:
        return seconds, "dequant+cuBLAS"
    return seconds, "memory" if bound == "HBM" else "FMA"


def measure(
    n: int, k: int, symmetric: bool, ms: tuple[int, ...], copy_bw: float
) -> list[dict[str, Any]]:
    copies = max(2, min(MAX_COPIES, -(-ROTATE_BYTES // (n * k // 2))))
    pws = weights(n, k, symmetric, copies)
    fp16_copies = max(1, min(MAX_COPIES, -(-ROTATE_BYTES // (n * k * 2))))
    # The unquantized layer's weight, [N, K] as vLLM's F.linear holds it.
    dense = [dequantize_dense(pw, torch.float16).t().contiguous() for pw in pws[:fp16_copies]]
    floor_us = read_floor([pw.qweight for pw in pws]).median_ms * 1e3
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
        launch = table_launch(m, n, k, 4, torch.cuda.get_device_capability())
        wbytes = pws[0].nbytes(launch.byte_zeros)
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
                "read_floor_us": floor_us,
                "sm70_estimate_us": est * 1e6,
                "sm70_bound": bound,
            }
        )
    del dense, pws
    torch.cuda.empty_cache()
    return rows


#: Token counts ``--sweep`` times: the 1-token GEMV tiles, the dot tiles at 4 and 16, and at
#: 64 and 256 the GEMM against split-K dot tiles of more rows and dequantize-then-cuBLAS.
SWEEP_MS = (1, 4, 16, 64, 256)
#: Largest error a swept launch may have against the fp16 reference and count as correct:
#: max |ours - ref| over max |ref|, both fp32-accumulated sums rounded to fp16.
SWEEP_TOLERANCE = 1e-2


def _gemv(bn: int, bk: int, w: int, st: int, p: int, ru: int = 8) -> Launch:
    return Launch(
        SPLITK,
        block_m=1,
        block_n=bn,
        block_k=bk,
        num_warps=w,
        programs_per_sm=p,
        num_stages=st,
        reduce_unroll=ru,
    )


def _dot(bn: int, bk: int, w: int, st: int, p: int, ru: int = 2, bm: int = 16) -> Launch:
    return Launch(
        SPLITK,
        block_m=bm,
        block_n=bn,
        block_k=bk,
        use_dot=True,
        num_warps=w,
        programs_per_sm=p,
        num_stages=st,
        reduce_unroll=ru,
    )


def sweep_candidates(m: int) -> list[Launch]:
    """Launches ``--sweep`` times for ``m`` tokens (4-bit sizes), besides the table's own.

    The split-K reduction is a tree of fan-in ``reduce_unroll``
    (:func:`volta_ct_wna16.kernels.epilogue.reduce_splits`), so more splits cost less than
    with one reducer per tile: the list crosses the fan-in with
    programs per SM (a launch argument, not a compile one) on the tiles earlier sweeps kept
    (each compiles for sm_90 without spills; their results are in the README). The dot list is
    shared by 4 and 16 tokens (one compile serves both). Above 32 tokens: split-K tiles of 64
    and 128 rows with 64 inputs per step (one interleaved dot per step, the GEMM's tile)
    against the GEMM kernel and dequantize-then-cuBLAS; tiles of 32-128 rows with one dot per
    word slot were 1.5-9x slower and are left out
    (docs/perf/ct_wna16/PERFORMANCE_HISTORY.md#run9).
    """
    if m == 1:
        return [
            *(_gemv(512, 32, 2, 3, p, ru) for ru in (4, 8, 16) for p in (4, 8, 12)),
            *(_gemv(512, 32, 4, 3, p, ru=16) for p in (4, 5, 8)),
            *(_gemv(256, 32, 1, 3, p, ru=8) for p in (8, 16)),
        ]
    if m > SM90.decode_max_m:
        return [
            *(_dot(64, 64, 4, 3, p, bm=64) for p in (1, 4)),
            *(_dot(128, 64, w, 3, 1, bm=64) for w in (4, 8)),
            _dot(128, 64, 8, 3, 1, bm=128),
            Launch(GEMM, block_m=64, block_n=64, block_k=64, num_stages=3),
            SM90.dequant,
        ]
    return [
        *(_dot(256, 128, 4, 3, p, ru) for ru in (2, 4) for p in (2, 4)),
        *(_dot(128, 128, 4, 3, p, ru) for ru in (4, 8) for p in (4, 8)),
        *(_dot(64, 128, 4, 3, p) for p in (4, 8)),
    ]


def launch_label(ln: Launch) -> str:
    """A launch in one short word: path, tile, warps, stages, reduction unroll, programs/SM."""
    kind = ("dot" if ln.use_dot else "fma") if ln.path == SPLITK else ln.path
    return (
        f"{kind} m{ln.block_m}n{ln.block_n}k{ln.block_k} "
        f"w{ln.num_warps} s{ln.num_stages} r{ln.reduce_unroll} p{ln.programs_per_sm}"
    )


def max_rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| on the GPU, in fp32 (inf if ``out`` is not finite)."""
    o, r = out.float(), ref.float()
    if not bool(torch.isfinite(o).all()):
        return float("inf")
    return float((o - r).abs().max() / r.abs().max().clamp_min(1e-30))


def sweep(
    n: int, k: int, symmetric: bool, ms: tuple[int, ...], copy_bw: float
) -> list[dict[str, Any]]:
    """Time the table's launch and every candidate for each of ``ms`` on one layer.

    Each launch is first run once into a NaN-poisoned output and checked against
    ``x @ dequant(W).T`` computed by cuBLAS in fp16 (no float64 on the GPU); the fp16 product
    is timed too, for the speed-up. One line per launch as it completes.
    """
    pws = weights(n, k, symmetric, max(2, min(MAX_COPIES, -(-ROTATE_BYTES // (n * k // 2)))))
    fp16_copies = max(1, min(MAX_COPIES, -(-ROTATE_BYTES // (n * k * 2))))
    # The unquantized layer's weight, [N, K] as vLLM's F.linear holds it, rotated as in measure.
    dense = [dequantize_dense(pw, torch.float16).t().contiguous() for pw in pws[:fp16_copies]]
    capability = torch.cuda.get_device_capability()
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        ref = torch.matmul(x, dense[0].t())
        fp16 = (
            time_cuda_graph(
                lambda i, x=x, o=out, ws=dense: torch.matmul(x, ws[i].t(), out=o),
                [(i,) for i in range(len(dense))],
                replays=3,
            ).median_ms
            * 1e-3
        )
        table_pick = table_launch(m, n, k, 4, capability)
        launches = [table_pick] + [c for c in sweep_candidates(m) if c != table_pick]
        for launch in launches:
            row: dict[str, Any] = {
                "n": n,
                "k": k,
                "m": m,
                "symmetric": symmetric,
                "table": launch == table_pick,
                "launch": asdict(launch),
                "fp16_us": fp16 * 1e6,
            }
            try:
                out.fill_(float("nan"))
                wna16_linear(x, pws[0], launch=launch, out=out)
                row["max_rel_error"] = max_rel_error(out, ref)
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
            except Exception as exc:  # a launch that does not compile here is a finding
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                print(
                    f"sweep {n}x{k} {'sym ' if symmetric else 'asym'} M={m:<2} "
                    f"{launch_label(launch)}: {row['error']}",
                    flush=True,
                )
                rows.append(row)
                continue
            row.update(
                us=t * 1e6,
                speedup=fp16 / t,
                copy_fraction=pws[0].nbytes(launch.byte_zeros) / t / copy_bw,
                correct=row["max_rel_error"] <= SWEEP_TOLERANCE,
            )
            rows.append(row)
            print(sweep_line(row), flush=True)
    del pws, dense
    torch.cuda.empty_cache()
    return rows


def sweep_line(r: dict[str, Any]) -> str:
    """One swept launch: layer, tokens, launch, time, x fp16, % of copy, error."""
    ln = Launch(**r["launch"])
    return (
        f"{r['n']:>6}x{r['k']:<6} {'sym ' if r['symmetric'] else 'asym'} M={r['m']:<2} "
        f"{launch_label(ln):<34} {r['us']:8.1f} us {r['speedup']:5.2f}x fp16 "
        f"{100 * r['copy_fraction']:5.1f}% copy err {r['max_rel_error']:.1e}"
        f"{' table' if r['table'] else ''}{'' if r['correct'] else ' WRONG'}"
    )


def best_of_sweep(swept: list[dict[str, Any]]) -> str:
    """The fastest correct launch per (layer, tokens, symmetry), beside the table's launch."""
    lines = [
        "best swept launch per (shape, M, sym) (correct ones only; table = the shipped table's):",
        f"{'N':>6} {'K':>6} {'sym':>4} {'M':>3} {'best us':>8} {'x fp16':>7} {'%copy':>6} "
        f"{'table us':>9}  best launch",
    ]
    keys = sorted({(r["n"], r["k"], not r["symmetric"], r["m"]) for r in swept})
    for n, k, asym, m in keys:
        rows = [
            r
            for r in swept
            if (r["n"], r["k"], not r["symmetric"], r["m"]) == (n, k, asym, m) and r.get("correct")
        ]
        if not rows:
            lines.append(f"{n:>6} {k:>6} {'n' if asym else 'y':>4} {m:>3}  no correct launch")
            continue
        best = min(rows, key=lambda r: r["us"])
        table_us = next((f"{r['us']:9.1f}" for r in rows if r["table"]), f"{'-':>9}")
        lines.append(
            f"{n:>6} {k:>6} {'n' if asym else 'y':>4} {m:>3} {best['us']:8.1f} "
            f"{best['speedup']:7.2f} {100 * best['copy_fraction']:6.1f} {table_us}  "
            f"{launch_label(Launch(**best['launch']))}"
        )
    return "\n".join(lines)


def run_sweep(copy_bw: float, save: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    """Every shape: :data:`SWEEP_MS` symmetric, and 1 and 16 tokens asymmetric; the rows so
    far are saved after each layer, so a time limit loses one layer at most."""
    swept: list[dict[str, Any]] = []
    for n, k in SHAPES:
        swept += sweep(n, k, True, SWEEP_MS, copy_bw)
        save(swept)
        swept += sweep(n, k, False, (1, 16), copy_bw)
        save(swept)
    return swept


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
        f"{'x fp16':>7} {'GB/s':>6} {'%copy':>6} {'floor us':>9} {'SM70 est us':>12}",
    ]
    for r in rows:
        lines.append(
            f"{r['n']:>6} {r['k']:>6} {'y' if r['symmetric'] else 'n':>4} {r['m']:>5} "
            f"{r['path']:>14} {r['ours_us']:>9.1f} {r['fp16_us']:>9.1f} {r['speedup']:>7.2f} "
            f"{r['weight_gbps']:>6.0f} {100 * r['copy_fraction']:>6.1f} "
            f"{r['read_floor_us']:>9.1f} {r['sm70_estimate_us']:>9.1f} {r['sm70_bound'][:3]}"
        )
    return "\n".join(lines)


def versions() -> dict[str, Any]:
    import triton

    return {
        "device": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "versions": {
            "volta_ct_wna16": __version__,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
    }


def start(out: Path) -> float | None:
    """The copy bandwidth (bytes/s) of this run's GPU, after creating ``out``; None, with the
    reason on stderr and nothing written, where there is no CUDA GPU (both benchmarks)."""
    if not torch.cuda.is_available():
        print("the benchmark needs a CUDA GPU", file=sys.stderr)
        return None
    out.mkdir(parents=True, exist_ok=True)
    return measure_copy_bandwidth()[0] * 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sweep", action="store_true", help="also time candidate launches")
    mode.add_argument(
        "--sweep-only", action="store_true", help="time candidate launches only (about 5 min)"
    )
    args = parser.parse_args(argv)
    copy_bw = start(args.out)
    if copy_bw is None:
        return 2
    if args.sweep_only:
        record = {**versions(), "copy_bandwidth_gbps": copy_bw / 1e9}
        path = args.out / "ct_wna16_sweep.json"
        swept = run_sweep(
            copy_bw, lambda rows: path.write_text(json.dumps({**record, "sweep": rows}, indent=1))
        )
        print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s")
        print(best_of_sweep(swept))
        return 0
    flops = matmul_flops()
    floor = launch_floor()
    rows: list[dict[str, Any]] = []
    for n, k in SHAPES:
        for symmetric in (True, False):
            rows += measure(n, k, symmetric, MS, copy_bw)
    swept = []
    result = {
        **versions(),
        "copy_bandwidth_gbps": copy_bw / 1e9,
        "fp16_matmul_tflops": flops / 1e12,
        "launch_floor_us": floor * 1e6,
        "rows": rows,
        "sweep": swept,
    }
    (args.out / "ct_wna16_bench.json").write_text(json.dumps(result, indent=1))
    chart(rows, args.out / "ct_wna16_bench.png", result["device"])
    if args.sweep:  # after the main figures are saved, so a time limit cannot lose them
        path = args.out / "ct_wna16_bench.json"
        swept += run_sweep(
            copy_bw, lambda rows: path.write_text(json.dumps({**result, "sweep": rows}, indent=1))
        )
        print(best_of_sweep(swept))
    print(f"{result['device']}, torch {torch.__version__}, {result['versions']['triton']}")
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


if __name__ == "__main__":
    sys.exit(main())
