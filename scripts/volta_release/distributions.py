"""The repository's distributions as a release sees them, read from the checkout without
installing or importing anything: name, version, requirements and the host API each states."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import tomllib
from packaging.requirements import InvalidRequirement, Requirement

ROOT = Path(__file__).resolve().parents[2]
CORE = "vllm-volta-core"
PLUGIN_GROUP = "vllm_volta.plugins"

#: Where the core states the host API it speaks (``volta_core.HOST_API_VERSION``).
CORE_HOST_API = ("src/volta_core/host/records.py", "HOST_API_VERSION")
#: The constant a plugin's entry-point module states its host API in.
PLUGIN_HOST_API = "VOLTA_HOST_API"

#: hatchling's default pattern for a version read from a file ([tool.hatch.version] path).
_VERSION_IN_FILE = re.compile(r"(?im)^(__version__|VERSION) *= *(['\"])v?(?P<version>.+?)\2")


class ReleaseError(Exception):
    """A distribution or an artifact that cannot be read; the message names the file."""


@dataclass(frozen=True)
class Distribution:
    """One distribution of the checkout (``folder`` relative to the repository root)."""

    folder: str
    name: str
    version: str
    dependencies: tuple[Requirement, ...]
    requires_python: str
    license: str
    """The SPDX license expression ``pyproject.toml`` declares."""
    host_api: str | None
    """The host API the distribution speaks (the core) or is written for (a plugin)."""
    is_plugin: bool

    def requirement(self, name: str) -> Requirement | None:
        """Its run-time requirement on the distribution ``name``, if any."""
        return next(
            (r for r in self.dependencies if normal_name(r.name) == normal_name(name)), None
        )

    def needs(self) -> str:
        """What a changelog entry's heading names: the host API and the core versions."""
        parts = [f"host API {self.host_api}"] if self.host_api else []
        core = self.requirement(CORE)
        if core is not None:
            parts.append(f"{CORE} {core.specifier or 'any version'}")
        return ", ".join(parts)


def release_folders(root: Path = ROOT) -> list[str]:
    """Every published distribution's folder: the meta-distribution, the core, the devkit and
    each plugin. The test-only plugins under ``tests/plugins`` are never published."""
    plugins = sorted(
        p.parent.relative_to(root).as_posix() for p in root.glob("plugins/*/pyproject.toml")
    )
    return [".", "core", "core/devkit", *plugins]


def distributions(root: Path = ROOT) -> list[Distribution]:
    return [read_distribution(folder, root) for folder in release_folders(root)]


def read_distribution(folder: str, root: Path = ROOT) -> Distribution:
    base = root / folder
    pyproject = base / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text())
        project = data["project"]
        name = project["name"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        raise ReleaseError(f"{pyproject}: no readable [project] table with a name ({exc})") from exc
    try:
        dependencies = tuple(Requirement(r) for r in project.get("dependencies", []))
    except InvalidRequirement as exc:
        raise ReleaseError(f"{pyproject}: {exc}") from exc
    entry_points = project.get("entry-points", {}).get(PLUGIN_GROUP, {})
    if name == CORE:
        host_api: str | None = module_constant(base / CORE_HOST_API[0], CORE_HOST_API[1])
    elif entry_points:
        (module,) = set(entry_points.values())
        host_api = module_constant(_module_file(base, module), PLUGIN_HOST_API)
    else:
        host_api = None
    return Distribution(
        folder=folder,
        name=name,
        version=_version(pyproject, data),
        dependencies=dependencies,
        requires_python=project.get("requires-python", ""),
        license=str(project.get("license", "")),
        host_api=host_api,
        is_plugin=bool(entry_points),
    )


def module_constant(path: Path, name: str) -> str:
    """The string a module assigns to ``name`` at its top level."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError) as exc:
        raise ReleaseError(f"{path}: cannot be read as Python ({exc})") from exc
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        value = getattr(node, "value", None)
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and (
            isinstance(value, ast.Constant) and isinstance(value.value, str)
        ):
            return value.value
    raise ReleaseError(f"{path}: no top-level string {name}")


def _version(pyproject: Path, data: dict) -> str:
    project = data["project"]
    if "version" in project:
        return str(project["version"])
    path = data.get("tool", {}).get("hatch", {}).get("version", {}).get("path")
    if "version" not in project.get("dynamic", []) or path is None:
        raise ReleaseError(f"{pyproject}: no version and no [tool.hatch.version] path")
    source = pyproject.parent / path
    match = _VERSION_IN_FILE.search(source.read_text()) if source.is_file() else None
    if match is None:
        raise ReleaseError(f"{source}: no __version__ for {pyproject}")
    return match.group("version")


def _module_file(base: Path, module: str) -> Path:
    stem = base / "src" / Path(*module.split("."))
    return stem / "__init__.py" if stem.is_dir() else stem.with_suffix(".py")


def normal_name(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()
