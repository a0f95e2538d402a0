"""Run vLLM's Gated DeltaNet (FLA) kernels, as each family ships them, with their sm_70
configurations on a GPU, against a float64 reference of the recurrence, and time them.

    python tests/gdn_sm70/fla_stage.py                  # here: stage the families' sources
    python tests/gdn_sm70/gpu_fla.py --out $OUT/gdn     # on the GPU machine
    TRITON_INTERPRET=1 python tests/gdn_sm70/gpu_fla.py --out /tmp/gdn --smoke   # no GPU

Per family staged in ``tests/gdn_sm70/.staged`` (vLLM 0.19.1, 1Cat-vLLM, vLLM 0.33.0), loaded
as on a V100 (``fla_standalone``: its SM70 schedules, each autotuner left with the one
configuration the sm_70 gate found to build and fit, ``docs/perf/gdn/<family>.json``), at
Qwen3.5-27B's GDN shapes per rank at TP 1 and 2 (from the planner's bundled example) and a
small one (2 key heads, 4 value heads: flash-linear-attention's own test heads), the calls of
``fla_cases``: checked against ``gdn_reference``, then timed.

The GPU runs the sm_70 *configurations* (tiles, warps, stages) compiled for itself: the
times are that GPU's, not a V100's. Triton's compiles dominate the run, so the checks run one
process per family and shape in parallel (``--jobs``); the timings then run one family at a
time, alone on the GPU, from the compiled kernels Triton cached. Writes ``gdn_fla.json`` and
``gdn_fla.txt`` under ``--out`` (each worker's log under ``parts/``); exits 1 if any check
fails or any worker dies.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fla_cases  # noqa: E402
import fla_stage  # noqa: E402
import fla_standalone  # noqa: E402
import torch  # noqa: E402
from fla_cases import Shape  # noqa: E402

REPORTS = fla_stage.REPO / "docs/perf/gdn"
EXAMPLE = fla_stage.REPO / "core/src/volta_core/planner/examples/qwen3.5-27b-w4a16.json"


def shapes(smoke: bool) -> list[Shape]:
    """Qwen3.5-27B's GDN heads per rank at TP 1 and 2, and a small shape (``smoke``: a tiny
    one for the interpreter)."""
    if smoke:
        return [Shape("tiny", 1, 2, 64, 64)]
    config = json.loads(EXAMPLE.read_text())
    config = config.get("config", config)
    text = config.get("text_config", config)
    out = []
    for tp in (1, 2):
        out.append(
            Shape(
                f"27B TP{tp}",
                int(text["linear_num_key_heads"]) // tp,
                int(text["linear_num_value_heads"]) // tp,
                int(text["linear_key_head_dim"]),
                int(text["linear_value_head_dim"]),
            )
        )
    return [*out, Shape("small", 2, 4, 128, 128)]


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if os.environ.get("TRITON_INTERPRET") == "1":
        return torch.device("cpu")
    raise RuntimeError("no GPU here; set TRITON_INTERPRET=1 (with --smoke) to run on the CPU")


def _load(family: str) -> tuple[fla_standalone.Family, fla_standalone.Forced]:
    on_gpu = torch.cuda.is_available()
    with fla_standalone.as_v100():
        loaded = fla_standalone.load(fla_stage.STAGED / family, family, on_gpu)
    return loaded, fla_standalone.force_configs(loaded, REPORTS / f"{family}.json")


# -- workers (one process each) ---------------------------------------------------------------


def work(kind: str, family: str, shape_labels: list[str], smoke: bool, reps: int) -> dict:
    """Check (``kind`` "check") or time ("time") every case of ``family`` at the shapes."""
    device = _device()
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    loaded, forced = _load(family)
    results = []
    with fla_standalone.as_v100():
        target = fla_standalone.compile_target(capability) if capability else "Triton interpreter"
        for shape in (s for s in shapes(smoke) if s.label in shape_labels):
            for case in fla_cases.cases(smoke):
                row: dict[str, Any] = {"shape": shape.label, "op": case.op, "case": case.label}
                start = time.monotonic()
                try:
                    if kind == "check":
                        row |= fla_cases.check(loaded, shape, case, device)
                    else:
                        row |= fla_cases.time_case(loaded, shape, case, device, reps)
                except Exception as exc:
                    traceback.print_exc()
                    row |= {"passed": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
                row["seconds"] = round(time.monotonic() - start, 2)
                print(json.dumps(row), flush=True)
                results.append(row)
    return {
        "family": family,
        "distribution": loaded.manifest["distribution"],
        "compiled_for": target,
        "forced": forced.forced,
        "not_forced": forced.not_forced,
        "rows": results,
    }


#: Seconds a worker may run: a check worker compiles its family's kernels for one shape, a
#: timing worker loads them from Triton's cache (per shape); and the whole run's limit, so
#: that a hung worker still leaves time for the report inside a 10-minute device call.
TIMEOUTS = {"check": 240, "time": 45}
BUDGET_S = 540


def _scale(opts: argparse.Namespace) -> float:
    """The time limits' factor: the interpreter (``--smoke``) runs a kernel far slower."""
    return float(opts.timeout_scale or (4 if opts.smoke else 1))


