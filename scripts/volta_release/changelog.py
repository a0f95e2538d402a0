"""Each distribution's CHANGELOG.md: one convention for all, and the check that its version has
an entry saying what it needs.

The convention is Keep a Changelog 1.1 (https://keepachangelog.com/en/1.1.0/): newest release
first, an optional ``## [Unreleased]`` section above it, and per release one heading

    ## [VERSION] - YYYY-MM-DD (host API X.Y, vllm-volta-core SPEC)

followed by its changes as list items (grouped under ``### Added``, ``### Changed``, ``### Fixed``
or ``### Removed``). The parenthesis names what the release needs: the host API a plugin is
written for (the one the core speaks, for the core) and the ``vllm-volta-core`` versions it
installs with. The newest release must be the version ``pyproject.toml`` gives, and its
parenthesis what the checkout declares, so a version bump without an entry fails.
"""

from __future__ import annotations

import datetime
import itertools
import re
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.version import Version

from volta_release.distributions import ROOT, Distribution

NAME = "CHANGELOG.md"

_RELEASE = re.compile(
    r"^## \[(?P<version>[^\]]+)\] - (?P<date>\d{4}-\d{2}-\d{2})(?: \((?P<needs>[^()]*)\))?\s*$"
)
_UNRELEASED = re.compile(r"^## \[Unreleased\]\s*$")
_CHANGE = re.compile(r"^\s*[-*] \S")
#: A release heading that lost its ``## [VERSION]`` (an edit that kept only its date and needs).
_HEADLESS = re.compile(r"^[\s*#-]*\d{4}-\d{2}-\d{2} \([^()]*\)\s*$")


@dataclass(frozen=True)
class Release:
    version: str
    date: str
    needs: str | None
    line: int
    changes: int
    """How many list items the entry holds."""


def heading(dist: Distribution, date: datetime.date | None = None) -> str:
    """The heading of an entry for ``dist``'s current version."""
    day = (date or datetime.date.today()).isoformat()
    return f"## [{dist.version}] - {day} ({dist.needs()})"


def releases(text: str, where: str) -> tuple[list[Release], list[str]]:
    """The release entries of a changelog, newest first as written, and its format problems."""
    found: list[Release] = []
    problems: list[str] = []
    current: Release | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("## "):
            if _HEADLESS.match(line):
                problems.append(
                    f"{where}:{number}: a release heading without '## [VERSION]': {line!r}"
                )
            elif current is not None and _CHANGE.match(line):
                current = replace(current, changes=current.changes + 1)
            continue
        if current is not None:
            found.append(current)
        match = _RELEASE.match(line)
        current = (
            Release(match["version"], match["date"], match["needs"], number, 0) if match else None
        )
        if match is None and _UNRELEASED.match(line):
            if found:
                problems.append(f"{where}:{number}: [Unreleased] belongs above every release")
        elif match is None:
            problems.append(
                f"{where}:{number}: not a release heading ('## [VERSION] - YYYY-MM-DD (needs)'"
                f" or '## [Unreleased]'): {line!r}"
            )
    if current is not None:
        found.append(current)
    return found, problems


def problems(dist: Distribution, root: Path = ROOT, text: str | None = None) -> list[str]:
    """Why ``dist``'s changelog does not describe the checkout's version ([] when it does)."""
    path = root / dist.folder / NAME
    where = path.relative_to(root).as_posix()
    if text is None:
        if not path.is_file():
            return [f"{where}: missing; start it with: {heading(dist)}"]
        text = path.read_text()
    found, issues = releases(text, where)
    if not found or found[0].version != dist.version:
        newest = f"its newest entry is {found[0].version}" if found else "it has no release entry"
        issues.append(
            f"{where}: no entry for {dist.name} {dist.version}, the version pyproject.toml gives"
            f" ({newest}); add above the others: {heading(dist)} and what changed"
        )
    elif found[0].needs != dist.needs():
        issues.append(
            f"{where}:{found[0].line}: the {dist.version} entry says it needs"
            f" ({found[0].needs}), the checkout declares ({dist.needs()})"
        )
    issues += _order(found, where)
    issues += [
        f"{where}:{r.line}: the {r.version} entry lists no change ('- ...')"
        for r in found
        if r.changes == 0
    ]
    issues += [
        f"{where}:{r.line}: the {r.version} entry does not say what it needs"
        " ('(host API X.Y, vllm-volta-core SPEC)' after its date)"
        for r in found[1:]
        if not r.needs
    ]
    return issues


def _order(found: list[Release], where: str) -> list[str]:
    issues: list[str] = []
    for release in found:
        try:
            Version(release.version)
            datetime.date.fromisoformat(release.date)
        except ValueError as exc:
            issues.append(f"{where}:{release.line}: {exc}")
            return issues
    for newer, older in itertools.pairwise(found):
        if Version(newer.version) <= Version(older.version) or newer.date < older.date:
            issues.append(
                f"{where}:{older.line}: {older.version} ({older.date}) is not older than the"
                f" {newer.version} ({newer.date}) above it: newest first"
            )
    return issues
