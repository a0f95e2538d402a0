"""The repository's shell scripts name no fixed ``/tmp`` path.

Another local user can create a fixed ``/tmp`` path first: a planted cubin in a shared NVRTC
cache runs on the GPU, a planted Triton cache or environment runs as the script's user. Scripts
default to ``mktemp -d`` for their logs and to the user's own cache folder for their caches.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_script_defaults_to_a_fixed_tmp_path() -> None:
    scripts = sorted([*ROOT.glob("scripts/*.sh"), *ROOT.glob("plugins/*/scripts/*.sh")])
    assert scripts
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in scripts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "/tmp" in line and not line.lstrip().startswith("#")
    ]
    assert found == []
