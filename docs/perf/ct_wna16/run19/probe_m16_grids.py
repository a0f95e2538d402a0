"""Probe (H100): is there a 16-token grid on which the skeleton reads at the floor?

``probe_m16.py`` took the shipped 16-token launch apart on its own grid (5120x5120: 20 tiles x
10 splits, 4 input steps a split) and found its loads alone 3 us over the read floor. This
script sweeps the grid instead, with the same skeleton kernels (imported from
``probe_m16.py``, not copied): for the M=16 layers 5120x5120 and 7168x5120, int4, group 128,
symmetric only, and every grid of

* ``BLOCK_N`` in {256, 128} outputs a tile (16 rows, 128 inputs a step, 4 warps),
* a split count in {5, 10, 20, 40} (K=5120: 8, 4, 2 and 1 steps a split; counts that do not
  cut the input into whole, equal numbers of 128-input steps are skipped),
* ``num_stages`` in {3, 2} (a split of fewer steps than ``stages - 1`` is kept and flagged:
  its pipeline prologue issues loads past its input range, predicated off),

it times the skeleton's ``read only``, ``read+dot`` and ``read+dot+tail`` (see
``probe_m16.py``'s docstring for what each does), and once a layer ``shipped``
(``wna16_linear``), the read floor of the packed words (``volta_core.kernels.read_floor``) and
the target (fp16 ``torch.matmul`` by the dequantized weight, as ``bench.measure`` times it,
divided by 2). Every case is timed as ``probe_m16.py`` times it: in one CUDA graph each,
rotating weight copies past L2, best of two alternating rounds (every case once, then every
case again).

Correctness first: the shipped grid is checked once a layer with ``probe_m16.check`` (all
skeleton variants and the shipped launch), and every swept grid, before it is timed, with
:func:`check_grid` (the skeleton part of ``probe_m16.check`` on that grid: the xor variants
exactly, the dot variants against ``probe_m16.dot_reference``).

Run from the repository root (``<root>``)::

    PYTHONPATH=<root>/core/src:<root>/plugins/ct_wna16/src \
        python3 docs/perf/ct_wna16/run19/probe_m16_grids.py

``--block-n``, ``--splits``, ``--stages``: trim the sweep (comma-separated lists).
``--interpret-check``: only the checks, on small layers on CPU in the Triton interpreter (the
script re-runs itself with ``TRITON_INTERPRET=1``), covering both tile widths, several split
counts, a masked layer and both stage counts; prints OK. ``--sass``: compile the skeletons of
every (``BLOCK_N``, stages) of the sweep for sm_90 without a GPU and print registers, spills
and shared memory (the split count and the layer are runtime arguments: one build serves all).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import triton

from volta_core.kernels.bench import time_cuda_graph
from volta_core.kernels.counters import arrival_counters, zeroed_accumulators
from volta_core.kernels.read_floor import read_floor
from volta_ct_wna16 import bench, configs
from volta_ct_wna16.layout import PackedWeights
from volta_ct_wna16.ops import _pair_aligned, dequantize_dense, wna16_linear

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_m16 as base

M = base.M
LAYERS = base.LAYERS
BLOCK_NS = (256, 128)
SPLITS = (5, 10, 20, 40)
STAGES = (3, 2)
#: The skeleton variants timed on every grid, as (name, DOT, TAIL).
VARIANTS = (("read only", False, False), ("read+dot", True, False), ("read+dot+tail", True, True))
#: Small layers for ``--interpret-check``: (n, k, BLOCK_N, splits, stages). 512x1024: 8 input
#: steps; 640x640: 5 steps, 1 a split; 600x640: partial output tiles (the masked build) and a
#: short last split.
INTERPRET_GRIDS = (
    (512, 1024, 256, 2, 3),
    (512, 1024, 256, 8, 2),
    (512, 1024, 128, 2, 2),
    (512, 1024, 128, 4, 3),
    (640, 640, 128, 5, 3),
    (600, 640, 128, 2, 3),
)


def grid_plan(
    n: int, k: int, shipped: base.Plan, block_n: int, splits: int, stages: int, exact: bool = True
) -> base.Plan | None:
    """The shipped launch with ``block_n`` outputs a tile, ``stages`` stages and ``splits``
    splits of a whole number of input steps each (as ``probe_m16.plan`` cuts a forced count).
    ``exact``: None unless the count cuts the input into ``splits`` equal splits."""
    launch = replace(shipped.launch, block_n=block_n, num_stages=stages)
    bk = launch.block_k
    k_blocks = -(-k // bk)
    if splits > k_blocks:
        return None
    steps = -(-k_blocks // splits)
    count = -(-k // (steps * bk))
    if exact and (count != splits or steps * splits != k_blocks or k % bk):
        return None
    return base.Plan(n, k, M, launch, count, steps * bk, shipped.group)


def check_grid(x: torch.Tensor, pw: PackedWeights, p: base.Plan) -> None:
    """The skeleton part of ``probe_m16.check`` on ``p``'s grid (no shipped launch: it has its
    own grid): ``read only`` per split and ``read+tail`` summed, exactly against
    ``probe_m16.xor_partials``; ``read+dot`` and ``read+dot+tail`` against
    ``probe_m16.dot_reference``; the accumulators and counters back at zero."""
    dev = x.device
    ln = p.launch
    label = (
        f"{p.n}x{p.k} BLOCK_N={ln.block_n} {p.splits} splits {ln.num_stages} stages"
        f"{'' if p.whole else ' masked'}"
    )
    out = torch.full((p.m, p.n), float("nan"), dtype=torch.float16, device=dev)
    part = torch.full((p.splits, p.m, p.n), float("nan"), dtype=torch.float32, device=dev)
    want = base.xor_partials(x, pw, p)
    base.skeleton(x, pw, p, dot=False, tail=False, out=out, part=part)
    torch.testing.assert_close(part, want, rtol=0, atol=0, msg=lambda s: f"read only {label}: {s}")
    base.skeleton(x, pw, p, dot=False, tail=True, out=out, part=part)
    torch.testing.assert_close(
        out.float(), want.sum(0).half().float(), rtol=0, atol=0,
        msg=lambda s: f"read+tail {label}: {s}",
    )  # fmt: skip
    ref = base.dot_reference(x, pw, p)
    part.fill_(float("nan"))
    base.skeleton(x, pw, p, dot=True, tail=False, out=out, part=part)
    err = base.rel_error(part.double().sum(0), ref)
    if err > base.FP32_TOLERANCE:
        raise AssertionError(f"read+dot {label}: relative error {err:.2e}")
    out.fill_(float("nan"))
    base.skeleton(x, pw, p, dot=True, tail=True, out=out, part=part)
    err = base.rel_error(out, ref)
    if err > base.FP16_TOLERANCE:
        raise AssertionError(f"read+dot+tail {label}: relative error {err:.2e}")
    ws = zeroed_accumulators(dev, p.m * p.n)
    counters = arrival_counters(dev, p.grid[0] * p.grid[1])
    if bool(ws.any()) or bool(counters.any()):
        raise AssertionError(f"{label}: accumulators or counters left non-zero")


def interpret_check() -> int:
    """:func:`check_grid` on small layers in the Triton interpreter, on grids of the SM90
    launch, and ``probe_m16.check`` (shipped launch included) on its shipped grid once."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        env = dict(os.environ, TRITON_INTERPRET="1")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    print(f"interpreter: torch {torch.__version__}, triton {triton.__version__}", flush=True)
    # As probe_m16.interpret_check: the masked build's last arriver's masked-off lanes.
    warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
    shipped = base.plan(512, 1024, base.SM90_CAPABILITY, base.H100_SMS, splits=2)
    print(f"shipped grid: {shipped.describe()}", flush=True)
    pw = base.cpu_weights(512, 1024, True, seed=1536)
    x = _pair_aligned(torch.randn(M, 1024, generator=torch.Generator().manual_seed(1)).half())
    base.check(x, pw, shipped, shipped_launch=True)
    print("  sym OK (all variants and shipped)", flush=True)
    for n, k, block_n, splits, stages in INTERPRET_GRIDS:
        shipped = base.plan(n, k, base.SM90_CAPABILITY, base.H100_SMS)
        p = grid_plan(n, k, shipped, block_n, splits, stages, exact=False)
        if p is None or p.splits != splits:
            raise AssertionError(f"{n}x{k}: no grid of {splits} splits")
        print(p.describe(), flush=True)
        pw = base.cpu_weights(n, k, True, seed=n + k)
        gen = torch.Generator().manual_seed(k + splits)
        x = _pair_aligned(torch.randn(M, k, generator=gen).to(torch.float16))
        check_grid(x, pw, p)
        print("  sym OK", flush=True)
    for n, k in LAYERS:
        shipped = base.plan(n, k, base.SM90_CAPABILITY, base.H100_SMS)
        print("H100 shipped:", shipped.describe())
    print("OK")
    return 0


