"""Every distribution's sdist and wheel hold only product files.

Builds the sdist and the wheel of the core, each plugin and the meta-distribution with the build
backend itself (hatchling's PEP 517 hooks, no build isolation, nothing downloaded) and lists their
contents. A wheel holds its import package, exactly as ``src/`` has it, and its metadata with the
license file (PEP 639: ``.dist-info/licenses/LICENSE``); an sdist holds ``src/``, ``tests/``, the
README, the changelog, the license file and ``pyproject.toml``. Measurement records (logs,
charts, probe scripts, patches: ``docs/perf/``) and run scripts are in neither.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = [
    "core",
    "core/devkit",
    *sorted(f"plugins/{p.parent.name}" for p in ROOT.glob("plugins/*/pyproject.toml")),
]

#: What an sdist may hold at its top level (hatchling always adds the ``.gitignore`` it excluded
#: files by, so that a wheel built from the sdist leaves out the same ones).
SDIST_TOP = {
    "src",
    "tests",
    "benchmarks",
    "README.md",
    "CHANGELOG.md",
    "LICENSE",
    "pyproject.toml",
    "PKG-INFO",
    ".gitignore",
}

#: Suffixes of measurement records, never in a distribution.
RECORD_SUFFIXES = {".log", ".patch", ".diff", ".png", ".sh"}

_BUILD = """
import sys
from hatchling.build import build_sdist, build_wheel
print(build_sdist(sys.argv[1]))
print(build_wheel(sys.argv[1]))
"""


def _build(folder: Path, out: Path) -> tuple[list[str], list[str]]:
    """The sdist's members (below its top folder) and the wheel's, built from ``folder``."""
    done = subprocess.run(
        [sys.executable, "-c", _BUILD, str(out)],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sdist_name, wheel_name = done.stdout.split()
    with tarfile.open(out / sdist_name) as sdist:
        members = [m.name.split("/", 1)[1] for m in sdist.getmembers() if m.isfile()]
    with zipfile.ZipFile(out / wheel_name) as wheel:
        files = [n for n in wheel.namelist() if not n.endswith("/")]
    return sorted(members), sorted(files)


def _lab_files(paths: list[str]) -> list[str]:
    """The paths that are measurement records or lab tooling."""
    return [
        p
        for p in paths
        if PurePosixPath(p).suffix in RECORD_SUFFIXES
        or "probe" in PurePosixPath(p).name
        or {"results", "perf", "scripts", "__pycache__"} & set(PurePosixPath(p).parts)
    ]


@pytest.mark.parametrize("folder", DISTRIBUTIONS)
def test_distribution_holds_only_product_files(folder: str, tmp_path: Path) -> None:
    base = ROOT / folder
    (package,) = (p for p in (base / "src").iterdir() if p.is_dir() and p.name.isidentifier())
    sdist, wheel = _build(base, tmp_path)

    listing = "\n".join(["sdist:", *sdist, "wheel:", *wheel])
    assert not _lab_files(sdist), listing
    assert not _lab_files(wheel), listing
    assert {PurePosixPath(p).parts[0] for p in sdist} <= SDIST_TOP, listing
    assert f"src/{package.name}/__init__.py" in sdist, listing
    assert {"LICENSE", "CHANGELOG.md"} <= set(sdist), listing

    # The wheel: the import package as src/ has it (no tests, no stray files), and metadata.
    in_src = {
        p.relative_to(base / "src").as_posix()
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    dist_info = {p for p in wheel if PurePosixPath(p).parts[0].endswith(".dist-info")}
    assert set(wheel) - dist_info == in_src, listing
    assert any(p.endswith(".dist-info/licenses/LICENSE") for p in dist_info), listing
    assert not any(p.startswith("tests/") for p in wheel), listing


def test_meta_distribution_holds_only_its_metadata(tmp_path: Path) -> None:
    sdist, wheel = _build(ROOT, tmp_path)
    assert sdist == [
        ".gitignore",
        "CHANGELOG.md",
        "LICENSE",
        "PKG-INFO",
        "README.md",
        "pyproject.toml",
    ], sdist
    assert all(PurePosixPath(p).parts[0].endswith(".dist-info") for p in wheel), wheel
    assert any(p.endswith(".dist-info/licenses/LICENSE") for p in wheel), wheel
