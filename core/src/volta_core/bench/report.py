"""A bench report: each timed call beside its estimate, a verdict per kernel family.

Each call's estimate is the serving plugin's cost for the same work (the bytes and FLOPs of
the kernel the plan names, its fallback's where no NVRTC is installed), priced two ways: at
this device's ceilings measured in the same run (copy bandwidth, fp16 cuBLAS and fp32 FMA
matmul rates), which is what the ratio and the verdict judge, so that a V100 and another GPU
are judged alike; and at the rates ``vllm-volta plan`` prices a V100 with
(:data:`~volta_core.kernel_api.V100_RATES`), its own figure for the call. The ratio is
measured time over the estimate: above 1 the kernel is slower than its roofline.

The report holds the device and software (:mod:`volta_core.bench.machine`), every figure with
its unit in its key, and nothing else about the machine or its user.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from volta_core.bench.cases import Planned
from volta_core.host.dispatch import V100_RATES, DeviceRates
from volta_core.kernel_api import Timing
from volta_core.planner.calibration import Family

#: The report's format, for tools that read ``--json``.
SCHEMA = "vllm-volta-bench/1"

#: Median ratios (measured over estimate) bounding each verdict: at most AT_ESTIMATE is
#: "as estimated"; below FASTER the cost model counts more work than the kernel does; above
#: FAR_SLOWER the kernel is worth an issue.
FASTER = 0.8
AT_ESTIMATE = 1.25
FAR_SLOWER = 2.0


@dataclass(frozen=True)
class Ceilings:
    """The device's ceilings measured in this run."""

    copy_gbps: float
    """Device-to-device copy, bytes read plus written, 1e9 B/GB."""
    read_gbps: float
    """A reduction's read of 1 GiB, bytes read."""
    fp16_tflops: float
    """fp16 cuBLAS matmul (the tensor cores)."""
    fp32_tflops: float
    """fp32 cuBLAS matmul without TF32 (the FMA units)."""

    def rates(self, name: str) -> DeviceRates:
        """These ceilings as the rates a roofline prices with (the copy bandwidth as HBM's:
        it counts bytes both ways, as the costs do)."""
        return DeviceRates(
            name, self.copy_gbps * 1e9, self.fp16_tflops * 1e12, self.fp32_tflops * 1e12
        )


@dataclass(frozen=True)
class Measured:
    """One planned call and what timing it gave: a :class:`Timing`, or ``error`` saying why
    there is none. ``timed_in`` says how (``CUDA graph``, or eagerly where capture failed)."""

    planned: Planned
    timing: Timing | None = None
    timed_in: str = ""
    error: str = ""


def _ms(seconds: float) -> float:
    """Milliseconds to six significant digits (a decode kernel takes microseconds)."""
    return float(f"{seconds * 1e3:.6g}")


def kernel_row(measured: Measured, rates: DeviceRates, nvrtc: bool) -> dict[str, Any]:
    """One call of the report: where, what, measured, estimated, ratio and notes."""
    p = measured.planned
    notes = [n for n in (p.note, measured.error) if n]
    row: dict[str, Any] = {
        "model": p.model,
        "family": p.family.value,
        "module": p.module,
        "plugin": p.plugin,
        "served_by": p.served_by,
        "work": p.shape,
        "stage": p.stage or (p.estimate.stage if p.estimate else None),
        "kernel": p.kernel,
    }
    cost = p.estimate.serving(nvrtc) if p.estimate is not None else None
    if cost is None:
        notes.append(f"plugin {p.plugin} gives no cost for this call")
    if p.stage is not None and p.estimate is not None and p.stage != p.estimate.stage:
        notes.append(f"the bench case's stage {p.stage!r} is not the cost's {p.estimate.stage!r}")
    timing = measured.timing
    row["timing"] = asdict(timing) if timing is not None else None
    row["timed_in"] = measured.timed_in or None
    row["estimate_kernel"] = cost.kernel if cost is not None else None
    row["bytes"] = cost.bytes if cost is not None else None
    row["flops"] = cost.flops if cost is not None else None
    row["estimate_ms"] = _ms(cost.seconds(rates)) if cost is not None else None
    row["plan_v100_estimate_ms"] = _ms(cost.seconds(V100_RATES)) if cost is not None else None
    row["bound"] = cost.bound(rates) if cost is not None else None
    ratio = gbps = tflops = None
    if timing is not None and cost is not None and timing.median_ms > 0:
        seconds = timing.median_ms * 1e-3
        estimate = cost.seconds(rates)
        ratio = round(seconds / estimate, 3) if estimate > 0 else None
        gbps = round(cost.bytes / seconds / 1e9, 2)
        tflops = round(cost.flops / seconds / 1e12, 3)
    row["ratio"] = ratio
    row["achieved_gbps"] = gbps
    row["achieved_tflops"] = tflops
    row["notes"] = notes
    return row