def sass_report(block_ns: tuple[int, ...], stages_list: tuple[int, ...]) -> int:
    """Compile the symmetric skeletons of every (``BLOCK_N``, stages) for sm_90 (no GPU)."""
    from volta_core.kernels.gate import compile_for

    sk_sig = {**configs._SPLITK_SIG, "part_ptr": "*fp32"}
    divisible = configs._SPLITK_DIVISIBLE
    n, k = LAYERS[0]
    shipped = base.plan(n, k, base.SM90_CAPABILITY, base.H100_SMS)
    for block_n in block_ns:
        for stages in stages_list:
            p = grid_plan(n, k, shipped, block_n, SPLITS[0], stages, exact=False)
            assert p is not None
            ln = p.launch
            for name, dot, tail in (*VARIANTS, ("read+tail", False, True)):
                const = {
                    "HAS_ZP": False, "HAS_BIAS": False, "BLOCK_M": ln.block_m,
                    "BLOCK_N": ln.block_n, "BLOCK_K": ln.block_k, "NUM_STAGES": ln.num_stages,
                    "WHOLE": p.whole, "DOT": dot, "TAIL": tail,
                }  # fmt: skip
                rep = compile_for(
                    base.skeleton_kernel, sk_sig, const, num_warps=ln.num_warps,
                    num_stages=ln.num_stages, capability=90, name=name, divisible_by_16=divisible,
                )  # fmt: skip
                hist = rep.sass_histogram
                ops = " ".join(f"{op} {hist.get(op, 0)}" for op in base.SASS_OPCODES)
                print(
                    f"BLOCK_N={block_n:<3} stages {stages} {name:<14} regs {rep.n_regs} spills "
                    f"{rep.n_spills} shared {rep.shared_bytes} SASS {sum(hist.values())} | {ops}"
                    + "".join(f"\n    problem: {pr}" for pr in rep.problems),
                    flush=True,
                )
    return 0


