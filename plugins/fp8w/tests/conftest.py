"""The tests' helper modules (this folder) and the benchmark scripts (``../benchmarks``), which
the tests check on the CPU, import as top-level modules; their names start with ``fp8w_`` so
they do not collide with other plugins' on the shared path."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent / "benchmarks"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
