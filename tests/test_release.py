"""Release hygiene: every published distribution carries the license, has the changelog entry of
its version, and the README's compatibility table is its metadata; the release tooling
(``scripts/volta_release``, run by ``scripts/build_release.sh`` in CI) refuses what it must.

The artifacts themselves are built by ``tests/test_packaging.py`` (license file in each sdist and
wheel) and by ``scripts/build_release.sh`` (twine and the checks below, on real builds); here the
artifact checker runs on small hand-made ones, so each refusal is shown cheaply.
"""

from __future__ import annotations

import datetime
import importlib
import io
import sys
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
artifacts = importlib.import_module("volta_release.artifacts")
changelog = importlib.import_module("volta_release.changelog")
compat_table = importlib.import_module("volta_release.compat_table")
distributions = importlib.import_module("volta_release.distributions")

DISTS = distributions.distributions()


def test_every_distribution_carries_the_apache_license() -> None:
    license_text = (ROOT / "LICENSE").read_bytes()
    assert license_text.lstrip().startswith(
        b"Apache License\n                           Version 2.0"
    )
    wrong = []
    for dist in DISTS:
        project = tomllib.loads((ROOT / dist.folder / "pyproject.toml").read_text())["project"]
        folder_license = ROOT / dist.folder / "LICENSE"
        if project.get("license") != "Apache-2.0" or project.get("license-files") != ["LICENSE"]:
            wrong.append(f"{dist.folder}: license {project.get('license')!r}")
        if not folder_license.is_file() or folder_license.read_bytes() != license_text:
            wrong.append(f"{dist.folder}/LICENSE is not the repository's")
    assert wrong == []


def test_every_version_has_its_changelog_entry() -> None:
    assert [p for dist in DISTS for p in changelog.problems(dist)] == []


def test_every_package_says_its_distributions_version() -> None:
    """A package's ``__version__`` (what the plugins' records report) is its distribution's:
    a bump of one without the other fails here, not on an owner's machine."""
    checked = []
    for dist in DISTS:
        for init in sorted((distributions.ROOT / dist.folder).glob("src/*/__init__.py")):
            try:
                said = distributions.module_constant(init, "__version__")
            except distributions.ReleaseError:
                continue
            assert said == dist.version, f"{init}: __version__ {said}, {dist.name} {dist.version}"
            checked.append(dist.name)
    assert len(checked) == len(DISTS) - 1, checked  # all but the meta-distribution (no package)


def test_a_version_bump_without_an_entry_fails_until_one_is_added() -> None:
    (dist,) = (d for d in DISTS if d.name == "vllm-volta-ct-wna16")
    text = (ROOT / dist.folder / changelog.NAME).read_text()
    core = (Requirement("vllm-volta-core>=0.9"),)
    bumped = replace(dist, version="99.0.0", dependencies=core, host_api="1.3")

    (problem,) = changelog.problems(bumped, text=text)
    assert "no entry for vllm-volta-ct-wna16 99.0.0" in problem
    assert changelog.heading(bumped) in problem

    entry = changelog.heading(bumped, datetime.date(2100, 1, 1))
    assert entry == "## [99.0.0] - 2100-01-01 (host API 1.3, vllm-volta-core >=0.9)"
    head, older = text.split("\n## [", 1)
    with_entry = f"{head}\n{entry}\n\n- AWQ and GPTQ checkpoints.\n\n## [{older}"
    assert changelog.problems(bumped, text=with_entry) == []


def test_the_newest_entry_must_say_what_the_checkout_needs() -> None:
    (dist,) = (d for d in DISTS if d.name == "vllm-volta-fp8kv")
    text = f"## [{dist.version}] - 2026-12-01 (host API 1.0, vllm-volta-core >=0.7)\n- a change\n"
    raised = replace(dist, dependencies=(Requirement("vllm-volta-core>=0.9"),), host_api="1.3")
    (problem,) = changelog.problems(raised, text=text)
    assert "says it needs (host API 1.0, vllm-volta-core >=0.7)" in problem
    assert "declares (host API 1.3, vllm-volta-core >=0.9)" in problem


def test_every_older_entry_must_say_what_it_needed() -> None:
    (dist,) = (d for d in DISTS if d.name == "vllm-volta-fp8kv")
    text = "\n".join(
        [
            f"## [{dist.version}] - 2026-12-01 ({dist.needs()})",
            "- a change",
            "## [0.0.1] - 2026-11-01",
            "- the first release",
        ]
    )
    (problem,) = changelog.problems(dist, text=text)
    assert ":3: the 0.0.1 entry does not say what it needs" in problem