def verdict(ratio: float) -> str:
    """What a family's median ratio (measured over estimate) says."""
    if ratio < FASTER:
        return (
            f"faster than estimated ({ratio:.2f}x): the cost model counts more work than "
            "the kernel does"
        )
    if ratio <= AT_ESTIMATE:
        return f"as estimated ({ratio:.2f}x)"
    if ratio <= FAR_SLOWER:
        return f"slower than estimated ({ratio:.2f}x): the roofline is optimistic here"
    return f"far slower than estimated ({ratio:.2f}x): worth an issue with this report"


def verdicts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kernel family (in :class:`Family` order): calls, calls measured, median ratio and
    its verdict."""
    out = []
    for family in Family:
        mine = [r for r in rows if r["family"] == family.value]
        if not mine:
            continue
        ratios = [r["ratio"] for r in mine if r["ratio"] is not None]
        median = round(statistics.median(ratios), 3) if ratios else None
        out.append(
            {
                "family": family.value,
                "calls": len(mine),
                "measured": len(ratios),
                "median_ratio": median,
                "verdict": verdict(median) if median is not None else "not measured",
            }
        )
    return out


def calibration_entry(
    device: dict[str, Any],
    software: dict[str, Any],
    ceilings: Ceilings,
    quick: bool,
    judged: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    """The report as an entry of the calibration table
    (:mod:`volta_core.planner.calibration`): the ceilings the ratios were judged at, and each
    measured family's median ratio with the number of timed calls it is the median of (a
    family none of whose calls was timed has none: it stays as priced)."""
    return {
        "device": device.get("name"),
        "bandwidth_gbps": round(ceilings.copy_gbps, 1),
        "tensor_tflops": round(ceilings.fp16_tflops, 2),
        "fma_tflops": round(ceilings.fp32_tflops, 2),
        "source": f"vllm-volta bench ({'quick' if quick else 'full'}), vllm-volta-core "
        f"{software.get('vllm_volta_core')}",
        "ratios": {
            v["family"]: {"median_ratio": v["median_ratio"], "calls": v["measured"]}
            for v in judged
            if v["median_ratio"] is not None
        },
    }


def untimed_stages(rows: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Each stage the report has calls in but no timing of (none ran: no bench case, a
    failure, the time budget spent), with its calls' notes as the reason."""
    stages: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        stages.setdefault((row["model"], row["module"], row["stage"] or "-"), []).append(row)
    untimed = []
    for (model, module, stage), mine in stages.items():
        if any(r["timing"] is not None for r in mine):
            continue
        notes = dict.fromkeys(note for r in mine for note in r["notes"])
        kernel = mine[0]["kernel"] or mine[0]["estimate_kernel"] or "-"
        untimed.append(
            {
                "model": model,
                "module": module,
                "stage": stage,
                "kernel": kernel,
                "reason": "; ".join(notes) or "no call of it was timed",
            }
        )
    return untimed


