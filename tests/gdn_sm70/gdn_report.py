"""Record the installed family's GDN launches, gate them for sm_70, write the report (JSON).

    python tests/gdn_sm70/gdn_report.py OUT.json

Run by test_gdn_sm70.py in a child process without ``TRITON_INTERPRET`` (the devkit's pytest
plugin sets it on a machine with no GPU, and interpreted kernels do not compile): the family's
modules must be loaded, and their kernels defined, with the compiler on.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import gdn_gate
import gdn_launches


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (ptxas, the disassembler): the
    compile cost without the wait for a shared machine's cores."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def report() -> dict[str, Any]:
    from volta_core.vllm import families

    start, cpu = time.monotonic(), _cpu_seconds()
    family = gdn_launches.load_family()
    recorded = {shape: gdn_launches.record(family, shape) for shape in gdn_launches.shapes()}
    loaded_s = time.monotonic() - start
    headline = gdn_launches.shapes()[0]
    verdicts = []
    done: set[tuple[str, ...]] = set()
    tiles_done: set[tuple[Any, ...]] = set()
    for shape, phases in recorded.items():
        for phase, launches in phases.items():
            for group in gdn_gate.groups(launches).values():
                key = tuple(sorted(repr(gdn_gate.build_key(launch)) for launch in group))
                tiles = {gdn_gate.tile_key(launch) for launch in group}
                # The headline shape's groups all; another shape's only where its tiles are
                # new (1Cat-vLLM's recurrent BV follows the head count), not its head counts.
                if key in done or (shape != headline and tiles <= tiles_done):
                    continue
                done.add(key)
                tiles_done |= tiles
                verdicts.append(gdn_gate.gate_group(f"{phase} ({shape.label})", group))
    installed = families.installed_vllm()
    found = families.family_of(installed)
    return {
        "family": found.name if found else "outside every family",
        "vllm": " ".join(installed or ("none",)),
        "root": str(family.root),
        "shape": headline.label,
        "launched": {
            shape.label: {phase: sorted({x.name for x in xs}) for phase, xs in phases.items()}
            for shape, phases in recorded.items()
        },
        "builds_per_shape": {
            shape.label: len({gdn_gate.build_key(x) for xs in phases.values() for x in xs})
            for shape, phases in recorded.items()
        },
        "load_and_record_seconds": round(loaded_s, 1),
        "seconds": round(time.monotonic() - start, 1),
        "cpu_seconds": round(_cpu_seconds() - cpu, 1),
        "kernels": [gdn_gate.as_record(v) for v in verdicts],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: gdn_report.py OUT.json", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(json.dumps(report(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
