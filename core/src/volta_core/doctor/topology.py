"""``vllm-volta doctor``'s multi-GPU checks, read through NVML: how the GPUs are connected, whether
they are of one kind, what other processes hold of their memory, and whether the driver runs the
CUDA that the installed torch was built with.

The rules, and where they come from:

- Interconnect, judged for the GPUs tensor parallelism runs on: the first
  ``--tensor-parallel-size`` of those ``CUDA_VISIBLE_DEVICES`` names (vLLM gives rank ``i`` the
  ``i``-th visible GPU), or every visible GPU when no size is given. A pair of V100s without
  NVLink talks over PCIe. vLLM's custom all-reduce and NCCL's peer-to-peer path hang there at
  start or in the first all-reduce (1CatAI/1Cat-vLLM#42, #652: 2 x V100 PCIe, TP 2, fixed by
  ``NCCL_P2P_DISABLE=1`` and ``--disable-custom-all-reduce``; P2P over PCIe is what hangs, so
  NVML's P2P answer does not clear a PCIe pair), so tensor parallelism over such a pair needs
  both; tensor parallel 1 sends nothing between GPUs. GPUs that NVLink connects pairwise need
  neither. More than two GPUs that NVLink connects in a ring but not pairwise (the 8 x V100 SXM2
  hybrid cube mesh of a DGX-1: each GPU linked to 4 of the 7 others) are fine too: NCCL runs its
  rings over NVLink, and vLLM turns its custom all-reduce off by itself for more than two GPUs
  not all NVLink-connected (``vllm/distributed/device_communicators/custom_all_reduce.py``),
  while ``NCCL_P2P_DISABLE=1`` would move the all-reduce to host memory. Where the TP group has
  PCIe-only pairs, the fix also names groups of that size that NVLink connects pairwise (0-3 and
  4-7 for TP 4 on a DGX-1). NVML's answers: the NVLink links that are up
  (``nvmlDeviceGetNvLinkState``) and the GPU at each one's other end
  (``nvmlDeviceGetNvLinkRemotePciInfo``); peer-to-peer reads (``nvmlDeviceGetP2PStatus``); the
  nearest common PCIe ancestor (``nvmlDeviceGetTopologyCommonAncestor``). NVML numbers GPUs in
  PCI bus order, as CUDA does for GPUs of one kind (or with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
- One kind of GPU. Tensor-parallel ranks on GPUs of different compute capability run different
  kernels at different speeds, and vLLM sizes every rank's KV cache by the smallest GPU.
- Memory. vLLM refuses to start when a GPU's free memory is below ``--gpu-memory-utilization``
  times its total (``vllm/v1/worker/utils.py``, "Free memory on device ... is less than desired
  GPU memory utilization"); the utilization given to ``doctor`` (default the plan's, 0.9) is the
  one checked, on the GPUs tensor parallelism runs on, and the processes holding the rest are
  named.
- Driver. The driver must be at least the minimum of the CUDA release torch was built with; with
  an older driver of the same major release the CUDA minor-version compatibility runs it, but
  PTX built by the newer toolkit (the plugins' NVRTC kernels) cannot be loaded
  (:data:`CUDA_DRIVERS`).

NVML comes from ``pynvml`` (``pip install nvidia-ml-py``; vLLM depends on it), imported only here
and optional: without it the rows say the checks were skipped. :func:`read_topology` takes the
module, so tests replay recorded NVML answers through the same calls.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from volta_core.doctor.checks import Check, Status
from volta_core.planner.fit import FitOptions

GIB = 1 << 30
MIB = 1 << 20

#: The fix for tensor parallelism over PCIe (1CatAI/1Cat-vLLM#42, #652).
PCIE_TP_FIX = (
    "for tensor parallelism over PCIe: export NCCL_P2P_DISABLE=1 and pass "
    "--disable-custom-all-reduce to vllm serve (both hang on V100 PCIe otherwise: "
    "1CatAI/1Cat-vLLM#42, #652)"
)

#: The Linux driver each CUDA release needs, from the CUDA Toolkit release notes
#: (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html): Table 3 "CUDA Toolkit
#: and Corresponding Driver Versions" (the GA release of each minor), and for each major the
#: minimum of "CUDA Minor Version Compatibility" (below it nothing of that major runs).
CUDA_DRIVERS: Mapping[tuple[int, int], tuple[int, ...]] = {
    (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13),
    (12, 1): (530, 30, 2),
    (12, 2): (535, 54, 3),
    (12, 3): (545, 23, 6),
    (12, 4): (550, 54, 14),
    (12, 5): (555, 42, 2),
    (12, 6): (560, 28, 3),
    (12, 8): (570, 26),
    (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6),
}
MINOR_COMPATIBILITY_DRIVERS: Mapping[int, tuple[int, ...]] = {
    11: (450, 80, 2),
    12: (525, 60, 13),
    13: (580, 65, 6),
}

#: ``nvmlGpuP2PStatus_t`` (nvml.h): what ``nvmlDeviceGetP2PStatus`` answers.
P2P_STATUS = {
    0: "ok",
    1: "chipset not supported",
    2: "GPU not supported",
    3: "IOH topology not supported",
    4: "disabled by regkey",
    5: "not supported",
    6: "unknown",
}
#: ``nvmlGpuTopologyLevel_t`` (nvml.h): the nearest common ancestor of two GPUs.
TOPOLOGY_LEVEL = {
    0: "same board",
    10: "one PCIe switch",
    20: "PCIe switches",
    30: "a PCIe host bridge",
    40: "one NUMA node",
    50: "across CPU sockets",
}
#: NVML's ``NVML_P2P_CAPS_INDEX_READ`` and ``NVML_FEATURE_ENABLED``; ``NVML_NVLINK_MAX_LINKS``
#: where the module does not define it (V100 has 6 links).
P2P_CAPS_INDEX_READ = 0
FEATURE_ENABLED = 1
NVLINK_MAX_LINKS = 18


@dataclass(frozen=True)
class GpuState:
    """One GPU as NVML reports it."""

    index: int
    name: str
    bus_id: str
    capability: tuple[int, int]
    total: int
    free: int
    processes: tuple[tuple[int, int | None], ...]
    """``(pid, bytes used or None when NVML does not say)`` of each compute process."""
    nvlink_peers: tuple[str, ...]
    """The PCI bus id at the other end of each active NVLink link."""


@dataclass(frozen=True)
class GpuPair:
    """How two GPUs reach each other."""

    a: int
    b: int
    nvlinks: int
    p2p: str
    ancestor: str


@dataclass(frozen=True)
class Topology:
    """The GPUs, every pair of them, and the driver."""

    gpus: tuple[GpuState, ...]
    pairs: tuple[GpuPair, ...]
    driver: str


@dataclass(frozen=True)
class TopologyProbe:
    """What NVML said, or why it could not be asked."""

    topology: Topology | None
    reason: str = ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus(pci: Any) -> str:
    return _text(pci.busId).lower()


def _nvml_answer(nvml: Any, call: str, *args: Any, default: Any) -> Any:
    """``nvml.<call>(*args)``; ``default`` where NVML refuses (not supported, no such link)."""
    try:
        return getattr(nvml, call)(*args)
    except nvml.NVMLError:
        return default


def read_topology(nvml: Any) -> Topology:
    """Every GPU NVML sees and every pair of them, through ``nvml`` (``pynvml`` or a replay)."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS)
    gpus = []
    for index, handle in enumerate(handles):
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        running = _nvml_answer(nvml, "nvmlDeviceGetComputeRunningProcesses", handle, default=[])
        peers = []
        for link in range(max_links):
            state = _nvml_answer(nvml, "nvmlDeviceGetNvLinkState", handle, link, default=None)
            if state is None:  # no NVLink on this GPU, or past its last link
                break
            if state == FEATURE_ENABLED:
                remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                peers.append(_bus(remote))
        gpus.append(
            GpuState(
                index=index,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                bus_id=_bus(nvml.nvmlDeviceGetPciInfo(handle)),
                capability=(int(major), int(minor)),
                total=int(memory.total),
                free=int(memory.free),
                processes=tuple((int(p.pid), p.usedGpuMemory) for p in running),
                nvlink_peers=tuple(peers),
            )
        )
    pairs = []
    for a, b in itertools.combinations(range(len(gpus)), 2):
        p2p = _nvml_answer(
            nvml, "nvmlDeviceGetP2PStatus", handles[a], handles[b], P2P_CAPS_INDEX_READ, default=6
        )
        level = _nvml_answer(
            nvml, "nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b], default=None
        )
        pairs.append(
            GpuPair(
                a,
                b,
                nvlinks=gpus[a].nvlink_peers.count(gpus[b].bus_id),
                p2p=P2P_STATUS.get(int(p2p), f"status {p2p}"),
                ancestor=TOPOLOGY_LEVEL.get(int(level), f"level {level}")
                if level is not None
                else "unknown",
            )
        )
    return Topology(tuple(gpus), tuple(pairs), _text(nvml.nvmlSystemGetDriverVersion()))


