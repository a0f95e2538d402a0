"""``vllm-volta doctor``'s multi-GPU checks on NVML answers of real V100 topologies.

``data/nvml/*.json`` hold what NVML answers on four boxes, keyed by the NVML function that
answers (per GPU, or per GPU pair ``"a-b"``): 2 x V100-PCIE-32GB without NVLink, 4 x
V100-SXM2-32GB on one NVLink board, a V100 beside a T4, and the 8 x V100-SXM2 of a DGX-1.
:class:`ReplayedNvml` serves them under ``pynvml``'s names, so the doctor's own NVML calls run
unchanged. The answers are hand-written from each box's public topology, not recorded on one (no
V100 is reachable from the test machines): the DGX-1's from the hybrid cube-mesh that NVIDIA
documents for it (the DGX-1 with V100 system architecture whitepaper; ``nvidia-smi topo -m``
there shows each GPU with NV1 or NV2 to four others and SYS to the other three).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from volta_core import VoltaPluginManager
from volta_core.doctor import checks as doctor
from volta_core.doctor import topology
from volta_core.doctor.checks import Status
from volta_core.planner.fit import FitOptions

DATA = Path(__file__).parent / "data" / "nvml"
ERRORS = {"NVML_ERROR_INVALID_ARGUMENT": 2, "NVML_ERROR_NOT_SUPPORTED": 3}


class NVMLError(Exception):
    """``pynvml.NVMLError``: the NVML return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class ReplayedNvml:
    """A ``pynvml`` stand-in answering from a recording; ``calls`` lists what was asked."""

    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, box: str) -> None:
        self.box = json.loads((DATA / f"{box}.json").read_text())
        self.calls: list[str] = []
        self.started = False

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml"):
            object.__getattribute__(self, "calls").append(name)
        return object.__getattribute__(self, name)

    def _device(self, handle: int, call: str) -> Any:
        answer = self.box["devices"][handle][call]
        if isinstance(answer, str) and answer in ERRORS:
            raise NVMLError(ERRORS[answer])
        return answer

    def nvmlInit(self) -> None:
        self.started = True

    def nvmlShutdown(self) -> None:
        self.started = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.box["nvmlSystemGetDriverVersion"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self.box["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self._device(handle, "nvmlDeviceGetName"))

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return SimpleNamespace(**self._device(handle, "nvmlDeviceGetPciInfo"))

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        major, minor = self._device(handle, "nvmlDeviceGetCudaComputeCapability")
        return major, minor

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(**self._device(handle, "nvmlDeviceGetMemoryInfo"))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        processes = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(**p) for p in processes]

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        states = self._device(handle, "nvmlDeviceGetNvLinkState")
        if link >= len(states):
            raise NVMLError(ERRORS["NVML_ERROR_INVALID_ARGUMENT"])
        return int(states[link])

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> Any:
        return SimpleNamespace(**self._device(handle, "nvmlDeviceGetNvLinkRemotePciInfo")[link])

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        assert index == 0  # NVML_P2P_CAPS_INDEX_READ
        return int(self.box["nvmlDeviceGetP2PStatus"][f"{a}-{b}"])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return int(self.box["nvmlDeviceGetTopologyCommonAncestor"][f"{a}-{b}"])


def rows(
    box: str,
    cuda: str | None = "12.8",
    tp: int | None = None,
    utilization: float = 0.9,
    **env: str,
) -> dict[str, doctor.Check]:
    nvml = ReplayedNvml(box)
    probe = topology.probe_topology(nvml)
    assert not nvml.started  # shut down again
    fit = FitOptions(gpu_memory_utilization=utilization)
    checked = topology.check_topology(probe, cuda, env, fit, tensor_parallel_size=tp)
    return {row.name: row for row in checked}


def test_two_pcie_v100s_need_the_nccl_settings_and_one_has_its_memory_taken() -> None:
    found = rows("2x_v100_pcie")
    assert list(found) == ["interconnect", "gpu kinds", "gpu 0 memory", "gpu 1 memory", "driver"]
    link = found["interconnect"]
    assert link.status is Status.PROBLEM
    assert link.detail == (
        "tensor parallel 2 on GPU 0, 1 (every visible GPU; --tensor-parallel-size N checks a "
        "plan's): PCIe only between every pair (no NVLink)"
    )
    assert link.notes == ("GPU 0 - GPU 1: PCIe only, through a PCIe host bridge, P2P read ok",)
    assert "NCCL_P2P_DISABLE=1" in link.fix
    assert "--disable-custom-all-reduce" in link.fix
    assert "1Cat-vLLM#42, #652" in link.fix
    assert found["gpu kinds"].status is Status.OK
    assert found["gpu 0 memory"].status is Status.OK
    taken = found["gpu 1 memory"]
    assert taken.status is Status.PROBLEM
    assert "25.7 of 32.0 GiB free" in taken.detail
    assert "needs 28.8 GiB free at start; held by pid 31337 (6.0 GiB)" in taken.detail
    assert (
        taken.fix == "stop pid 31337 (6.0 GiB), or serve with --gpu-memory-utilization 0.80 or less"
    )
    driver = found["driver"]  # 535 runs CUDA 12.8 only through minor-version compatibility
    assert driver.status is Status.INFO
    assert "below CUDA 12.8's 570.26" in driver.detail
    assert driver.fix.startswith("install NVIDIA driver 570.26 or newer")


def test_with_nccl_p2p_disabled_the_pcie_pair_only_needs_the_flag() -> None:
    link = rows("2x_v100_pcie", NCCL_P2P_DISABLE="1")["interconnect"]
    assert link.status is Status.INFO
    assert "pass --disable-custom-all-reduce as well" in link.detail


def test_tensor_parallel_1_on_the_pcie_pair_is_no_problem_and_checks_its_own_gpu() -> None:
    """TP 1 sends nothing between GPUs: the PCIe pair is a note, and GPU 1's memory, held by
    another process, is not the server's."""
    found = rows("2x_v100_pcie", tp=1)
    assert list(found) == ["interconnect", "gpu kinds", "gpu 0 memory", "driver"]
    link = found["interconnect"]
    assert link.status is Status.INFO
    assert link.detail.startswith("tensor parallel 1 on GPU 0: no traffic between GPUs;")
    assert not link.fix
    # CUDA_VISIBLE_DEVICES picks the GPU, and so the memory checked.
    assert "gpu 1 memory" in rows("2x_v100_pcie", tp=1, CUDA_VISIBLE_DEVICES="1")
    # At a utilization its free memory allows, the busy GPU is fine too.
    assert rows("2x_v100_pcie", utilization=0.8)["gpu 1 memory"].status is Status.OK


def test_four_sxm2_v100s_are_nvlink_connected_in_pairs_of_one_and_two_links() -> None:
    found = rows("4x_v100_sxm2_nvlink")
    link = found["interconnect"]
    assert link.status is Status.OK
    assert link.detail.endswith(": NVLink between every pair")
    assert link.notes == (
        "GPU 0 - GPU 1: NVLink x1, P2P read ok",
        "GPU 0 - GPU 2: NVLink x1, P2P read ok",
        "GPU 0 - GPU 3: NVLink x2, P2P read ok",
        "GPU 1 - GPU 2: NVLink x2, P2P read ok",
        "GPU 1 - GPU 3: NVLink x1, P2P read ok",
        "GPU 2 - GPU 3: NVLink x1, P2P read ok",
    )
    assert found["gpu kinds"].detail == "4 GPUs of one kind (7.0: GPU 0, 1, 2, 3)"
    assert all(found[f"gpu {i} memory"].status is Status.OK for i in range(4))
    assert found["driver"].status is Status.OK
    # A CUDA 13 torch needs the R580 driver; 570 cannot start it at all.
    driver = rows("4x_v100_sxm2_nvlink", cuda="13.0")["driver"]
    assert driver.status is Status.PROBLEM
    assert "older than any CUDA 13.x runs on (580.65.06)" in driver.detail


def test_a_v100_beside_a_t4_is_two_kinds_and_the_t4_is_smaller_than_the_plan_assumes() -> None:
    found = rows("v100_t4_mixed")
    kinds = found["gpu kinds"]
    assert kinds.status is Status.PROBLEM
    assert "mixed compute capabilities (7.0: GPU 0; 7.5: GPU 1)" in kinds.detail
    assert kinds.fix.startswith("serve on GPUs of one kind: CUDA_VISIBLE_DEVICES=")
    link = found["interconnect"]
    assert link.notes == (
        "GPU 0 - GPU 1: PCIe only, through across CPU sockets, P2P read GPU not supported",
    )
    small = found["gpu 1 memory"]
    assert small.status is Status.INFO
    assert small.fix.startswith("vllm-volta plan MODEL --gpu-memory 15360MiB")
    assert found["driver"].status is Status.INFO  # 550 < 570.26, >= 525.60.13


def test_the_pcie_fix_names_the_nvlink_connected_groups_of_the_tp_size() -> None:
    nvml = ReplayedNvml("4x_v100_sxm2_nvlink")
    # GPUs 2 and 3 of another board: their links to GPUs 0 and 1 are down.
    for gpu, remotes in ((0, [1]), (1, [0]), (2, [3]), (3, [2])):
        device = nvml.box["devices"][gpu]
        bus = [nvml.box["devices"][r]["nvmlDeviceGetPciInfo"] for r in remotes]
        device["nvmlDeviceGetNvLinkState"] = [1] * len(bus)
        device["nvmlDeviceGetNvLinkRemotePciInfo"] = bus
    probe = topology.probe_topology(nvml)

    def link(tp: int | None, **env: str) -> doctor.Check:
        return topology.check_topology(probe, "12.8", env, tensor_parallel_size=tp)[0]

    every = link(None)
    assert every.status is Status.PROBLEM
    assert every.detail.endswith(": PCIe only between 4 of 6 pairs (no NVLink)")
    assert every.fix == topology.PCIE_TP_FIX  # no group of 4 that NVLink connects
    assert link(2).status is Status.OK  # GPUs 0 and 1
    split = link(2, CUDA_VISIBLE_DEVICES="1,2")
    assert split.status is Status.PROBLEM
    assert split.detail.startswith("tensor parallel 2 on GPU 1, 2: PCIe only between every pair")
    assert split.fix.endswith(
        "or run tensor parallel 2 on GPUs that NVLink connects pairwise: "
        "CUDA_VISIBLE_DEVICES=0,1 or CUDA_VISIBLE_DEVICES=2,3"
    )


def test_dgx1_tp4_inside_a_quad_is_fine_and_across_quads_the_fix_names_the_quads() -> None:
    """A DGX-1 links each GPU to 4 of the 7 others: GPUs 0-3 and 4-7 are linked pairwise, and
    each GPU to one of the other quad. Tensor parallel 4 on the first four GPUs needs no NCCL
    settings; on GPUs not all linked the fix names the quads, not the whole box."""
    found = rows("8x_v100_sxm2_dgx1", tp=4)
    link = found["interconnect"]
    assert link.status is Status.OK
    assert link.detail == "tensor parallel 4 on GPU 0, 1, 2, 3: NVLink between every pair"
    assert len(link.notes) == 28
    assert "GPU 0 - GPU 4: NVLink x2, P2P read ok" in link.notes
    across_sockets = "GPU 0 - GPU 5: PCIe only, through across CPU sockets, P2P read IOH topology"
    assert f"{across_sockets} not supported" in link.notes
    # Only the GPUs TP runs on are checked for memory: GPU 5's leftover process is not theirs.
    assert [name for name in found if name.endswith("memory")] == [
        f"gpu {i} memory" for i in range(4)
    ]
    assert not [row for row in found.values() if row.status is Status.PROBLEM]

    across = rows("8x_v100_sxm2_dgx1", tp=4, CUDA_VISIBLE_DEVICES="0,1,2,5")["interconnect"]
    assert across.status is Status.PROBLEM
    assert across.detail == (
        "tensor parallel 4 on GPU 0, 1, 2, 5: PCIe only between 2 of 6 pairs (no NVLink)"
    )
    assert across.fix.endswith(
        "or run tensor parallel 4 on GPUs that NVLink connects pairwise: "
        "CUDA_VISIBLE_DEVICES=0,1,2,3 or CUDA_VISIBLE_DEVICES=4,5,6,7"
    )
    # A quad of two linked pairs, linked across into a ring: NCCL's ring runs over NVLink.
    ring = rows("8x_v100_sxm2_dgx1", tp=4, CUDA_VISIBLE_DEVICES="0,1,4,5")["interconnect"]
    assert ring.status is Status.INFO
    assert "PCIe only between 2 of 6 pairs, but NVLink runs a ring through all" in ring.detail


def test_dgx1_tp8_is_no_problem_and_nccl_p2p_disable_is_advised_against() -> None:
    """Tensor parallel 8 over the cube mesh: not every pair is linked, but NVLink runs a ring
    through all eight, which NCCL uses; vLLM turns its custom all-reduce off itself. Turning
    NCCL's peer-to-peer off would only move the all-reduce to host memory."""
    found = rows("8x_v100_sxm2_dgx1")
    link = found["interconnect"]
    assert link.status is Status.INFO
    assert link.detail.startswith("tensor parallel 8 on GPU 0, 1, 2, 3, 4, 5, 6, 7 (every")
    assert "PCIe only between 12 of 28 pairs, but NVLink runs a ring through all" in link.detail
    assert not link.fix
    off = rows("8x_v100_sxm2_dgx1", NCCL_P2P_DISABLE="1")["interconnect"]
    assert off.status is Status.INFO
    assert off.detail.endswith(
        "NCCL_P2P_DISABLE=1 is set: unset it, it moves NCCL's all-reduce off NVLink to host memory"
    )
    # GPU 5 holds a leftover 2 GiB: a problem at 0.9, not at the 0.85 its free memory allows.
    busy = found["gpu 5 memory"]
    assert busy.status is Status.PROBLEM
    assert (
        busy.fix == "stop pid 4242 (2.0 GiB), or serve with --gpu-memory-utilization 0.85 or less"
    )
    allowed = rows("8x_v100_sxm2_dgx1", utilization=0.85)["gpu 5 memory"]
    assert allowed.status is Status.INFO  # only smaller than the plan's default V100-32GB


def test_more_tensor_parallel_ranks_than_visible_gpus_is_a_problem() -> None:
    link = rows("8x_v100_sxm2_dgx1", tp=2, CUDA_VISIBLE_DEVICES="3")["interconnect"]
    assert link.status is Status.PROBLEM
    assert link.detail == "--tensor-parallel-size 2 needs 2 GPUs; 1 visible"
    assert link.fix == "serve with --tensor-parallel-size 1 or less"
    named = rows("8x_v100_sxm2_dgx1", tp=4, CUDA_VISIBLE_DEVICES="GPU-8a1c")["interconnect"]
    assert named.status is Status.OK  # the UUID is not read: the first four GPUs
    assert named.notes[-1] == (
        "CUDA_VISIBLE_DEVICES=GPU-8a1c is not a list of GPU indices NVML numbers: judged over "
        "every GPU"
    )


def test_without_nvml_the_rows_say_the_checks_were_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    (row,) = topology.check_topology(topology.probe_topology(), "12.8")
    assert row.status is Status.INFO
    assert row.detail == (
        "multi-GPU checks skipped: pynvml (pip install nvidia-ml-py) is not installed"
    )

    class NoDriver(ReplayedNvml):
        def nvmlInit(self) -> None:
            raise NVMLError(9)

    (row,) = topology.check_topology(topology.probe_topology(NoDriver("2x_v100_pcie")), None)
    assert row.detail == "multi-GPU checks skipped: NVML did not start: 9"


def test_doctor_runs_the_topology_rows_after_the_gpus() -> None:
    nvml = ReplayedNvml("2x_v100_pcie")
    report = doctor.run_checks(
        VoltaPluginManager,
        gpu_probe=lambda: doctor.GpuProbe(None, reason="not asked"),
        topology_probe=lambda: topology.probe_topology(nvml),
    )
    names = [row.name for row in report.checks]
    assert names[:3] == ["gpus", "interconnect", "gpu kinds"]
    assert "fix: for tensor parallelism over PCIe: export NCCL_P2P_DISABLE=1" in report.render()


def test_torch_cuda_is_read_from_torch_version_py(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.10.0'\ncuda: Optional[str] = '12.8'\n"
    )
    spec = importlib.machinery.ModuleSpec("torch", None, origin=str(package / "__init__.py"))
    real = importlib.util.find_spec  # the module topology reads it from
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: spec if name == "torch" else real(name)
    )
    assert topology.torch_cuda() == "12.8"
    (package / "version.py").write_text("cuda: Optional[str] = None\n")
    assert topology.torch_cuda() is None


def test_the_replayed_calls_are_pynvmls_own() -> None:
    """Every NVML function the doctor called on a replay is one ``pynvml`` defines."""
    pynvml = pytest.importorskip("pynvml")
    nvml = ReplayedNvml("4x_v100_sxm2_nvlink")
    topology.probe_topology(nvml)
    assert sorted(set(nvml.calls)) == sorted(set(nvml.calls) & set(dir(pynvml)))
    assert {"nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetP2PStatus"} <= set(nvml.calls)