def _spawn(args: list[str], log: Path, timeout: float) -> int | str:
    """Run this script with ``args``, output to ``log``: its exit status, or why none."""
    with log.open("wb") as out:
        try:
            return subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
                timeout=timeout,
            ).returncode
        except subprocess.TimeoutExpired:
            return f"killed after {timeout:.0f} s"


def _worker_result(
    kind: str, family: str, labels: list[str], opts: argparse.Namespace, deadline: float
) -> dict:
    parts = opts.out / "parts"
    tag = f"{kind}-{family}-{'_'.join(labels).replace(' ', '')}"
    result = parts / f"{tag}.json"
    args = [kind, "--family", family, "--out", str(result), "--reps", str(opts.reps)]
    args += ["--shape", *labels] + (["--smoke"] if opts.smoke else [])
    limit = TIMEOUTS[kind] * (len(labels) if kind == "time" else 1) * _scale(opts)
    timeout = min(limit, deadline - time.monotonic())
    status = (
        _spawn(["--worker", *args], parts / f"{tag}.log", timeout)
        if timeout > 5
        else "not run: the run's time limit was reached"
    )
    if not (parts / f"{tag}.log").is_file():
        (parts / f"{tag}.log").write_text(f"{status}\n")
    if status != 0 or not result.is_file():
        tail = (parts / f"{tag}.log").read_text(errors="replace")[-2000:]
        return {
            "kind": kind,
            "family": family,
            "shapes": labels,
            "crashed": status,
            "log_tail": tail,
        }
    return dict(json.loads(result.read_text()))


# -- the report -------------------------------------------------------------------------------


def merge(checks: list[dict], timings: list[dict], device: str) -> dict[str, Any]:
    """One report: per family, its forced configurations and each case's check and times."""
    families: dict[str, dict[str, Any]] = {}
    crashed = []
    for part in checks:
        if "crashed" in part:
            crashed.append(part)
            continue
        fam = families.setdefault(
            part["family"],
            {k: part[k] for k in ("distribution", "compiled_for", "forced", "not_forced")}
            | {"rows": []},
        )
        fam["rows"] += part["rows"]
    for part in timings:
        if "crashed" in part:
            crashed.append(part)
            continue
        times = {(r["shape"], r["op"], r["case"]): r for r in part["rows"]}
        for row in families.get(part["family"], {}).get("rows", []):
            timed = times.get((row["shape"], row["op"], row["case"]), {})
            row["time"] = {
                k: v
                for k, v in timed.items()
                if k in ("eager_ms", "graph_ms", "graph_error", "error")
            }
    rows = [r for fam in families.values() for r in fam["rows"]]
    return {
        "device": device,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "note": (
            "sm_70 configurations (tiles, warps, stages; 1Cat-vLLM's SM70 schedules) compiled "
            "for and run on this GPU: correctness of the kernels as configured for a V100, "
            "times of this GPU, not a V100's"
        ),
        "bounds": fla_cases.BOUNDS,
        "families": families,
        "crashed": crashed,
        "passed": bool(rows)
        and all(r.get("passed") for r in rows)
        and not any(p["kind"] == "check" for p in crashed),
    }