def probe_topology(nvml: Any = None) -> TopologyProbe:
    """Start NVML (``pynvml`` unless a module is given), read the topology, shut it down."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return TopologyProbe(None, "pynvml (pip install nvidia-ml-py) is not installed")
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return TopologyProbe(None, f"NVML did not start: {exc}")
    try:
        return TopologyProbe(read_topology(nvml))
    finally:
        nvml.nvmlShutdown()


# -- the checks -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TpGroup:
    """The GPUs a server would use: those visible to CUDA, and the first ``size`` of them that
    tensor parallelism runs on."""

    visible: tuple[int, ...]
    size: int
    given: bool
    """Whether ``--tensor-parallel-size`` was given (else every visible GPU)."""
    note: str = ""
    """Why ``CUDA_VISIBLE_DEVICES`` was not read, where it was set but not read."""

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.visible[: self.size]

    def describe(self) -> str:
        """``tensor parallel 4 on GPU 0, 1, 2, 3`` (and where the size came from)."""
        text = f"tensor parallel {self.size} on GPU {', '.join(map(str, self.gpus))}"
        if not self.given:
            text += " (every visible GPU; --tensor-parallel-size N checks a plan's)"
        return text


def tp_group(
    topology: Topology, env: Mapping[str, str], tensor_parallel_size: int | None
) -> TpGroup:
    """The visible GPUs (``CUDA_VISIBLE_DEVICES`` when it lists NVML indices, else all) and the
    tensor-parallel size (every visible GPU when None)."""
    every = tuple(gpu.index for gpu in topology.gpus)
    named = env.get("CUDA_VISIBLE_DEVICES")
    visible, note = every, ""
    if named is not None:
        parts = [part.strip() for part in named.split(",")]
        if all(part.isdigit() and int(part) in every for part in parts):
            visible = tuple(int(part) for part in parts)
        else:
            note = (
                f"CUDA_VISIBLE_DEVICES={named} is not a list of GPU indices NVML numbers: "
                "judged over every GPU"
            )
    given = tensor_parallel_size is not None
    size = tensor_parallel_size if tensor_parallel_size is not None else len(visible)
    return TpGroup(visible, size, given, note)


def check_interconnect(topology: Topology, env: Mapping[str, str], group: TpGroup) -> Check:
    """The links between the GPUs tensor parallelism runs on: NVLink between every pair, or a
    ring of NVLink through them, or PCIe pairs with the settings tensor parallelism needs there
    (and the NVLink-connected groups of that size that need none)."""
    notes = tuple(
        f"GPU {p.a} - GPU {p.b}: "
        + (f"NVLink x{p.nvlinks}" if p.nvlinks else f"PCIe only, through {p.ancestor}")
        + f", P2P read {p.p2p}"
        for p in topology.pairs
    ) + ((group.note,) if group.note else ())
    if group.size > len(group.visible):
        return Check(
            "interconnect",
            Status.PROBLEM,
            f"--tensor-parallel-size {group.size} needs {group.size} GPUs; "
            f"{len(group.visible)} visible",
            fix=f"serve with --tensor-parallel-size {len(group.visible)} or less",
            notes=notes,
        )
    linked = {(p.a, p.b) for p in topology.pairs if p.nvlinks}

    def nvlinked(a: int, b: int) -> bool:
        return (min(a, b), max(a, b)) in linked

    pairs = list(itertools.combinations(group.gpus, 2))
    pcie = [pair for pair in pairs if not nvlinked(*pair)]
    head = group.describe()
    if group.size == 1:
        if any(not nvlinked(*pair) for pair in itertools.combinations(group.visible, 2)):
            head += (
                ": no traffic between GPUs; tensor parallelism over these GPUs' PCIe-only "
                "pairs would need NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce"
            )
            return Check("interconnect", Status.INFO, head, notes=notes)
        return Check("interconnect", Status.OK, head + ": no traffic between GPUs", notes=notes)
    p2p_off = env.get("NCCL_P2P_DISABLE") == "1"
    if not pcie or _nvlink_ring(group.gpus, nvlinked):
        if pcie:
            head += (
                f": PCIe only between {len(pcie)} of {len(pairs)} pairs, but NVLink runs a "
                "ring through all: NCCL's rings use NVLink, and vLLM turns its custom "
                "all-reduce off by itself (more than two GPUs not all NVLink-connected)"
            )
        else:
            head += ": NVLink between every pair"
        if p2p_off:
            head += (
                "; NCCL_P2P_DISABLE=1 is set: unset it, it moves NCCL's all-reduce off NVLink "
                "to host memory"
            )
        return Check(
            "interconnect", Status.INFO if pcie or p2p_off else Status.OK, head, notes=notes
        )
    what = "every pair" if len(pcie) == len(pairs) else f"{len(pcie)} of {len(pairs)} pairs"
    detail = f"{head}: PCIe only between {what} (no NVLink)"
    if p2p_off:
        detail += "; NCCL_P2P_DISABLE=1 is set: pass --disable-custom-all-reduce as well"
        return Check("interconnect", Status.INFO, detail, notes=notes)
    fix = PCIE_TP_FIX
    every = tuple(gpu.index for gpu in topology.gpus)
    cliques = _nvlink_cliques(every, group.size, nvlinked)
    if cliques:
        fix += (
            f"; or run tensor parallel {group.size} on GPUs that NVLink connects pairwise: "
            + " or ".join("CUDA_VISIBLE_DEVICES=" + ",".join(map(str, c)) for c in cliques)
        )
    return Check("interconnect", Status.PROBLEM, detail, fix=fix, notes=notes)


def _nvlink_ring(gpus: tuple[int, ...], nvlinked: Callable[[int, int], bool]) -> bool:
    """Whether NVLink links a ring through every one of ``gpus`` (more than two), each GPU to
    the next and the last to the first: a depth-first search along the links, so a GPU
    without links ends it at once."""
    if len(gpus) < 3:
        return False
    first = gpus[0]

    def extend(last: int, left: frozenset[int]) -> bool:
        if not left:
            return nvlinked(last, first)
        return any(extend(gpu, left - {gpu}) for gpu in left if nvlinked(last, gpu))

    return extend(first, frozenset(gpus[1:]))


def _nvlink_cliques(
    gpus: tuple[int, ...], size: int, nvlinked: Callable[[int, int], bool]
) -> list[tuple[int, ...]]:
    """Disjoint groups of ``size`` of ``gpus`` that NVLink connects pairwise, lowest first."""
    found: list[tuple[int, ...]] = []
    for group in itertools.combinations(gpus, size):
        taken = any(set(group) & set(other) for other in found)
        if not taken and all(nvlinked(a, b) for a, b in itertools.combinations(group, 2)):
            found.append(group)
    return found


def check_kinds(topology: Topology) -> Check:
    """GPUs of one compute capability and memory size, or which differ."""
    by_capability: dict[tuple[int, int], list[int]] = {}
    for gpu in topology.gpus:
        by_capability.setdefault(gpu.capability, []).append(gpu.index)
    kinds = "; ".join(
        f"{major}.{minor}: GPU {', '.join(map(str, indexes))}"
        for (major, minor), indexes in sorted(by_capability.items())
    )
    if len(by_capability) > 1:
        largest = max(by_capability.values(), key=len)
        return Check(
            "gpu kinds",
            Status.PROBLEM,
            f"mixed compute capabilities ({kinds}): tensor-parallel ranks would run different "
            "kernels at different speeds",
            fix="serve on GPUs of one kind: CUDA_VISIBLE_DEVICES="
            + ",".join(map(str, largest))
            + " (or one server per kind)",
        )
    totals = {gpu.total for gpu in topology.gpus}
    if len(totals) > 1:
        smallest = min(totals) / GIB
        return Check(
            "gpu kinds",
            Status.INFO,
            f"one compute capability ({kinds}) but different memory sizes: vLLM sizes every "
            f"rank's KV cache by the smallest ({smallest:.1f} GiB)",
        )
    return Check("gpu kinds", Status.OK, f"{len(topology.gpus)} GPUs of one kind ({kinds})")


def check_memory(gpu: GpuState, fit: FitOptions) -> Check:
    """Free memory against what vLLM asks at start (the plan's ``--gpu-memory-utilization``), and
    the GPU's size against the plan's default ``--gpu-memory``."""
    name = f"gpu {gpu.index} memory"
    utilization = fit.gpu_memory_utilization
    need = utilization * gpu.total
    detail = f"{gpu.free / GIB:.1f} of {gpu.total / GIB:.1f} GiB free"
    holders = ", ".join(
        f"pid {pid} ({used / GIB:.1f} GiB)" if used is not None else f"pid {pid}"
        for pid, used in gpu.processes
    )
    if gpu.free < need:
        ratio = math.floor(gpu.free / gpu.total * 100) / 100
        fix = f"stop {holders}" if holders else "free the memory other processes hold"
        fix += f", or serve with --gpu-memory-utilization {ratio:.2f} or less"
        detail += (
            f": vLLM with --gpu-memory-utilization {utilization:g} needs {need / GIB:.1f} GiB "
            "free at start"
        )
        if holders:
            detail += f"; held by {holders}"
        return Check(name, Status.PROBLEM, detail, fix=fix)
    if gpu.total < fit.gpu_memory:
        return Check(
            name,
            Status.INFO,
            detail + f"; smaller than the plan's default --gpu-memory ({fit.gpu_memory / GIB:.1f}"
            " GiB, a V100-32GB)",
            fix=f"vllm-volta plan MODEL --gpu-memory {gpu.total // MIB}MiB (NVML's total; CUDA "
            "reports about 1% less)",
        )
    return Check(name, Status.OK, detail + (f" (in use: {holders})" if holders else ""))


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(f"{part:02d}" if i else str(part) for i, part in enumerate(version))


def torch_cuda() -> str | None:
    """The CUDA release torch was built with (``torch.version.cuda``), read from
    ``torch/version.py`` without importing torch; None without torch or for a CPU build."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    version = Path(spec.origin).parent / "version.py"
    if not version.is_file():
        return None
    match = re.search(r"^cuda\b[^=\n]*=\s*['\"]([\d.]+)['\"]", version.read_text(), re.MULTILINE)
    return match.group(1) if match else None


def check_driver(driver: str, cuda: str | None) -> Check:
    """The driver against the minimum of the CUDA release torch was built with."""
    if cuda is None:
        return Check(
            "driver",
            Status.INFO,
            f"driver {driver}; no CUDA build of torch here to check it against",
        )
    release = _release(cuda)[:2]
    installed = _release(driver)
    floor = MINOR_COMPATIBILITY_DRIVERS.get(release[0])
    wanted = CUDA_DRIVERS.get((release[0], release[1]))
    head = f"driver {driver}, torch built with CUDA {cuda}"
    if floor is None or wanted is None:
        return Check("driver", Status.INFO, f"{head}: no driver table entry for CUDA {cuda}")
    fix = f"install NVIDIA driver {_dotted(wanted)} or newer (the CUDA {cuda} release notes)"
    if installed < floor:
        return Check(
            "driver",
            Status.PROBLEM,
            f"{head}: older than any CUDA {release[0]}.x runs on ({_dotted(floor)}); torch "
            "cannot start CUDA",
            fix=fix,
        )
    if installed < wanted:
        return Check(
            "driver",
            Status.INFO,
            f"{head}: below CUDA {cuda}'s {_dotted(wanted)}, running through CUDA's minor-"
            "version compatibility: PTX from the newer toolkit (the plugins' NVRTC kernels) "
            "cannot load",
            fix=fix,
        )
    return Check("driver", Status.OK, f"{head}: at least CUDA {cuda}'s {_dotted(wanted)}")


def check_topology(
    probe: TopologyProbe,
    cuda: str | None,
    env: Mapping[str, str] | None = None,
    fit: FitOptions | None = None,
    tensor_parallel_size: int | None = None,
) -> list[Check]:
    """The multi-GPU rows: interconnect (two GPUs or more, or tensor parallelism asked for) and
    GPU kinds (two GPUs or more), the memory of each GPU tensor parallelism runs on at ``fit``'s
    ``--gpu-memory-utilization``, and the driver; one info row without NVML."""
    if probe.topology is None:
        return [Check("topology", Status.INFO, f"multi-GPU checks skipped: {probe.reason}")]
    topology = probe.topology
    env = os.environ if env is None else env
    fit = fit or FitOptions()
    group = tp_group(topology, env, tensor_parallel_size)
    rows = []
    if len(topology.gpus) > 1 or group.size > 1:
        rows.append(check_interconnect(topology, env, group))
    if len(topology.gpus) > 1:
        rows.append(check_kinds(topology))
    rows += [check_memory(topology.gpus[index], fit) for index in group.gpus]
    if topology.gpus:
        rows.append(check_driver(topology.driver, cuda))
    return rows