def test_a_malformed_changelog_is_refused_line_by_line() -> None:
    (dist,) = (d for d in DISTS if d.name == "vllm-volta-reasoning")
    needs = dist.needs()
    text = "\n".join(
        [
            "# Changelog",
            f"## [{dist.version}] - 2026-11-20 ({needs})",
            "- newest",
            "## [Unreleased]",
            f"## [0.9.0] - 2026-11-27 ({needs})",
            "## Version 0.0.1",
            f" - 2026-11-19 ({needs})",
        ]
    )
    problems = changelog.problems(dist, text=text)
    assert len(problems) == 5, problems
    assert "[Unreleased] belongs above every release" in problems[0]
    assert "not a release heading" in problems[1]
    assert ":7: a release heading without '## [VERSION]'" in problems[2]
    assert "0.9.0 (2026-11-27) is not older than" in problems[3]
    assert ":5: the 0.9.0 entry lists no change" in problems[4]


def test_the_readme_compatibility_table_is_the_distributions_metadata() -> None:
    readme = ROOT / "README.md"
    table = compat_table.render(DISTS, compat_table.family_names())
    assert compat_table.section(readme.read_text(), readme) == table, (
        "README.md's table is stale: PYTHONPATH=scripts python -m volta_release readme"
    )
    plugins = [d for d in DISTS if d.is_plugin]
    assert len(table.splitlines()) == 3 + len(plugins)
    # Every plugin is checked on every family because the family check installs them all.
    assert (
        "for d in plugins/*/ tests/plugins/*/; do" in (ROOT / "scripts/check_vllm.sh").read_text()
    )


def test_ci_builds_and_checks_the_release() -> None:
    assert "\nbash scripts/build_release.sh\n" in (ROOT / ".ci" / "run").read_text()


def _fake_release(root: Path, out: Path, core_spec: str, wheel_license: bool) -> list[Any]:
    """A core 1.0.0 and a plugin needing ``core_spec``, built by hand into ``out``."""
    common = {"requires_python": ">=3.10", "license": "Apache-2.0", "host_api": "1.2"}
    dists = [
        distributions.Distribution(
            folder="core",
            name="vllm-volta-core",
            version="1.0.0",
            dependencies=(),
            is_plugin=False,
            **common,
        ),
        distributions.Distribution(
            folder="plugins/p",
            name="vllm-volta-p",
            version="0.1.0",
            dependencies=(Requirement(f"vllm-volta-core{core_spec}"),),
            is_plugin=True,
            **common,
        ),
    ]
    out.mkdir()
    for dist in dists:
        base = root / dist.folder
        base.mkdir(parents=True)
        (base / "LICENSE").write_text("license text\n")
        (base / "CHANGELOG.md").write_text("changes\n")
        requires = [f"Requires-Dist: {r}" for r in dist.dependencies]
        metadata = "\n".join(
            [
                "Metadata-Version: 2.4",
                f"Name: {dist.name}",
                f"Version: {dist.version}",
                "License-Expression: Apache-2.0",
                "License-File: LICENSE",
                "Requires-Python: >=3.10",
                *requires,
                "",
                "The README.",
            ]
        )
        stem = f"{dist.name.replace('-', '_')}-{dist.version}"
        with zipfile.ZipFile(out / f"{stem}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{stem}.dist-info/METADATA", metadata)
            if wheel_license:
                wheel.writestr(f"{stem}.dist-info/licenses/LICENSE", "license text\n")
        with tarfile.open(out / f"{stem}.tar.gz", "w:gz") as sdist:
            for name, data in [
                ("PKG-INFO", metadata),
                ("LICENSE", "license text\n"),
                ("CHANGELOG.md", "changes\n"),
            ]:
                info = tarfile.TarInfo(f"{stem}/{name}")
                info.size = len(data.encode())
                sdist.addfile(info, io.BytesIO(data.encode()))
    return dists


def test_the_artifact_check_passes_a_complete_release(tmp_path: Path) -> None:
    dists = _fake_release(tmp_path / "src", tmp_path / "dist", ">=1.0", wheel_license=True)
    assert artifacts.problems(tmp_path / "dist", dists, tmp_path / "src") == []


def test_the_artifact_check_refuses_a_core_range_that_excludes_the_core_built(
    tmp_path: Path,
) -> None:
    dists = _fake_release(tmp_path / "src", tmp_path / "dist", ">=1.1", wheel_license=True)
    (problem,) = artifacts.problems(tmp_path / "dist", dists, tmp_path / "src")
    assert "requires 'vllm-volta-core>=1.1', which excludes the vllm-volta-core 1.0.0" in problem


def test_the_artifact_check_refuses_a_wheel_without_its_license(tmp_path: Path) -> None:
    dists = _fake_release(tmp_path / "src", tmp_path / "dist", ">=1.0", wheel_license=False)
    (tmp_path / "dist" / "stray.txt").write_text("")
    problems = artifacts.problems(tmp_path / "dist", dists, tmp_path / "src")
    assert problems == [
        "stray.txt: not an artifact of this repository's distributions",
        "vllm_volta_core-1.0.0-py3-none-any.whl: the license file LICENSE is missing or not"
        " core/LICENSE",
        "vllm_volta_p-0.1.0-py3-none-any.whl: the license file LICENSE is missing or not"
        " plugins/p/LICENSE",
    ]
