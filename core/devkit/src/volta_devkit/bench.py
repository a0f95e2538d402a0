"""GPU benchmark harness: event-timed medians judged against ceilings measured in the same run.

A speed claim is a ratio measured in one run on one device: a kernel's bandwidth over the
device's own copy bandwidth, its time over cuBLAS or torch's time. The harness therefore
measures the two ceilings (device-to-device copy, fp16 matmul) in every run, times each case as
the median of many CUDA-event-timed launches after warm-up (or, for decode-sized calls, of
replays of one CUDA graph holding many calls), rotating enough input sets to
exceed the L2 cache (so the cache is not what gets measured), and writes:

* ``<out>/<suite>.json``: device, driver, torch, triton and CUDA versions, ceilings, and per
  case its shape, median/quantile times, GB/s, TFLOP/s and ratios;
* ``<out>/<suite>.png``: the fraction of the ceiling each case reaches and its time;
* a table on stdout, printed last.

A plugin's suite is a module with a function ``cases() -> Iterable[Case]`` (build inputs inside
the ``make_inputs`` callables, not at import), kept in the plugin's ``benchmarks/`` folder,
outside its package. Give it a ``if __name__ == "__main__": raise SystemExit(run_cli(__name__))``
and run ``python plugins/<name>/benchmarks/<suite>.py --out DIR``, or run an importable suite
with ``python -m volta_devkit.bench MODULE --out DIR``. torch, triton and matplotlib are
imported inside. The timing itself (:func:`time_cuda`, :func:`time_cuda_graph`, the input
rotation and the ceilings) is the core's (:mod:`volta_core.kernel_api`), which the
``vllm-volta bench`` command uses too; this module re-exports it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from volta_core.kernel_api import (
    COPY_BYTES,
    MATMUL_N,
    Timing,
    measure_copy_bandwidth,
    measure_fp16_matmul,
    rotation_count,
    time_cuda,
    time_cuda_graph,
)

__all__ = [
    "COPY_BYTES",
    "MATMUL_N",
    "Case",
    "Result",
    "Timing",
    "draw",
    "environment",
    "format_table",
    "load_suite",
    "main",
    "measure_copy_bandwidth",
    "measure_fp16_matmul",
    "rotation_count",
    "run_cases",
    "run_cli",
    "run_suite",
    "time_cuda",
    "time_cuda_graph",
]


@dataclass
class Case:
    """One benchmarked call.

    ``run(*inputs)`` is timed; ``make_inputs()`` builds one fresh input set on the GPU (called
    several times, for rotation). ``bytes_moved`` (each input read once plus each output
    written once) and ``flops`` give GB/s and TFLOP/s; ``baseline`` names another case of the
    suite to report the speed ratio against (for example torch's own implementation).
    """

    name: str
    run: Callable[..., Any]
    make_inputs: Callable[[], Sequence[Any]]
    bytes_moved: int = 0
    flops: int = 0
    shape: Mapping[str, Any] = field(default_factory=dict)
    baseline: str | None = None
    graphed: bool = False
    """Time inside one CUDA graph (:func:`time_cuda_graph`), as vLLM runs decode."""


@dataclass
class Result:
    name: str
    shape: dict[str, Any]
    timing: Timing
    gbps: float | None
    tflops: float | None
    of_copy: float | None
    """Achieved bandwidth over the copy ceiling of the same run."""
    of_matmul: float | None
    """Achieved rate over the fp16 matmul ceiling of the same run."""
    baseline: str | None
    speedup: float | None
    """Baseline's median time over this case's: above 1 is faster than the baseline."""


def environment() -> dict[str, Any]:
    """Device and software versions, recorded with every result."""
    import torch

    props = torch.cuda.get_device_properties(0)
    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
        "driver": _driver_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "python": platform.python_version(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    run = subprocess.run(
        [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return run.stdout.strip().splitlines()[0] if run.returncode == 0 and run.stdout else None


def run_cases(cases: Iterable[Case], copy_gbps: float, matmul_tflops: float) -> list[Result]:
    """Time every case (each with its own rotating input sets) and derive rates and ratios."""
    import torch

    results: list[Result] = []
    for case in cases:
        n_sets = rotation_count(case.bytes_moved)
        input_sets = [tuple(case.make_inputs()) for _ in range(n_sets)]
        timing = (time_cuda_graph if case.graphed else time_cuda)(case.run, input_sets)
        del input_sets
        torch.cuda.empty_cache()
        seconds = timing.median_ms * 1e-3
        gbps = case.bytes_moved / seconds / 1e9 if case.bytes_moved else None
        tflops = case.flops / seconds / 1e12 if case.flops else None
        results.append(
            Result(
                name=case.name,
                shape=dict(case.shape),
                timing=timing,
                gbps=gbps,
                tflops=tflops,
                of_copy=gbps / copy_gbps if gbps is not None else None,
                of_matmul=tflops / matmul_tflops if tflops is not None else None,
                baseline=case.baseline,
                speedup=None,
            )
        )
    by_name = {r.name: r for r in results}
    for r in results:
        if r.baseline is not None:
            if r.baseline not in by_name:
                raise ValueError(f"case {r.name!r} names baseline {r.baseline!r}, not in the suite")
            r.speedup = by_name[r.baseline].timing.median_ms / r.timing.median_ms
    return results


def run_suite(name: str, cases: Iterable[Case], out: Path) -> dict[str, Any]:
    """Measure the ceilings, time the cases, write JSON and PNG under ``out``; return the record.

    The table is printed by :func:`print_table` (the caller prints it last).
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("the benchmark harness needs a CUDA device")
    out.mkdir(parents=True, exist_ok=True)
    copy_gbps, copy_timing = measure_copy_bandwidth()
    matmul_tflops, matmul_timing = measure_fp16_matmul()
    results = run_cases(cases, copy_gbps, matmul_tflops)
    record = {
        "suite": name,
        "environment": environment(),
        "ceilings": {
            "copy_gbps": copy_gbps,
            "copy_bytes_each_way": COPY_BYTES,
            "copy_timing": asdict(copy_timing),
            "fp16_matmul_tflops": matmul_tflops,
            "fp16_matmul_n": MATMUL_N,
            "fp16_matmul_timing": asdict(matmul_timing),
        },
        "results": [asdict(r) for r in results],
    }
    stem = name.replace(".", "_")
    (out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    draw(record, out / f"{stem}.png")
    return record


def draw(record: Mapping[str, Any], path: Path) -> None:
    """Two panels: fraction of the same-run ceiling per case, and median time per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = record["results"]
    names = [r["name"] for r in results]
    fractions = [
        r["of_copy"] if r["of_copy"] is not None else (r["of_matmul"] or 0.0) for r in results
    ]
    colors = ["tab:blue" if r["of_copy"] is not None else "tab:orange" for r in results]
    times = [r["timing"]["median_ms"] for r in results]
    env, ceil = record["environment"], record["ceilings"]
    height = 1.5 + 0.35 * max(1, len(names))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, height), sharey=True)
    ax1.barh(names, fractions, color=colors)
    ax1.axvline(1.0, color="black", linewidth=0.8)
    ax1.set_xlabel(
        f"fraction of ceiling (blue: copy {ceil['copy_gbps']:.0f} GB/s, "
        f"orange: fp16 matmul {ceil['fp16_matmul_tflops']:.0f} TFLOP/s)"
    )
    ax1.invert_yaxis()
    ax2.barh(names, times, color="tab:gray")
    ax2.set_xscale("log")
    ax2.set_xlabel("median time per call (ms, log)")
    fig.suptitle(
        f"{record['suite']}: {env['device']}, driver {env['driver']}, torch {env['torch']}, "
        f"triton {env['triton']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(record: Mapping[str, Any]) -> str:
    """The printed summary: ceilings first, then one line per case."""
    env, ceil = record["environment"], record["ceilings"]
    lines = [
        f"{record['suite']} on {env['device']} (sm {env['capability']}, driver {env['driver']}, "
        f"torch {env['torch']}, triton {env['triton']})",
        f"ceilings: copy {ceil['copy_gbps']:.1f} GB/s, fp16 matmul "
        f"{ceil['fp16_matmul_tflops']:.1f} TFLOP/s",
        f"{'case':<44} {'median ms':>10} {'GB/s':>8} {'of copy':>8} {'TFLOP/s':>8} "
        f"{'of mm':>6} {'vs base':>8}",
    ]

    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for r in record["results"]:
        speedup = fmt(r["speedup"], ".2f") + ("x" if r["speedup"] is not None else "")
        lines.append(
            f"{r['name']:<44} {r['timing']['median_ms']:>10.4f} {fmt(r['gbps'], '.1f'):>8} "
            f"{fmt(r['of_copy'], '.1%'):>8} {fmt(r['tflops'], '.2f'):>8} "
            f"{fmt(r['of_matmul'], '.1%'):>6} {speedup:>8}"
        )
    return "\n".join(lines)


def load_suite(module: str) -> Callable[[], Iterable[Case]]:
    """The ``cases`` function of a suite module, named by its import path."""
    suite = sys.modules["__main__"] if module == "__main__" else importlib.import_module(module)
    cases = getattr(suite, "cases", None)
    if not callable(cases):
        raise SystemExit(f"{module} defines no cases() function: not a benchmark suite")
    return cases


def main(suite: str, out: Path | str) -> dict[str, Any]:
    """Run the suite module ``suite`` (its ``cases()``), write under ``out``, print the table."""
    cases = load_suite(suite)
    if suite == "__main__":  # run as a script or with ``python -m``: record the real name
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        suite = spec.name if spec is not None else Path(sys.argv[0]).stem
    record = run_suite(suite, cases(), Path(out))
    print(format_table(record), flush=True)
    return record


def run_cli(suite: str | None = None, argv: Sequence[str] | None = None) -> int:
    """Command line: ``[SUITE] --out DIR``.

    A suite script ends with ``if __name__ == "__main__": raise SystemExit(run_cli(__name__))``
    so that ``python plugins/<name>/benchmarks/<suite>.py --out DIR`` runs it.
    """
    parser = argparse.ArgumentParser(description="Run a vllm-volta kernel benchmark suite.")
    if suite is None:
        parser.add_argument("suite", help="import path of the suite module")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="output folder")
    args = parser.parse_args(argv)
    main(suite if suite is not None else args.suite, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli())