def assemble(
    *,
    models: Sequence[str],
    quick: bool,
    device: dict[str, Any],
    software: dict[str, Any],
    ceilings: Ceilings,
    measured: Sequence[Measured],
    unmeasured: Sequence[dict[str, str]],
    seconds: float,
    calibrated: bool,
) -> dict[str, Any]:
    """The whole report, as ``--json`` prints it. ``unmeasured``: the plan's stages no call
    was planned in (:func:`volta_core.bench.cases.unmeasured_paths`); the report's
    ``not_measured`` adds the stages whose calls all went untimed (:func:`untimed_stages`).
    ``calibrated``: whether the calibration table already holds this device (its
    ``calibration`` entry is one, ready to add: :func:`calibration_entry`)."""
    rates = ceilings.rates(str(device.get("name", "this device")))
    nvrtc = software.get("nvrtc") is not None
    rows = [kernel_row(m, rates, nvrtc) for m in measured]
    judged = verdicts(rows)
    return {
        "schema": SCHEMA,
        "models": list(models),
        "quick": quick,
        "device": device,
        "software": software,
        "ceilings": {
            "copy_gbps": round(ceilings.copy_gbps, 1),
            "read_gbps": round(ceilings.read_gbps, 1),
            "fp16_cublas_tflops": round(ceilings.fp16_tflops, 2),
            "fp32_fma_tflops": round(ceilings.fp32_tflops, 2),
        },
        "calibration": calibration_entry(device, software, ceilings, quick, judged),
        "calibrated": calibrated,
        "kernels": rows,
        "not_measured": [*unmeasured, *untimed_stages(rows)],
        "verdicts": judged,
        "seconds": round(seconds, 1),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _work(work: dict[str, int]) -> str:
    """A call's work in a few characters: ``16 tok``, ``16 x ctx 4096`` (a decode of one
    query token a sequence), ``16 x 3 tok, ctx 4096``, ``2048 tok, ctx 2048`` (one chunk)."""
    if "tokens" in work:
        return f"{work['tokens']} tok"
    seqs, q_len, ctx = work["sequences"], work["query_len"], work["context"]
    if q_len == 1:
        return f"{seqs} x ctx {ctx}"
    return f"{q_len} tok, ctx {ctx}" if seqs == 1 else f"{seqs} x {q_len} tok, ctx {ctx}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: int) -> list[str]:
    """Columns as wide as their widest cell (nothing cut: modules differ in their last part);
    the last ``right`` columns, the figures, aligned right."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = []
    for cells in (header, *rows):
        left = len(cells) - right
        pairs = enumerate(zip(cells, widths, strict=True))
        text = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in pairs]
        lines.append(" ".join(text).rstrip())
    return lines


def render_text(report: dict[str, Any]) -> str:
    """The summary to paste: device, versions, ceilings, each call, what was not measured and
    why, the verdicts."""
    d, s, c = report["device"], report["software"], report["ceilings"]
    plugins = ", ".join(f"{name} {label}" for name, label in s["plugins"].items()) or "none"
    lines = [
        f"vllm-volta bench ({'quick' if report['quick'] else 'full'}, {report['seconds']} s): "
        f"{', '.join(report['models'])}",
        f"device: {d['name']} (sm {d['capability']}, {d['sm_count']} SMs, {d['memory_gib']} GiB, "
        f"SM clock max {d.get('sm_clock_max_mhz') or '?'} MHz, memory clock max "
        f"{d.get('memory_clock_max_mhz') or '?'} MHz), driver {d.get('driver') or '?'}, "
        f"{d['gpus']} GPU(s), {d['interconnect']}",
        f"software: vllm-volta-core {s['vllm_volta_core']}, torch {s['torch']} (CUDA "
        f"{s['cuda_runtime']}), Triton {s['triton'] or 'none'}, NVRTC {s['nvrtc'] or 'none'}, "
        f"vLLM {s['vllm'] or 'none'} (family {s['vllm_family'] or 'none'})",
        f"plugins: {plugins}",
        f"ceilings: copy {c['copy_gbps']} GB/s, read {c['read_gbps']} GB/s, fp16 cuBLAS "
        f"{c['fp16_cublas_tflops']} TFLOP/s, fp32 FMA {c['fp32_fma_tflops']} TFLOP/s",
    ]
    header = ("family", "module", "work", "stage", "kernel", "ms", "est ms", "ratio", "V100 ms")
    rows = []
    for r in report["kernels"]:
        median = r["timing"]["median_ms"] if r["timing"] else None
        rows.append(
            (
                r["family"],
                r["module"],
                _work(r["work"]),
                r["stage"] or "-",
                r["kernel"] or r["estimate_kernel"] or "-",
                _fmt(median, ".4f"),
                _fmt(r["estimate_ms"], ".4f"),
                _fmt(r["ratio"], ".2f"),
                _fmt(r["plan_v100_estimate_ms"], ".4f"),
            )
        )
    table = _table(header, rows, right=4)
    lines.append(table[0])
    for row, line in zip(report["kernels"], table[1:], strict=True):
        lines.append(line)
        lines += [f"    note: {note}" for note in row["notes"]]
    lines += [
        f"not measured: {r['module']}: {r['stage']}: {r['kernel']} ({r['reason']})"
        for r in report["not_measured"]
    ]
    lines.append(
        "calibration: this device is in the table"
        if report["calibrated"]
        else "calibration: this device is not in the table yet; the JSON's calibration entry "
        "is one, ready to add"
    )
    lines.append("verdicts (median of measured / estimate at this device's ceilings):")
    for v in report["verdicts"]:
        lines.append(f"  {v['family']}: {v['measured']}/{v['calls']} measured, {v['verdict']}")
    return "\n".join(lines)
