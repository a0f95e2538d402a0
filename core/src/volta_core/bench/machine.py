"""The device and the software a bench report was measured with, and nothing more.

The GPU's name, SMs, memory, L2 and clocks come from torch and ``nvidia-smi`` (shipped with
the NVIDIA driver); the interconnect is the GPU count, the PCIe link and the active NVLink
links of GPU 0. No serial number, UUID, bus id, host name or user name is read, so a report
can be pasted in a public issue.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from importlib import metadata
from typing import Any

from volta_core import __version__
from volta_core.cuda_toolkit import CudaToolkitUnavailable, nvrtc_version
from volta_core.host.manager import VoltaPluginManager
from volta_core.vllm.families import installed_family_name

#: ``nvidia-smi --query-gpu`` fields of GPU 0, in the report's names.
SMI_FIELDS = {
    "driver_version": "driver",
    "clocks.max.sm": "sm_clock_max_mhz",
    "clocks.max.memory": "memory_clock_max_mhz",
    "pcie.link.gen.max": "pcie_gen_max",
    "pcie.link.width.max": "pcie_width_max",
    "power.limit": "power_limit_w",
}

#: Seconds an ``nvidia-smi`` query may take.
SMI_TIMEOUT_S = 10


def _smi(*args: str) -> str | None:
    """``nvidia-smi``'s output, or None where it is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        run = subprocess.run(
            [smi, *args], capture_output=True, text=True, check=False, timeout=SMI_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout if run.returncode == 0 else None


def smi_facts(query: str | None) -> dict[str, str | None]:
    """GPU 0's line of ``nvidia-smi --query-gpu=...`` (``query``: its CSV output) by field."""
    values = (query or "").strip().splitlines()[:1]
    cells = [c.strip() for c in values[0].split(",")] if values else []
    return {
        name: (cells[i] if i < len(cells) and cells[i] not in ("", "[N/A]", "N/A") else None)
        for i, name in enumerate(SMI_FIELDS.values())
    }


def nvlink_links(status: str | None) -> list[str]:
    """The active NVLink links' speeds (``"25.781 GB/s"``) in ``nvidia-smi nvlink -s`` output."""
    links = []
    for line in (status or "").splitlines():
        label, _, speed = line.strip().partition(":")
        if label.startswith("Link ") and "GB/s" in speed:
            links.append(speed.strip())
    return links


def describe_device() -> dict[str, Any]:
    """GPU 0 as torch and ``nvidia-smi`` see it, and how the GPUs are connected."""
    import torch

    props = torch.cuda.get_device_properties(0)
    query = _smi(f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits")
    facts = smi_facts(query)
    links = nvlink_links(_smi("nvlink", "-s", "-i", "0"))
    pcie = (
        f"PCIe gen {facts['pcie_gen_max']} x{facts['pcie_width_max']}"
        if facts["pcie_gen_max"]
        else "PCIe (link not reported)"
    )
    nvlink = f"NVLink {len(links)} links x {links[0]}" if links else "no NVLink"
    return {
        "name": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 2),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
        **facts,
        "gpus": torch.cuda.device_count(),
        "interconnect": f"{pcie}; {nvlink}",
    }


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def describe_software(manager: VoltaPluginManager) -> dict[str, Any]:
    """torch, CUDA, Triton, NVRTC, vLLM and every plugin, by version."""
    import torch

    try:
        major, minor = nvrtc_version()
        nvrtc: str | None = f"{major}.{minor}"
    except CudaToolkitUnavailable:
        nvrtc = None
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "vllm_volta_core": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "triton": triton_version,
        "nvrtc": nvrtc,
        "vllm_family": installed_family_name(),
        "vllm": _version("vllm") or _version("1cat-vllm"),
        "plugins": {
            record.name: f"{record.distribution} {record.version} ({record.status.value})".strip()
            for record in sorted(manager.records.values(), key=lambda r: r.name)
        },
    }