def _ms(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "-"


def table(report: dict[str, Any]) -> str:
    """The report as text: one line per case, then each family's configurations."""
    lines = [
        f"GDN (FLA) kernels with their sm_70 configurations on {report['device']} "
        f"(torch {report['torch']}, Triton {report['triton']}); times are this GPU's, not a V100's",
        "errors: RMS / max of |kernel - float64 reference|, relative to the reference's RMS / max",
        "",
        f"{'family':7} {'shape':9} {'op':38} {'case':18} {'o rms':>8} {'o max':>8} "
        f"{'S rms':>8} {'S max':>8} {'ok':4} {'eager ms':>9} {'graph ms':>9}",
    ]
    for name, fam in report["families"].items():
        for r in fam["rows"]:
            err = r.get("errors", {})
            cells = [
                f"{err[k][m]:8.1e}" if k in err else f"{'-':>8}"
                for k in ("o", "state")
                for m in ("rms_rel", "max_rel")
            ]
            t = r.get("time", {})
            lines.append(
                f"{name:7} {r['shape']:9} {r['op']:38} {r['case']:18} {' '.join(cells)} "
                f"{'yes' if r.get('passed') else 'NO':4} {_ms(t.get('eager_ms')):>9} "
                f"{_ms(t.get('graph_ms')):>9}" + (f"  {r['error']}" if "error" in r else "")
            )
    failed_captures = {
        f"{name} {r['op']}: {r['time']['graph_error']}"
        for name, fam in report["families"].items()
        for r in fam["rows"]
        if "graph_error" in r.get("time", {})
    }
    lines += [f"CUDA graph capture failed: {x}" for x in sorted(failed_captures)]
    for name, fam in report["families"].items():
        lines += [
            "",
            f"{name} ({fam['distribution']}), compiled for {fam['compiled_for']}: "
            "configurations forced (the sm_70 gate's)",
        ]
        lines += [f"  {c}" for c in fam["forced"].values()]
        launched = sorted({x for r in fam["rows"] for x in r.get("launches", [])})
        lines += ["  launched:"] + [f"    {x}" for x in launched]
        names = {x.split("[")[0] for x in launched}
        lines += [
            f"  launched, autotuned, not forced: {k} ({v})"
            for k, v in fam["not_forced"].items()
            if k in names
        ]
    for part in report["crashed"]:
        lines += [
            "",
            f"CRASHED: {part['kind']} worker of {part['family']} {part['shapes']} "
            f"(exit {part['crashed']})",
        ]
        lines += ["  " + x for x in part["log_tail"].splitlines()[-15:]]
    verdict = "every check PASSED" if report["passed"] else "FAILED"
    if report["passed"] and report["crashed"]:
        verdict += ", but a timing worker died"
    lines += ["", verdict]
    return "\n".join(lines) + "\n"


def run_all(opts: argparse.Namespace) -> int:
    families = opts.family or [f for f in fla_stage.FAMILIES if (fla_stage.STAGED / f).is_dir()]
    missing = [f for f in families if not (fla_stage.STAGED / f / "manifest.json").is_file()]
    if not families or missing:
        print(
            f"families not staged: {missing or list(fla_stage.FAMILIES)}; "
            "run: python tests/gdn_sm70/fla_stage.py",
            file=sys.stderr,
        )
        return 2
    device = _device()
    device_name = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (interpreter)"
    )
    (opts.out / "parts").mkdir(parents=True, exist_ok=True)
    known = [s.label for s in shapes(opts.smoke)]
    labels = [label for label in known if not opts.shape or label in opts.shape]
    if not labels:
        print(f"no shape {opts.shape}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    start = time.monotonic()
    deadline = start + BUDGET_S * _scale(opts)
    tasks = [(f, [label]) for f in families for label in labels]
    with ThreadPoolExecutor(max_workers=opts.jobs or min(len(tasks), os.cpu_count() or 1)) as pool:
        checks = list(
            pool.map(lambda t: _worker_result("check", t[0], t[1], opts, deadline), tasks)
        )
    checked_s = time.monotonic() - start
    timings = [_worker_result("time", f, labels, opts, deadline) for f in families]
    report = merge(checks, timings, device_name)
    report["seconds"] = {"checks": round(checked_s, 1), "total": round(time.monotonic() - start, 1)}
    (opts.out / "gdn_fla.json").write_text(json.dumps(report, indent=1) + "\n")
    text = table(report)
    (opts.out / "gdn_fla.txt").write_text(text)
    print(text + f"checks {checked_s:.0f} s, total {time.monotonic() - start:.0f} s")
    return 0 if report["passed"] and not report["crashed"] else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the report")
    parser.add_argument(
        "--family", nargs="+", choices=fla_stage.FAMILIES, help="default: all staged"
    )
    parser.add_argument("--shape", nargs="+", help="shape labels (default: all)")
    parser.add_argument("--smoke", action="store_true", help="tiny shape, for TRITON_INTERPRET=1")
    parser.add_argument("--jobs", type=int, default=0, help="parallel check processes")
    parser.add_argument("--reps", type=int, help="timed calls per case (20; --smoke: 1)")
    parser.add_argument(
        "--timeout-scale", type=float, help="times the workers' time limits (1; --smoke: 4)"
    )
    parser.add_argument("--worker", choices=("check", "time"), help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    opts.reps = opts.reps or (1 if opts.smoke else 20)
    try:
        if opts.worker:
            result = work(opts.worker, opts.family[0], opts.shape, opts.smoke, opts.reps)
            opts.out.write_text(json.dumps(result) + "\n")
            return 0
        return run_all(opts)
    except (RuntimeError, FileNotFoundError) as exc:
        print(f"gpu_fla: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
