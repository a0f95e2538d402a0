"""The gate's measurements on disk, keyed by what they were measured from.

``ptxas -v`` and the disassembler take one to three seconds a kernel and Triton's own cache
does not hold what they print, so every gate run, and every distribution that gates the same
kernels, would pay them again. A measurement is a pure function of the PTX, the cubin, the
target and the two tools, so it is kept under the SHA-256 of all of them (each tool named by
its ``--version`` answer, not its path: a fresh virtual environment with the same Triton wheel
hits), the way Triton keys its kernel cache on source, options and compiler version.

Only complete measurements are kept; a failed or partial one is measured again next time.
``$VLLM_VOLTA_GATE_CACHE`` names the folder (default ``~/.cache/vllm-volta/gate``); ``off``
turns the cache off. A missing, unreadable or malformed entry is a miss, never an error.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

CACHE_ENV = "VLLM_VOLTA_GATE_CACHE"
DEFAULT_DIR = "~/.cache/vllm-volta/gate"
OFF = "off"

#: Bumped when what an entry holds, or how it is measured, changes.
_FORMAT = "volta-gate-measurement-1"


@dataclass(frozen=True)
class Measurement:
    """What ``ptxas -v`` and the disassembler said about one cubin."""

    n_regs: int
    stack_bytes: int
    n_spills: int
    n_spill_loads: int
    sass_histogram: dict[str, int]


def cache_dir() -> Path | None:
    """The cache folder, or None when ``$VLLM_VOLTA_GATE_CACHE`` is ``off``."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() == OFF:
        return None
    return Path(value or DEFAULT_DIR).expanduser()


@functools.cache
def tool_identity(tool: Path) -> str | None:
    """The tool's ``--version`` answer (None if it gives none): two copies of one release
    answer alike wherever they are installed."""
    try:
        run = subprocess.run(
            [str(tool), "--version"], capture_output=True, text=True, check=False, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = run.stdout.strip()
    return text if run.returncode == 0 and text else None


def key(ptx: str, cubin: bytes, capability: int, tools: list[str]) -> str:
    """The entry name for a measurement of ``cubin`` (built from ``ptx``) with ``tools``."""
    digest = hashlib.sha256()
    for part in (_FORMAT, str(capability), *tools, ptx):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(cubin)
    return digest.hexdigest()


def load(name: str) -> Measurement | None:
    """The measurement kept under ``name``, or None."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        data = json.loads((folder / f"{name}.json").read_text())
        histogram = data["sass_histogram"]
        if not isinstance(histogram, dict):
            return None
        return Measurement(
            n_regs=int(data["n_regs"]),
            stack_bytes=int(data["stack_bytes"]),
            n_spills=int(data["n_spills"]),
            n_spill_loads=int(data["n_spill_loads"]),
            sass_histogram={str(op): int(n) for op, n in histogram.items()},
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def store(name: str, measurement: Measurement) -> None:
    """Keep ``measurement`` under ``name`` (written whole, then renamed into place, so a
    concurrent reader sees the entry or nothing); a folder that cannot be written is skipped."""
    folder = cache_dir()
    if folder is None:
        return
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(asdict(measurement), out)
            os.replace(tmp, folder / f"{name}.json")
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
