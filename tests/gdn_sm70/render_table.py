"""Render the README's GDN-on-sm_70 table from the reports test_gdn_sm70.py wrote.

    VOLTA_GDN_SM70_REPORT=docs/perf/gdn/<family>.json <family python> -m pytest tests/gdn_sm70
    python tests/gdn_sm70/render_table.py [REPORT.json ...] [--write README.md]

The reports default to :data:`REPORTS` (0.19.1, 1Cat-vLLM, 0.33.0), in the README's order.
Each kernel's "estimated time (SM70)" is the planner's (:mod:`volta_core.planner.linear_attention`,
the one cost model the plan's speed estimate prices the same layers with) at the row's shape of
Qwen3.5-27B (the planner's bundled example): a decode step of the row's batch, or a prefill
chunk of the plan's default ``--max-num-batched-tokens`` (2048, vLLM's default chunk). With
``--write``, the table replaces what lies between the README's two ``<!-- gdn-sm70-table -->``
markers; otherwise it is printed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

from volta_core.host.dispatch import KernelCost
from volta_core.planner import linear_attention as gdn
from volta_core.planner.fit import DEFAULT_MAX_NUM_BATCHED_TOKENS
from volta_core.planner.model import read_config

MARKER = "<!-- gdn-sm70-table -->"
ROOT = Path(__file__).resolve().parents[2]
#: The family reports the README's table shows, in its order.
REPORTS = tuple(ROOT / "docs/perf/gdn" / name for name in ("0.19.json", "1cat.json", "0.33.json"))
#: The model the estimates are for, as the reports name it, and its planner example.
MODEL, EXAMPLE = "27B", "qwen3.5-27b-w4a16"
#: A row's phase: ``prefill (27B TP1)``, ``decode8 (27B TP2)``.
PHASE = re.compile(r"^(prefill|decode(\d+)) \((\S+) TP(\d+)\)$")


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:.1f} KB"


def _text() -> SimpleNamespace:
    _, raw = read_config(EXAMPLE)
    return SimpleNamespace(**raw.get("text_config", raw))


def _shape(tp: int) -> gdn.GdnShape:
    """Qwen3.5-27B's GDN layer on one of ``tp`` ranks, fp16 activations (a V100 has no bf16)."""
    return gdn.GdnShape.of(_text(), tp, act_bytes=2)


def _time(cost: KernelCost) -> str:
    return f"{cost.seconds() * 1e6:.1f} us ({cost.bound()})"


def estimate(kernel: str, phase: str) -> str:
    """The planner's SM70 time for ``kernel`` in the row's ``phase``, or "-" where the row is
    not Qwen3.5-27B's or the planner does not model the kernel."""
    match = PHASE.match(phase)
    if match is None or match.group(3) != MODEL:
        return "-"
    shape = _shape(int(match.group(4)))
    try:
        if match.group(2) is None:
            return _time(gdn.prefill_kernel(kernel, shape, DEFAULT_MAX_NUM_BATCHED_TOKENS))
        return _time(gdn.decode_kernel(kernel, shape, int(match.group(2))))
    except ValueError:
        return "-"


def totals() -> str:
    """The planner's whole-layer and whole-model figures for Qwen3.5-27B, TP 1, 2 and 4."""
    layers = sum(t == "linear_attention" for t in _text().layer_types)
    chunk = DEFAULT_MAX_NUM_BATCHED_TOKENS
    decode, prefill = [], []
    for tp in (1, 2, 4):
        s = _shape(tp)
        step = sum(c.seconds() for c in gdn.decode_step(s, 1))
        part = sum(c.seconds() for c in gdn.prefill_chunk(s, chunk))
        decode.append(f"{step * 1e6:.1f} us (x{layers}: {layers * step * 1e3:.2f} ms) at TP{tp}")
        prefill.append(f"{part * 1e3:.2f} ms (x{layers}: {layers * part * 1e3:.1f} ms) at TP{tp}")
    return (
        f"Estimated time (SM70) per Qwen3.5-27B GDN layer (vLLM 0.19.1's kernels; "
        f"`volta_core.planner.linear_attention`, the plan's own model; 900 GB/s, 15.7 TFLOP/s "
        f"FMA): a decode step of one sequence {', '.join(decode)}; a {chunk}-token prefill chunk "
        f"{', '.join(prefill)}."
    )


def render(reports: list[dict]) -> str:
    lines = [
        "| family (vLLM) | phase | kernel | configs tried by its autotuner | builds + fits sm_70 "
        "| fitting config | shared | registers | spills | estimated time (SM70) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for report in reports:
        family = f"{report['family']} ({report['vllm']})"
        for k in report["kernels"]:
            fits = "yes" if k["fits"] else "**no**"
            config = k["config"] or "; ".join(t["config"] for t in k["tried"])
            lines.append(
                f"| {family} | {k['phase']} | `{k['kernel']}` | {k['configurations']} | {fits} "
                f"| `{config}` | {_kib(k['shared_bytes'])} | {k['registers'] or '-'} "
                f"| {k['spill_bytes'] if k['spill_bytes'] is not None else '-'} B "
                f"| {estimate(k['kernel'], k['phase'])} |"
            )
    return "\n".join([*lines, "", totals()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="*", type=Path, default=list(REPORTS))
    parser.add_argument("--write", type=Path, help="README to update between the markers")
    args = parser.parse_args(argv)
    try:
        reports = [json.loads(p.read_text()) for p in args.reports]
    except (OSError, ValueError) as exc:
        print(f"render_table: cannot read a report: {exc}", file=sys.stderr)
        return 2
    table = render(reports)
    if args.write is None:
        print(table)
        return 0
    text = args.write.read_text()
    parts = text.split(MARKER)
    if len(parts) != 3:
        print(f"render_table: {args.write} needs exactly two {MARKER} lines", file=sys.stderr)
        return 2
    args.write.write_text(f"{parts[0]}{MARKER}\n{table}\n{MARKER}{parts[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
