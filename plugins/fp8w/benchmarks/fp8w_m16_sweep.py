"""The 16-token sweep: ``python plugins/fp8w/benchmarks/fp8w_m16_sweep.py --out DIR [--ms 16]
[--shapes N,K;...] [--budget-s 130]`` (needs CUDA, and ``volta_fp8w`` and the devkit importable:
installed, or on ``PYTHONPATH``); ``--self-check`` runs only the correctness checks of every
kernel variant below, on a small layer, on the GPU or, without one, on the CPU under Triton's
interpreter.

For 16 tokens the SM90 table runs the split-K dot tile (:mod:`volta_fp8w.kernels.splitk`).
This sweep times, per layer (a 32B model's MLP up and down and its attention output, e4m3 in
128 x 128 blocks) in one CUDA graph over rotating weight copies (the harness's
:func:`volta_devkit.bench.time_cuda_graph`): fp16 cuBLAS on the dequantized weights, the
table's launch through :func:`volta_fp8w.ops.fp8_linear`, and each :class:`Variant`, launched
here with options the table cannot yet name: the dot tile's codes read as bytes or as words
(``WORDS``), its dot width (``DOT_K``), the weights as the dot's first operand (``SWAP_AB``),
Triton's pipeline stages; over output and input tiles, warps and programs per SM (the split
count); and the tiled GEMM's tiles. Every variant is first run into a NaN-poisoned output and
checked against the fp32 product; a wrong one is recorded and not timed.

Variants run in :func:`variants`' order (the table's tile as bytes and as words first), each
over every layer, so a run cut short by ``--budget-s`` keeps whole variants. Writes
``DIR/fp8w_m16_sweep.json`` after each variant: per (layer, M) every time, and the variant with
the best geometric mean speed over fp16 across the layers (the table has one launch for all of
them), printed last as the table entry to adopt.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

#: The layers of issue 47's 16-token target, ``(N, K)``.
SHAPES = ((27648, 5120), (5120, 27648), (5120, 5120))
#: Token counts swept (the target's).
MS = (16,)
#: Largest max|out - ref| / max|ref| a variant may have against the fp32 product: fp16 outputs
#: (2**-11) of fp32 sums, with room for the sums' order.
TOLERANCE = 1e-2
#: ``--self-check``'s layer (partial output and input tiles, a split) and token counts.
CHECK_SHAPE = (320, 640)
CHECK_MS = (1, 5, 16)
#: Where the timed layers live (a CPU dry run under the interpreter sets "cpu").
DEVICE = "cuda"
#: Programs per SM each split-K tile is timed at (the split count follows, per layer).
PROGRAMS_PER_SM = (1, 2, 4, 8)


@dataclass(frozen=True)
class Variant:
    """A launch of the split-K tile or the tiled GEMM with the kernel options
    :func:`launch_variant` passes: ``launch`` (path, tile, warps, programs per SM),
    ``num_stages`` (Triton's software pipeline; None: Triton's default, as the launcher runs),
    ``words`` (codes read as int32 words), and for the split-K dot tile ``dot_k`` (inputs a
    ``tl.dot``) and ``swap_ab`` (weights as the dot's first operand)."""

    launch: Any
    num_stages: int | None = None
    words: bool = True
    dot_k: int = 32
    swap_ab: bool = False

    def name(self) -> str:
        la = self.launch
        parts = [la.path, f"m{la.block_m}", f"n{la.block_n}", f"k{la.block_k}", f"w{la.num_warps}"]
        if self.num_stages is not None:
            parts.append(f"s{self.num_stages}")
        parts.append("words" if self.words else "bytes")
        if la.path == "splitk":
            parts += [f"pps{la.programs_per_sm}", f"dot{self.dot_k}"]
            if self.swap_ab:
                parts.append("swap")
        return "_".join(parts)

    def record(self) -> dict[str, Any]:
        return {"name": self.name(), **asdict(self), "launch": repr(self.launch)}


def variants() -> list[Variant]:
    """The sweep's variants, most telling first: the SM90 table's small tile as bytes (before
    the word decode) and as words, each dot form on it; then the word tile with swapped
    operands and one 128-input dot over output tiles, warps and stages, nearest the table's
    tile first, each at every :data:`PROGRAMS_PER_SM`; a 64-input tile; the tiled GEMM (no
    split-K: few programs on the long-input layer)."""
    from volta_fp8w.tables import GEMM, SM90, SPLITK, Launch

    table = SM90.small
    out = [Variant(table, words=False), Variant(table)]
    out += [
        Variant(table, dot_k=dot_k, swap_ab=swap)
        for swap in (False, True)
        for dot_k in (32, 128)
        if (dot_k, swap) != (32, False)
    ]
    near = (128, 4, 3)
    builds = sorted(
        ((n, w, s) for n in (64, 128, 256) for w in (4, 8) for s in (2, 3, 4)),
        key=lambda b: sum(a != c for a, c in zip(b, near, strict=True)),
    )
    for block_n, warps, stages in builds:
        for pps in PROGRAMS_PER_SM:
            launch = Launch(
                SPLITK, block_m=16, block_n=block_n, block_k=128, num_warps=warps,
                programs_per_sm=pps,
            )  # fmt: skip
            out.append(Variant(launch, stages, dot_k=128, swap_ab=True))
    for pps in PROGRAMS_PER_SM:
        launch = Launch(SPLITK, block_m=16, block_n=128, block_k=64, num_warps=4,
                        programs_per_sm=pps)  # fmt: skip
        out.append(Variant(launch, 3, dot_k=64, swap_ab=True))
    for block_n in (64, 128):
        out.append(Variant(Launch(GEMM, block_m=16, block_n=block_n, block_k=128), 3))
    return list(dict.fromkeys(out))


def check_variants() -> list[Variant]:
    """One variant of each kernel form :func:`variants` takes (bytes and words, each dot
    width and operand order, the GEMM), at small tiles: what ``--self-check`` runs."""
    from volta_fp8w.tables import GEMM, SPLITK, Launch

    small = Launch(SPLITK, block_m=16, block_n=64, block_k=128, num_warps=4, programs_per_sm=64)
    gemv = Launch(SPLITK, block_m=1, block_n=64, block_k=128, num_warps=2, programs_per_sm=64)
    return [
        Variant(small, words=False),
        Variant(small),
        Variant(small, 3, dot_k=128),
        Variant(small, 3, dot_k=128, swap_ab=True),
        Variant(replace(small, block_k=64), 2, dot_k=64, swap_ab=True, words=False),
        Variant(gemv),
        Variant(gemv, words=False),
        Variant(Launch(GEMM, block_m=16, block_n=64, block_k=128), 3),
        Variant(Launch(GEMM, block_m=16, block_n=64, block_k=128), 3, words=False),
    ]


def launch_variant(x: torch.Tensor, w: Any, v: Variant, out: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` into ``out`` (fp16 ``[m, n]``, contiguous) with ``v``'s options, the
    kernel arguments as :func:`volta_fp8w.ops.fp8_linear` derives them
    (:mod:`volta_fp8w.launch`); no bias. ``x`` rows contiguous, ``w`` checked by the caller's
    layer (the words need its codes' base, row stride and inputs multiples of 4)."""
    from volta_core.kernel_api import arrival_counters, device_facts, zeroed_accumulators
    from volta_fp8w import kernels
    from volta_fp8w.launch import (
        fitted,
        gemm_constexprs,
        gemm_grid,
        split_count,
        splitk_constexprs,
        splitk_grid,
    )
    from volta_fp8w.tables import SPLITK

    m = x.shape[0]
    tile = fitted(v.launch, w.block_k, w.weight.stride(0))
    common = (w.n, w.k, x.stride(0), w.weight.stride(0), *w.scales.stride(), out.stride(0))
    options: dict[str, int] = {"num_warps": tile.num_warps}
    if v.num_stages is not None:
        options["num_stages"] = v.num_stages
    if tile.path == SPLITK:
        splits, per_split = split_count(w.n, w.k, tile, device_facts(x.device).sm_count, m)
        grid = splitk_grid(m, w.n, tile, splits)
        split = splits > 1
        ws = zeroed_accumulators(x.device, m * w.n if split else 0)
        counters = arrival_counters(x.device, grid[0] * grid[1] if split else 0)
        constexprs = splitk_constexprs(
            tile, False, split, v.words, dot_k=v.dot_k, swap_ab=v.swap_ab
        )
        kernels.fp8w_splitk_kernel[grid](
            x, w.weight, w.scales, out, out, ws, counters, m, *common, w.block_n, w.block_k,
            per_split, **constexprs, **options,
        )  # fmt: skip
    else:
        kernels.fp8w_gemm_kernel[gemm_grid(m, w.n, tile)](
            x, w.weight, w.scales, out, out, m, *common, w.block_n, w.block_k,
            **gemm_constexprs(tile, False, v.words), **options,
        )  # fmt: skip
    return out


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max|out - ref| / max|ref|`` in float64 (inf where ``out`` has a NaN)."""
    if out.isnan().any():
        return math.inf
    scale = ref.abs().max().item() or 1.0
    return (out.double() - ref.double()).abs().max().item() / scale


def check_variant(x: torch.Tensor, w: Any, ref: torch.Tensor, v: Variant) -> float:
    """``v``'s relative error on ``x`` into a NaN-poisoned output, against ``ref``
    (``x @ W.T`` in float64)."""
    out = torch.full((x.shape[0], w.n), float("nan"), dtype=torch.float16, device=x.device)
    launch_variant(x, w, v, out)
    return rel_error(out, ref)


def self_check(device: str) -> list[str]:
    """Every :func:`check_variants` variant at :data:`CHECK_MS` tokens on a
    :data:`CHECK_SHAPE` layer: the failures, each naming variant, M and error."""
    import fp8w_bench as bench

    n, k = CHECK_SHAPE
    w = bench.make_weights(n, k, seed=3, device=device)
    w32 = w.dequantize()
    gen = torch.Generator(device=device).manual_seed(5)
    failures = []
    for v in check_variants():
        ms = (1,) if v.launch.block_m == 1 else CHECK_MS
        for m in ms:
            x = torch.randn(m, k, generator=gen, device=device).half()
            err = check_variant(x, w, x.double() @ w32.double().t(), v)
            if not err <= TOLERANCE:
                failures.append(f"{v.name()} M={m}: error {err:.2e}")
    return failures


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def best_overall(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Variants timed on every (layer, M), by the geometric mean of their speed over fp16
    cuBLAS, fastest first."""
    keys = {(r["n"], r["k"], r["m"]) for r in rows}
    speeds: dict[str, list[float]] = {}
    for r in rows:
        for name, us in r["variants_us"].items():
            speeds.setdefault(name, []).append(r["fp16_us"] / us)
    ranked = [
        {"name": name, "geomean_x_fp16": geomean(xs), "x_fp16": xs}
        for name, xs in speeds.items()
        if len(xs) == len(keys)
    ]
    return sorted(ranked, key=lambda r: -r["geomean_x_fp16"])


def sweep(shapes: Sequence[tuple[int, int]], ms: Sequence[int], out: Path, budget_s: float) -> int:
    """Time fp16 cuBLAS and the table's launch per (layer, M), then each variant on every
    one, until :func:`variants` is done or ``budget_s`` seconds have passed."""
    import fp8w_bench as bench

    from volta_fp8w import ops

    begin = time.perf_counter()
    layers = []
    for n, k in shapes:
        weights = [
            bench.make_weights(n, k, seed=i, device=DEVICE) for i in range(bench.rotation(n * k))
        ]
        dense = [w.dequantize().half() for w in weights[: bench.rotation(2 * n * k)]]
        layers.append((weights, dense, weights[0].dequantize()))
    rows: list[dict[str, Any]] = []
    cases = []
    for weights, dense, w32 in layers:
        for m in ms:
            x = torch.randn(m, weights[0].k, device=DEVICE).half()
            outs = [
                torch.empty(m, weights[0].n, device=DEVICE, dtype=torch.float16) for _ in range(2)
            ]
            sets = [(i,) for i in range(len(weights))]
            row: dict[str, Any] = {"n": weights[0].n, "k": weights[0].k, "m": m}
            row["fp16_us"] = bench.timed_us(
                lambda i, x=x, d=dense: torch.nn.functional.linear(x, d[i % len(d)]), sets
            )
            row["table_us"] = bench.timed_us(
                lambda i, x=x, ws=weights, o=outs: ops.fp8_linear(x, ws[i], out=o[i % 2]), sets
            )
            row["variants_us"], row["errors"] = {}, {}
            rows.append(row)
            cases.append((row, x, weights, x.double() @ w32.double().t(), outs, sets))
            fp16, table = row["fp16_us"], row["table_us"]
            print(
                f"{row['n']}x{row['k']} M={m}: fp16 {fp16:.1f} us, table {table:.1f} us "
                f"({fp16 / table:.2f}x)",
                flush=True,
            )
    record: dict[str, Any] = {"environment": _environment(), "rows": rows, "variants": []}
    todo = variants()
    for i, v in enumerate(todo):
        if time.perf_counter() - begin > budget_s:
            record["cut_short"] = f"{len(todo) - i} of {len(todo)} variants not run (budget)"
            break
        record["variants"].append(v.record())
        line = []
        for row, x, weights, ref, outs, sets in cases:
            try:
                err = check_variant(x, weights[0], ref, v)
                if not err <= TOLERANCE:
                    row["errors"][v.name()] = f"error {err:.2e}"
                    line.append("WRONG")
                    continue
                us = bench.timed_us(
                    lambda j, x=x, ws=weights, o=outs, v=v: launch_variant(x, ws[j], v, o[j % 2]),
                    sets,
                )
            except Exception as exc:  # recorded (a build that does not compile), the sweep goes on
                row["errors"][v.name()] = f"{type(exc).__name__}: {str(exc)[:200]}"
                line.append("err")
                continue
            row["variants_us"][v.name()] = us
            line.append(f"{us:.1f}us {row['fp16_us'] / us:.2f}x")
        print(f"[{time.perf_counter() - begin:.0f}s] {v.name()}: " + ", ".join(line), flush=True)
        record["best"] = best_overall(rows)[:10]
        (out / "fp8w_m16_sweep.json").write_text(json.dumps(record, indent=1, default=str))
    record["best"] = best_overall(rows)[:10]
    (out / "fp8w_m16_sweep.json").write_text(json.dumps(record, indent=1, default=str))
    print(summary(record))
    return 0


def summary(record: dict[str, Any]) -> str:
    """The rows' five fastest variants each, and the best across the layers."""
    lines = []
    for row in record["rows"]:
        ranked = sorted(row["variants_us"].items(), key=lambda kv: kv[1])[:5]
        lines.append(
            f"{row['n']}x{row['k']} M={row['m']}: fp16 {row['fp16_us']:.1f} us, table "
            f"{row['table_us']:.1f} us ({row['fp16_us'] / row['table_us']:.2f}x); fastest: "
            + "; ".join(f"{name} {us:.1f} us ({row['fp16_us'] / us:.2f}x)" for name, us in ranked)
        )
        if row["errors"]:
            lines.append(f"  errors: {row['errors']}")
    for rank in record.get("best", [])[:5]:
        xs = ", ".join(f"{x:.2f}x" for x in rank["x_fp16"])
        lines.append(
            f"best across layers: {rank['name']} geomean {rank['geomean_x_fp16']:.2f}x ({xs})"
        )
    if record.get("best"):
        chosen = next(v for v in record["variants"] if v["name"] == record["best"][0]["name"])
        lines.append(
            f"to adopt: {chosen['launch']}, num_stages={chosen['num_stages']}, "
            f"dot_k={chosen['dot_k']}, swap_ab={chosen['swap_ab']}, words={chosen['words']}"
        )
    if "cut_short" in record:
        lines.append(f"cut short: {record['cut_short']}")
    return "\n".join(lines)


def _environment() -> dict[str, Any]:
    from volta_devkit.bench import environment

    return environment()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for fp8w_m16_sweep.json")
    parser.add_argument("--self-check", action="store_true", help="checks only, a small layer")
    parser.add_argument("--shapes", help="override: N,K;N,K;...")
    parser.add_argument("--ms", help="override: token counts, comma-separated")
    parser.add_argument("--budget-s", type=float, default=130.0, help="stop starting variants")
    args = parser.parse_args(argv)
    if args.self_check:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            os.environ.setdefault("TRITON_INTERPRET", "1")
        begin = time.perf_counter()
        failures = self_check(device)
        print("\n".join(failures) or "all variants correct", end="")
        print(f" ({device}, {time.perf_counter() - begin:.1f} s)")
        return 1 if failures else 0
    if args.out is None:
        parser.error("--out is required (except with --self-check)")
    if not torch.cuda.is_available():
        print("the sweep needs a CUDA GPU (--self-check runs on the CPU)", file=sys.stderr)
        return 2
    shapes = SHAPES
    if args.shapes:
        shapes = tuple(tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";"))
    ms = tuple(int(v) for v in args.ms.split(",")) if args.ms else MS
    args.out.mkdir(parents=True, exist_ok=True)
    return sweep(shapes, ms, args.out, args.budget_s)


if __name__ == "__main__":
    sys.exit(main())
