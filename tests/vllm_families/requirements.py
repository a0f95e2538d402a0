"""Print the requirements a CPU-only check environment needs for one vLLM family.

``scripts/check_vllm.sh`` installs a vLLM whose compiled code needs CUDA (the CUDA wheel of vLLM
0.19.1 or 0.33.0 with ``--no-deps``, or the 1Cat-vLLM sources as distribution ``1cat-vllm``) beside
CPU torch, then what this prints, one requirement a line:

- ``python requirements.py`` (after vLLM is installed): every requirement of the installed
  ``vllm`` distribution that applies here (no extras, environment markers evaluated);
- ``python requirements.py FILE``: the same, read from a pip requirements file such as a 1Cat-vLLM
  checkout's ``requirements/cuda.txt`` (``-r`` includes followed, comments dropped);

less :data:`EXCLUDED` in both cases.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

#: Left out: torch and its companions (the CPU torch of ``scripts/constraints.txt`` is installed
#: instead: every vLLM pins a torch that the package index has for Linux only as a CUDA build,
#: and torchvision/torchaudio/torchcodec builds for another torch break ``import vllm.config``),
#: packages that exist for vLLM's CUDA kernels only (they bring NVIDIA libraries and nothing a
#: CPU-only run imports), and compressed-tensors: the checks write their test checkpoints with
#: the suite's version (scripts/constraints.txt; 0.20 no longer writes ``kv_cache_scheme`` where
#: 0.17 does), which vLLM 0.19.1 and 1Cat-vLLM (pinned to 0.15) read as well.
EXCLUDED = frozenset(
    {
        "compressed-tensors",
        "torch",
        "torchaudio",
        "torchvision",
        "torchcodec",
        "pynvvideocodec",
        "flashinfer-python",
        "flashinfer-cubin",
        "apache-tvm-ffi",
        "tilelang",
        "nvidia-cudnn-frontend",
        "nvidia-cutlass-dsl",
        "nvtx",
        "fastsafetensors",
        "instanttensor",
        "quack-kernels",
        "tokenspeed-mla",
        "humming-kernels",
    }
)


def _kept(lines: list[str]) -> list[str]:
    kept = []
    for line in lines:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(requirement.name) in EXCLUDED:
            continue
        requirement.marker = None
        kept.append(str(requirement))
    return kept


def installed_requirements(distribution: str = "vllm") -> list[str]:
    """The requirements of the installed ``distribution`` to install next to CPU torch."""
    return _kept(metadata.requires(distribution) or [])


def file_requirements(path: Path) -> list[str]:
    """The requirements of a pip requirements file (``-r`` followed) to install beside CPU torch."""
    lines: list[str] = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if line.startswith("-r "):
            lines += [str(r) for r in file_requirements(path.parent / line[3:].strip())]
        elif line and not line.startswith(("#", "-")):
            lines.append(line)
    return _kept(lines)


if __name__ == "__main__":
    found = file_requirements(Path(sys.argv[1])) if len(sys.argv) > 1 else installed_requirements()
    print("\n".join(found))
