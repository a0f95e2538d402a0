"""``python -m volta_release COMMAND`` (with ``scripts/`` on ``PYTHONPATH``): the release checks
``scripts/build_release.sh`` runs, and the README's compatibility table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from volta_release import artifacts, changelog, compat_table
from volta_release.distributions import ROOT, ReleaseError, distributions, release_folders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="volta_release", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("folders", help="print every published distribution's folder")
    commands.add_parser("changelogs", help="check that each version has its changelog entry")
    commands.add_parser("table", help="print the README's compatibility table")
    commands.add_parser("readme", help="write the compatibility table into README.md")
    check = commands.add_parser("artifacts", help="check a folder of built sdists and wheels")
    check.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except ReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "folders":
        print("\n".join(release_folders()))
        return 0
    dists = distributions()
    if args.command == "changelogs":
        found = [p for d in dists for p in changelog.problems(d)]
    elif args.command == "artifacts":
        if not args.folder.is_dir():
            raise ReleaseError(f"{args.folder}: not a folder")
        found = artifacts.problems(args.folder, dists)
    else:
        table = compat_table.render(dists, compat_table.family_names())
        if args.command == "table":
            print(table)
        else:
            readme = ROOT / "README.md"
            readme.write_text(compat_table.with_table(readme.read_text(), table, readme))
        return 0
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
