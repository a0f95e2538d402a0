"""The README's compatibility table, generated from the distributions' metadata.

One row for the core (the host API it speaks) and one per plugin: its version, the host API it
is written for, the ``vllm-volta-core`` versions and the repository's other distributions it
installs with, and the vLLM families it is checked against. Those are the core's family table
(``volta_core.vllm.families.FAMILIES``) for every plugin, because ``scripts/check_vllm.sh``
installs every plugin under ``plugins/`` in each family's environment and CI runs it for each
family (``tests/test_every_family_is_checked.py``).
"""

from __future__ import annotations

from pathlib import Path

from volta_release.distributions import CORE, Distribution, ReleaseError, normal_name

BEGIN = (
    "<!-- compatibility table: generated from the distributions' metadata by"
    " `PYTHONPATH=scripts python -m volta_release readme`; tests/test_release.py keeps it so -->"
)
END = "<!-- end of the compatibility table -->"


def family_names() -> list[str]:
    """The vLLM families the core supports, from the installed core's table."""
    from volta_core.vllm.families import FAMILIES

    return [family.name for family in FAMILIES]


def render(dists: list[Distribution], families: list[str]) -> str:
    """The table's Markdown: the core first, then the plugins by name."""
    ours = {normal_name(d.name) for d in dists}
    checked = ", ".join(families)
    rows = [
        "| distribution | version | host API | `vllm-volta-core` | also needs | checked against |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for dist in sorted(dists, key=lambda d: (d.name != CORE, d.name)):
        if dist.name != CORE and not dist.is_plugin:
            continue
        core = dist.requirement(CORE)
        others = [
            f"`{r.name}` {r.specifier}".strip()
            for r in dist.dependencies
            if normal_name(r.name) in ours and normal_name(r.name) != CORE
        ]
        rows.append(
            f"| `{dist.name}` | {dist.version} "
            f"| {dist.host_api if dist.is_plugin else f'speaks {dist.host_api}'} "
            f"| {'—' if core is None else core.specifier or 'any'} "
            f"| {', '.join(others) or '—'} | {checked} |"
        )
    return "\n".join(rows)


def section(readme: str, where: Path) -> str:
    """The table as the README holds it now (between its markers)."""
    start, end = _bounds(readme, where)
    return readme[start:end].strip("\n")


def with_table(readme: str, table: str, where: Path) -> str:
    """The README with its table replaced by ``table``."""
    start, end = _bounds(readme, where)
    return f"{readme[:start]}\n{table}\n{readme[end:]}"


def _bounds(readme: str, where: Path) -> tuple[int, int]:
    begin = readme.find(BEGIN)
    end = readme.find(END)
    if begin < 0 or end < begin:
        raise ReleaseError(f"{where}: no compatibility table markers ({BEGIN} ... {END})")
    return begin + len(BEGIN), end
