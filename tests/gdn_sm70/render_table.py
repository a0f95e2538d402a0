"""Render the README's GDN-on-sm_70 table from the reports test_gdn_sm70.py wrote.

    VOLTA_GDN_SM70_REPORT=docs/perf/gdn/<family>.json <family python> -m pytest tests/gdn_sm70
    python tests/gdn_sm70/render_table.py docs/perf/gdn/*.json [--write README.md]

With ``--write``, the table replaces what lies between the README's two
``<!-- gdn-sm70-table -->`` markers; otherwise it is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MARKER = "<!-- gdn-sm70-table -->"


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:.1f} KB"


def render(reports: list[dict]) -> str:
    lines = [
        "| family (vLLM) | phase | kernel | configs tried by its autotuner | builds + fits sm_70 "
        "| fitting config | shared | registers | spills |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for report in reports:
        family = f"{report['family']} ({report['vllm']})"
        for k in report["kernels"]:
            fits = "yes" if k["fits"] else "**no**"
            config = k["config"] or "; ".join(t["config"] for t in k["tried"])
            lines.append(
                f"| {family} | {k['phase']} | `{k['kernel']}` | {k['configurations']} | {fits} "
                f"| `{config}` | {_kib(k['shared_bytes'])} | {k['registers'] or '-'} "
                f"| {k['spill_bytes'] if k['spill_bytes'] is not None else '-'} B |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
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
