"""The host's plugin API is declared and is all plugins use.

``volta_core.__all__`` (with ``volta_core.kernel_api``'s) is the API; the import-linter contract
"Plugins use only the host's plugin API" in the root ``pyproject.toml`` protects every other
host module. These tests keep that contract's list equal to the host's modules (a new module is
protected from the day it is added) and check that every name a plugin takes from the host is
one the API declares.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest
import tomllib

import volta_core
from volta_core import kernel_api

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {"volta_core", "volta_core.kernel_api"}


def _contract(name: str) -> dict[str, object]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = (c for c in contracts if c["name"] == name)
    return contract


def _host_modules() -> set[str]:
    return {m.name for m in pkgutil.iter_modules(volta_core.__path__, "volta_core.")}


def test_every_host_module_but_the_api_is_protected() -> None:
    protected = set(_contract("Plugins use only the host's plugin API")["protected_modules"])
    expected = (_host_modules() - PUBLIC) | {"volta_core.kernel_api.*"}
    assert protected == expected


@pytest.mark.parametrize("module", [volta_core, kernel_api], ids=lambda m: m.__name__)
def test_every_declared_name_exists(module: object) -> None:
    names = module.__all__  # type: ignore[attr-defined]
    assert names == sorted(names, key=lambda n: (not n.isupper(), n))
    missing = [n for n in names if not hasattr(module, n)]
    assert missing == []


def _host_imports(source: Path) -> list[tuple[str, str, int]]:
    """``(module, name, line)`` for each ``from volta_core... import name`` in ``source``."""
    tree = ast.parse(source.read_text(), str(source))
    return [
        (node.module, alias.name, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("volta_core")
        for alias in node.names
    ]


def _plugin_sources() -> list[Path]:
    folders = [*ROOT.glob("plugins/*/src"), ROOT / "core" / "devkit" / "src"]
    return sorted(p for folder in folders for p in folder.rglob("*.py"))


def test_plugins_take_only_declared_names() -> None:
    declared = {m: set(importlib.import_module(m).__all__) for m in PUBLIC}
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {module}.{name}"
        for path in _plugin_sources()
        for module, name, line in _host_imports(path)
        if module not in declared or name not in declared[module]
    ]
    assert wrong == []
