"""Print the requirements of the installed vLLM that a CPU-only check environment needs.

``scripts/check_vllm033.sh`` installs vLLM 0.33's CUDA wheel with ``--no-deps`` (there is no CPU
build of 0.33) and then what this prints, one requirement a line: every requirement of the
installed ``vllm`` distribution that applies here (no extras, environment markers evaluated),
except :data:`EXCLUDED`. Run with the environment's own Python, after vLLM is installed.
"""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

#: Left out: torch and its companions (the CPU torch of ``scripts/constraints.txt`` is installed
#: instead: vLLM 0.33 pins torch 2.14, which the package index has for Linux only as a CUDA build,
#: and torchvision/torchaudio/torchcodec builds for another torch break ``import vllm.config``,
#: FACTS.md 3), and packages that exist for vLLM's CUDA kernels only (they bring NVIDIA libraries
#: and nothing a CPU-only run imports).
EXCLUDED = frozenset(
    {
        "torch",
        "torchaudio",
        "torchvision",
        "torchcodec",
        "pynvvideocodec",
        "flashinfer-python",
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


def cpu_requirements(distribution: str = "vllm") -> list[str]:
    """The requirements of ``distribution`` to install next to CPU torch, as strings."""
    kept = []
    for line in metadata.requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(requirement.name) in EXCLUDED:
            continue
        requirement.marker = None
        kept.append(str(requirement))
    return kept


if __name__ == "__main__":
    print("\n".join(cpu_requirements()))