@dataclass
class Layer:
    """One layer's reference figures (us)."""

    name: str
    shipped: str
    shipped_us: float
    floor: float
    target: float


@dataclass
class Row:
    layer: str
    plan: base.Plan
    times: dict[str, float]

    @property
    def steps(self) -> int:
        return self.plan.per_split // self.plan.launch.block_k


def time_layer(
    n: int,
    k: int,
    cap: tuple[int, int],
    sms: int,
    block_ns: tuple[int, ...],
    split_counts: tuple[int, ...],
    stages_list: tuple[int, ...],
) -> tuple[Layer, list[Row]]:
    """Check, then time every grid of the sweep on one symmetric layer, with ``shipped``, the
    fp16 product and the read floor (best of two alternating rounds)."""
    copies = max(2, min(bench.MAX_COPIES, -(-bench.ROTATE_BYTES // (n * k // 2))))
    pws = bench.weights(n, k, True, copies)
    shipped = base.plan(n, k, cap, sms)
    tag = f"{n}x{k}"
    print(f"{tag} shipped: {shipped.describe()}", flush=True)
    x = torch.randn(M, k, device="cuda", dtype=torch.float16)
    base.check(x, pws[0], shipped)
    print(f"{tag} shipped grid: checks OK", flush=True)
    plans: list[base.Plan] = []
    for block_n in block_ns:
        for splits in split_counts:
            for stages in stages_list:
                p = grid_plan(n, k, shipped, block_n, splits, stages)
                if p is None:
                    print(f"{tag} BLOCK_N={block_n} {splits} splits: not whole steps, skipped")
                    continue
                check_grid(x, pws[0], p)
                print(f"{tag} checks OK: {p.describe()}", flush=True)
                plans.append(p)
    outs = [torch.empty(M, n, device="cuda", dtype=torch.float16) for _ in range(2)]
    part = torch.empty((max(p.splits for p in plans), M, n), device="cuda")

    def variant(p: base.Plan, dot: bool, tail: bool) -> Callable[[int], None]:
        def fn(i: int) -> None:
            base.skeleton(x, pws[i], p, dot=dot, tail=tail, out=outs[i % 2], part=part)

        return fn

    def shipped_fn(i: int) -> None:
        wna16_linear(x, pws[i], out=outs[i % 2])

    fp16_copies = max(1, min(bench.MAX_COPIES, -(-bench.ROTATE_BYTES // (n * k * 2))))
    dense = [dequantize_dense(pw, torch.float16).t().contiguous() for pw in pws[:fp16_copies]]

    def fp16(i: int) -> None:
        torch.matmul(x, dense[i].t(), out=outs[i % 2])

    # Keys: (grid index, variant); the layer's references under index -1.
    cases: dict[tuple[int, str], tuple[Callable[[int], None], int]] = {
        (-1, "shipped"): (shipped_fn, len(pws)),
        (-1, "fp16"): (fp16, len(dense)),
    }
    for j, p in enumerate(plans):
        for name, dot, tail in VARIANTS:
            cases[(j, name)] = (variant(p, dot, tail), len(pws))
    best: dict[tuple[int, str], float] = {}
    for rnd in range(2):
        start = time.monotonic()
        for (j, name), (fn, sets) in cases.items():
            us = time_cuda_graph(fn, [(i,) for i in range(sets)], replays=bench.REPLAYS)
            best[(j, name)] = min(best.get((j, name), float("inf")), us.median_ms * 1e3)
            what = name
            if j >= 0:
                ln = plans[j].launch
                what = f"BLOCK_N={ln.block_n} {plans[j].splits} splits {ln.num_stages} st {name}"
            print(f"{tag} round {rnd} {what}: {us.median_ms * 1e3:.2f} us", flush=True)
        print(f"{tag} round {rnd}: {len(cases)} cases, {time.monotonic() - start:.1f} s")
    dense.clear()
    floor = read_floor([pw.qweight for pw in pws]).median_ms * 1e3
    print(f"{tag} read floor: {floor:.2f} us", flush=True)
    g = shipped.grid
    ln = shipped.launch
    grid = f"{g[0] * g[1]} x {g[2]}, BLOCK_N={ln.block_n}, {ln.num_stages} stages"
    layer = Layer(tag, grid, best[(-1, "shipped")], floor, best[(-1, "fp16")] / 2.0)
    rows = [
        Row(tag, p, {name: best[(j, name)] for name, _, _ in VARIANTS}) for j, p in enumerate(plans)
    ]
    return layer, rows


def table(layer: Layer, rows: list[Row]) -> str:
    names = [name for name, _, _ in VARIANTS]
    head = ["layer", "BLOCK_N", "splits", "steps/split", "stages", "programs", *names]
    lines = [
        f"{layer.name}: shipped ({layer.shipped}) {layer.shipped_us:.2f} us, read floor "
        f"{layer.floor:.2f} us, target (fp16/2) {layer.target:.2f} us",
        "| " + " | ".join(head) + " |",
        "|" + " --- |" * len(head),
    ]
    for r in rows:
        ln, g = r.plan.launch, r.plan.grid
        flag = "*" if ln.num_stages > r.steps + 1 else ""
        cells = [r.layer, str(ln.block_n), str(r.plan.splits), str(r.steps)]
        cells += [f"{ln.num_stages}{flag}", str(g[0] * g[1] * g[2])]
        for name in names:
            t = r.times[name]
            mark = " <" if name == "read+dot+tail" and t < layer.target else ""
            cells.append(f"{t:.2f}{mark}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--interpret-check", action="store_true", help="CPU interpreter checks only")
    mode.add_argument("--sass", action="store_true", help="sm_90 compile report only (no GPU)")
    parser.add_argument("--block-n", type=_ints, default=BLOCK_NS, help="e.g. 256,128")
    parser.add_argument("--splits", type=_ints, default=SPLITS, help="e.g. 5,10,20,40")
    parser.add_argument("--stages", type=_ints, default=STAGES, help="e.g. 3,2")
    args = parser.parse_args(argv)
    if args.interpret_check:
        return interpret_check()
    if args.sass:
        return sass_report(args.block_n, args.stages)
    wall = time.monotonic()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    cap = torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"capability {cap}, {sms} SMs", flush=True)
    results = []
    for n, k in LAYERS:
        results.append(time_layer(n, k, cap, sms, args.block_n, args.splits, args.stages))
        torch.cuda.empty_cache()
    print(
        f"\n== M={M}, int4 g128 sym, skeleton on swept grids, us (best of two alternating "
        "rounds; '*': stages > steps + 1; '<': read+dot+tail under the target)"
    )
    for layer, rows in results:
        print()
        print(table(layer, rows))
    print(f"\nwall {time.monotonic() - wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
