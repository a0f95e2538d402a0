"""Every hook in the host's spec is exercised by at least one test somewhere in the repository."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from volta_core.host import hookspecs

ROOT = Path(__file__).resolve().parents[1]
HOOKS = sorted(
    name
    for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
    if name.startswith("volta_")
)


def _test_sources() -> dict[Path, str]:
    files = [
        *ROOT.glob("core/tests/**/test_*.py"),
        *ROOT.glob("plugins/*/tests/**/test_*.py"),
        *ROOT.glob("tests/**/test_*.py"),
    ]
    me = Path(__file__).resolve()
    return {f: f.read_text() for f in files if f.resolve() != me}


def test_the_spec_has_the_declaration_families_the_resolutions_and_the_gate_hook() -> None:
    assert HOOKS == [
        "volta_attention_backends",
        "volta_cuda_kernel_configs",
        "volta_kernel_configs",
        "volta_kernel_cost",
        "volta_kernel_paths",
        "volta_kv_cache_ops",
        "volta_kv_cache_verdict",
        "volta_quant_method",
        "volta_quant_methods",
        "volta_reasoning_parsers",
        "volta_reasoning_postprocess",
    ]


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_exercised_by_a_test(hook: str) -> None:
    users = [path.relative_to(ROOT) for path, text in _test_sources().items() if hook in text]
    assert users, f"no test mentions hook {hook}"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented(hook: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
    assert len(doc.split()) >= 15, (
        f"{hook} needs a docstring saying when it runs and what it returns"
    )
