"""Copy each vLLM family's FLA op files into ``tests/gdn_sm70/.staged/<family>/`` for the GPU run.

    python tests/gdn_sm70/fla_stage.py            # (re)build every family found here
    python tests/gdn_sm70/fla_stage.py 0.19 1cat  # only these

The GPU machine has torch and Triton but no vLLM, so ``gpu_fla.py`` loads the families' own
files from this folder (ignored by git; carried into the run). Only the op modules the
chunked prefill (``chunk_gated_delta_rule``) and the recurrent decodes
(``fused_recurrent_gated_delta_rule``, ``fused_sigmoid_gating_delta_rule_update``) import are
copied, unchanged; the few vLLM names they import are stood in for by ``fla_standalone.py``.
``manifest.json`` records where each file came from and its SHA-256.

Sources: the family's check environment (``scripts/check_vllm.sh``:
``$VLLM_CHECK_ROOT/<family>``, default ``~/.cache/vllm-volta/check/<family>``), and for 1Cat-vLLM
first the snapshot in ``../shared/vendor`` (the one those reports were made from).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STAGED = HERE / ".staged"

#: The family names, as ``docs/perf/gdn/<family>.json`` (the sm_70 gate's reports) name them.
FAMILIES = ("0.19", "1cat", "0.33")

#: The op modules the three entry points import (checked: :func:`_relative_imports`).
MODULES = (
    "chunk",
    "chunk_delta_h",
    "chunk_o",
    "chunk_scaled_dot_kkt",
    "cumsum",
    "fused_recurrent",
    "fused_sigmoid_gating",
    "index",
    "l2norm",
    "op",
    "solve_tril",
    "utils",
    "wy_fast",
)

#: Where FLA's ops sit under a family's ``vllm`` package (0.19 and 1Cat; 0.32 on).
OPS_DIRS = ("model_executor/layers/fla/ops", "third_party/flash_linear_attention/ops")

ONECAT_SNAPSHOT = REPO.parent / "shared/vendor/1cat-vllm-ae13773a0/vllm"


def check_root() -> Path:
    """Where ``scripts/check_vllm.sh`` keeps the families' environments."""
    if os.environ.get("VLLM_CHECK_ROOT"):
        return Path(os.environ["VLLM_CHECK_ROOT"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "vllm-volta/check"


def vllm_roots(family: str) -> list[Path]:
    """The candidate ``vllm`` package folders of ``family``, preferred first."""
    env = sorted((check_root() / family).glob("lib/python3*/site-packages/vllm"))
    return ([ONECAT_SNAPSHOT] if family == "1cat" else []) + env


def ops_dir(family: str) -> Path:
    """The family's FLA ops folder, or a ValueError naming where it was looked for."""
    tried = []
    for root in vllm_roots(family):
        for rel in OPS_DIRS:
            if (root / rel / "chunk.py").is_file():
                return root / rel
            tried.append(str(root / rel))
    raise ValueError(
        f"no FLA ops of family {family!r} here (looked in {', '.join(tried) or 'nothing'}); "
        f"build its environment with scripts/check_vllm.sh {family}"
    )


def _relative_imports(path: Path) -> set[str]:
    """The sibling modules ``path`` imports (``from .x import ...``, at any depth)."""
    tree = ast.parse(path.read_text())
    return {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
    }


def _distribution(ops: Path) -> str:
    """The installed distribution beside the sources (name and version), if any."""
    site = next((p for p in ops.parents if p.name == "site-packages"), None)
    if site is None:
        return "source snapshot " + str(ops.parents[len(OPS_DIRS[0].split("/"))])
    for meta in sorted(site.glob("*.dist-info/METADATA")):
        head = dict(
            line.split(": ", 1) for line in meta.read_text().splitlines()[:8] if ": " in line
        )
        record = meta.parent / "RECORD"
        if (
            "vllm" in head.get("Name", "").lower()
            and record.is_file()
            and "vllm/__init__.py" in record.read_text()
        ):
            return f"{head['Name']} {head.get('Version', '?')}"
    return "unknown distribution in " + str(site)


def stage(family: str, dest_root: Path = STAGED) -> Path:
    """(Re)build ``dest_root/<family>`` from the family's sources; returns the folder."""
    src = ops_dir(family)
    missing = {m for mod in MODULES for m in _relative_imports(src / f"{mod}.py")} - set(MODULES)
    if missing:
        raise ValueError(f"{src}: the staged modules also import {sorted(missing)}")
    dest = dest_root / family
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    files = {}
    for mod in MODULES:
        data = (src / f"{mod}.py").read_bytes()
        (dest / f"{mod}.py").write_bytes(data)
        files[f"{mod}.py"] = hashlib.sha256(data).hexdigest()
    manifest = {
        "family": family,
        "source": str(src),
        "distribution": _distribution(src),
        "files": files,
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return dest


def main(argv: list[str]) -> int:
    unknown = [f for f in argv if f not in FAMILIES]
    if unknown:
        print(f"unknown families {unknown}; known: {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    failed = 0
    for family in argv or FAMILIES:
        try:
            dest = stage(family)
        except ValueError as exc:
            print(f"{family}: {exc}", file=sys.stderr)
            failed += 1
            continue
        size = sum(p.stat().st_size for p in dest.iterdir())
        print(f"{family}: {dest.relative_to(REPO)} ({size // 1024} KiB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
