"""Checks of a folder of built sdists and wheels beyond what ``twine check`` reads: each is the
checkout's distribution at its version, carries the license file its ``pyproject.toml`` names
(PEP 639: ``License-File``, under ``.dist-info/licenses/`` in a wheel), an sdist its changelog,
and every requirement on a distribution built beside it admits the version built."""

from __future__ import annotations

import email.parser
import tarfile
import zipfile
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from volta_release.changelog import NAME as CHANGELOG
from volta_release.distributions import ROOT, Distribution, normal_name

LICENSE = "LICENSE"


@dataclass
class Built:
    """One distribution's artifacts in the folder."""

    wheel: Path | None = None
    sdist: Path | None = None


def problems(folder: Path, dists: list[Distribution], root: Path = ROOT) -> list[str]:
    """Everything wrong with the artifacts in ``folder`` for ``dists`` ([] when all is well)."""
    by_name = {normal_name(d.name): d for d in dists}
    built = {name: Built() for name in by_name}
    issues: list[str] = []
    for path in sorted(folder.iterdir()):
        name, kind = _artifact_name(path)
        if name not in by_name or kind is None:
            issues.append(f"{path.name}: not an artifact of this repository's distributions")
        elif getattr(built[name], kind) is not None:
            issues.append(f"{path.name}: a second {kind} of {by_name[name].name}")
        else:
            setattr(built[name], kind, path)
    versions = {name: d.version for name, d in by_name.items()}
    for name, dist in by_name.items():
        base = root / dist.folder
        wheel, sdist = built[name].wheel, built[name].sdist
        if wheel is None or sdist is None:
            issues.append(f"{dist.name}: no {'wheel' if wheel is None else 'sdist'} in {folder}")
            continue
        try:
            issues += _wheel_problems(wheel, dist, base, versions)
            issues += _sdist_problems(sdist, dist, base)
        except (zipfile.BadZipFile, tarfile.TarError, KeyError, ValueError) as exc:
            issues.append(f"{dist.name}: an artifact cannot be read ({exc!r})")
    return issues


def _wheel_problems(
    path: Path, dist: Distribution, base: Path, versions: dict[str, str]
) -> list[str]:
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        (dist_info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        metadata = _message(wheel.read(f"{dist_info}/METADATA"))
        licenses = {
            n.removeprefix(f"{dist_info}/licenses/"): wheel.read(n)
            for n in names
            if n.startswith(f"{dist_info}/licenses/")
        }
    issues = _metadata_problems(path.name, metadata, dist, versions)
    issues += _license_problems(path.name, metadata, licenses, base, dist.folder)
    if not str(metadata.get_payload()).strip():
        issues.append(f"{path.name}: no long description (the README)")
    return issues


def _sdist_problems(path: Path, dist: Distribution, base: Path) -> list[str]:
    with tarfile.open(path) as sdist:
        files = {
            m.name.split("/", 1)[1]: m for m in sdist.getmembers() if m.isfile() and "/" in m.name
        }

        def read(name: str) -> bytes | None:
            member = sdist.extractfile(files[name]) if name in files else None
            return member.read() if member is not None else None

        metadata = _message(read("PKG-INFO") or b"")
        licenses = {n: data for n in metadata.get_all("License-File", []) if (data := read(n))}
        changelog = read(CHANGELOG)
    issues = _metadata_problems(path.name, metadata, dist, {})
    issues += _license_problems(path.name, metadata, licenses, base, dist.folder)
    if changelog != (base / CHANGELOG).read_bytes():
        issues.append(f"{path.name}: {CHANGELOG} missing or not the one in {dist.folder}/")
    return issues


def _metadata_problems(
    artifact: str, metadata: Message, dist: Distribution, versions: dict[str, str]
) -> list[str]:
    issues = [
        f"{artifact}: {field} is {metadata.get(field)!r},"
        f" {dist.folder}/pyproject.toml says {want!r}"
        for field, want in [
            ("Name", dist.name),
            ("Version", dist.version),
            ("License-Expression", dist.license),
            ("Requires-Python", dist.requires_python),
        ]
        if (metadata.get(field) or "") != want
    ]
    for line in metadata.get_all("Requires-Dist", []):
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            issues.append(f"{artifact}: Requires-Dist {line!r}: {exc}")
            continue
        built = versions.get(normal_name(requirement.name))
        if built is not None and not requirement.specifier.contains(built, prereleases=True):
            issues.append(
                f"{artifact}: requires {line!r}, which excludes the {requirement.name} {built}"
                " built beside it"
            )
    return issues


def _license_problems(
    artifact: str, metadata: Message, licenses: dict[str, bytes], base: Path, folder: str
) -> list[str]:
    declared = metadata.get_all("License-File", [])
    if LICENSE not in declared:
        return [f"{artifact}: License-File {LICENSE} not in its metadata ({declared})"]
    if licenses.get(LICENSE) != (base / LICENSE).read_bytes():
        return [f"{artifact}: the license file {LICENSE} is missing or not {folder}/{LICENSE}"]
    return []


def _artifact_name(path: Path) -> tuple[str, str | None]:
    """The normalized distribution name of an artifact file and its kind ('wheel', 'sdist')."""
    if path.name.endswith(".whl"):
        return normal_name(path.name.split("-")[0]), "wheel"
    if path.name.endswith(".tar.gz"):
        return normal_name(path.name.removesuffix(".tar.gz").rsplit("-", 1)[0]), "sdist"
    return path.name, None


def _message(data: bytes) -> Message:
    return email.parser.BytesParser().parsebytes(data)
