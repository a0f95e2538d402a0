"""Which of the recorded GDN launches to compile, and the verdict per kernel.

Every distinct build the family would make for the two models at TP 1, 2 and 4 is 600 and
more (the autotune spaces times the shapes), and on sm_70 ``tl.dot`` becomes unrolled FMAs
(Triton has no Volta MMA path), so a large tile takes ptxas a minute or more: compiling them
all is hours of CPU. A kernel runs on sm_70 when one configuration its autotuner would keep
compiles and fits the 96 KB of shared memory (Triton's autotuner skips the others:
``Autotuner._bench`` in triton/runtime/autotuner.py), so each autotune group is compiled
cheapest first (least FMA work per thread: smallest tiles, most warps, fewest stages) until
one runs; every configuration tried is reported. Register spills do not stop a kernel (it
spills to local memory, cached in L1, and runs slower): they are reported, with the
registers, for the README's table, and the search does not go on for a configuration that
spills less, which would compile every configuration of the kernels whose FMA dots spill.
The shapes change only the head counts, which are index arithmetic (no tile, no shared
memory), so every group is compiled at the headline shape (Qwen3.5-27B, TP 1) and another
shape's group only where its tiles or schedule are new (:func:`tile_key`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from volta_devkit.gate import GateReport, compile_for, compiled
from volta_devkit.launch_capture import Launch, build_key, gate_inputs


@dataclass
class KernelVerdict:
    """One kernel of one phase: the configurations its autotuner would try at the headline
    shape, the reports of those compiled (cheapest first), and whether one fits."""

    kernel: str
    phase: str
    configurations: int
    tried: list[GateReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def fitting(self) -> GateReport | None:
        """The first configuration tried that runs on sm_70, spills or not."""
        return next((r for r in self.tried if runs(r)), None)


def runs(report: GateReport) -> bool:
    """Compiled for the target and within its shared memory, whatever it spills: the gate's
    problems less the spill one."""
    return compiled(report) and all(p.startswith("spills registers") for p in report.problems)


def _work(launch: Launch) -> float:
    """FMA work per thread a configuration asks for, to order the cheapest first: the product
    of its block sizes over its threads, then its pipeline depth."""
    inputs = gate_inputs(launch)
    blocks = [
        v
        for k, v in inputs.constexprs.items()
        if isinstance(v, int) and not isinstance(v, bool) and k.startswith("B") and v > 1
    ]
    return math.prod(blocks) / launch.num_warps + launch.num_stages / 100


def groups(launches: Iterable[Launch]) -> dict[tuple[str, int], list[Launch]]:
    """Launches by (kernel, autotune group), each group without repeated builds."""
    out: dict[tuple[str, int], list[Launch]] = {}
    seen: set[tuple[Any, ...]] = set()
    for launch in launches:
        key = build_key(launch)
        if key in seen:
            continue
        seen.add(key)
        out.setdefault((launch.name, launch.autotune_group), []).append(launch)
    return out


def gate_group(phase: str, launches: list[Launch], capability: int = 70) -> KernelVerdict:
    """Compile ``launches`` (one autotune group) cheapest first until one passes."""
    verdict = KernelVerdict(launches[0].name, phase, len(launches))
    start = time.monotonic()
    for launch in sorted(launches, key=_work):
        inputs = gate_inputs(launch)
        report = compile_for(
            launch.kernel,
            inputs.signature,
            inputs.constexprs,
            num_warps=launch.num_warps,
            num_stages=launch.num_stages,
            capability=capability,
            name=_describe(launch),
            divisible_by_16=inputs.divisible_by_16,
        )
        verdict.tried.append(report)
        if runs(report):
            break
    verdict.seconds = time.monotonic() - start
    return verdict


def tile_key(launch: Launch) -> tuple[Any, ...]:
    """What sizes a build's tiles and schedule (block constexprs, warps, stages), without the
    head counts and strides a shape changes."""
    inputs = gate_inputs(launch)
    blocks = tuple(
        sorted(
            (k, v)
            for k, v in inputs.constexprs.items()
            if k.startswith("B") and isinstance(v, int) and not isinstance(v, bool)
        )
    )
    return (launch.name, blocks, launch.num_warps, launch.num_stages)


def _describe(launch: Launch) -> str:
    inputs = gate_inputs(launch)
    tiles = ", ".join(
        f"{k}={v}"
        for k, v in inputs.constexprs.items()
        if k.startswith(("B", "BLOCK")) and isinstance(v, int) and not isinstance(v, bool)
    )
    return f"{launch.name}[{tiles}, warps={launch.num_warps}, stages={launch.num_stages}]"


def as_record(verdict: KernelVerdict) -> dict[str, Any]:
    """The verdict as the README's table reads it (JSON-ready)."""
    fit = verdict.fitting
    return {
        "kernel": verdict.kernel,
        "phase": verdict.phase,
        "configurations": verdict.configurations,
        "tried": [
            {"config": r.name, "passed": r.passed, "problems": r.problems} for r in verdict.tried
        ],
        "fits": fit is not None,
        "config": fit.name if fit else None,
        "shared_bytes": fit.shared_bytes if fit else None,
        "registers": fit.n_regs if fit else None,
        "spill_bytes": fit.n_spills if fit else None,
        "seconds": round(verdict.seconds, 1),
    }
