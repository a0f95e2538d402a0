"""``vllm-volta doctor``: is this machine ready to serve with vLLM on a V100, and if not, why.

Each check is a small function returning :class:`Check` rows: ``ok``, ``problem`` (with the
exact fix) or ``info``. The rules, and where they come from:

- GPUs, through NVML (``pynvml`` from ``nvidia-ml-py``, imported only here): vLLM needs compute
  capability 7.0 or newer; no NVML means no GPU checks, which is fine on a machine meant only
  for ``vllm-volta plan``.
- torch: its kernels must include ``sm_70`` (or PTX for 7.0 or older). PyTorch dropped Volta
  from its CUDA 12.8 wheels in release 2.11 and its CUDA 13 wheels never had it (CUDA 13
  removed Volta; pytorch/pytorch#172352, PyTorch ``RELEASE.md`` "PyTorch CUDA Support
  Matrix"): 2.10's default CUDA 12.8 wheel and the ``+cu126`` wheels carry ``sm_70``.
- vLLM: inside the adapter's supported range (:mod:`volta_core.vllm.families`; a 1Cat-vLLM
  release with every touchpoint the adapter reads) and with compiled
  extensions carrying ``sm_70`` SASS or ``compute_70`` PTX, read from their ``.nv_fatbin``
  sections (:mod:`volta_core.doctor.fatbin`) without importing vLLM. vLLM removed 7.0 from its
  CUDA >= 12.8 architecture list (vllm-project/vllm#39878), so its 0.20+ wheels carry none.
- Triton: the ``ptxas`` it would use must assemble for ``sm_70``; CUDA 13's ``ptxas`` cannot
  (the CUDA 13.0 release notes remove offline compilation for Maxwell, Pascal and Volta).
- The Volta plugins (the ``vllm-volta plugins`` records): a failed or refused plugin is a
  problem.
- With a model: the first problems of ``vllm-volta plan`` for it on ``sm_70``.

Whether a CPU-only torch or vLLM, or a missing vLLM or Triton, is a problem depends on the
machine: with an NVIDIA GPU it cannot serve; without one (planning, CI) it is only reported.
Nothing heavy is imported unless a check needs it (torch for the torch check only; vLLM
never), and an unexpected error inside one check becomes a problem row for that check.
"""

from __future__ import annotations

import enum
import importlib.util
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from volta_core.cuda_toolkit import INSTALL_HINT, nvrtc_found
from volta_core.doctor import fatbin
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import HOST_API_VERSION, PluginStatus
from volta_core.planner.model import ModelDescription

if TYPE_CHECKING:
    from volta_core.planner.fit import FitOptions

#: Most plan problems listed for ``--model`` (``vllm-volta plan`` shows them all).
MAX_PLAN_PROBLEMS = 5

TORCH_FIX = (
    "pip install torch==2.10.0 (CUDA 12.8, has sm_70), or for torch 2.11-2.14 a +cu126 build: "
    "pip install torch==2.14.0 --index-url https://download.pytorch.org/whl/cu126"
)
#: 1Cat-vLLM's current release (github.com/1CatAI/1Cat-vLLM releases), which the fixes name.
CURRENT_1CAT = "1Cat-vLLM 1.5.1 (October 2026; 1.2-1.5 are supported)"
VLLM_FIX = (
    "vLLM 0.20+ wheels carry no sm_70 code: install vllm==0.19.1 with torch==2.10.0, "
    f"or {CURRENT_1CAT}, or build vLLM with CUDA 12.6 and TORCH_CUDA_ARCH_LIST=7.0"
)
SUPPORTED_VLLM_FIX = (
    "install a vLLM the Volta adapter supports and that carries sm_70 code: vllm==0.19.1 "
    f"with torch==2.10.0, or {CURRENT_1CAT} (the README's 'Serving with vLLM' lists the range)"
)
PTXAS_ENV = "TRITON_PTXAS_PATH"

#: A trivial kernel: whether a ``ptxas`` can assemble it for ``sm_70`` is the whole question.
PROBE_PTX = """.version 7.0
.target sm_70
.address_size 64

.visible .entry vllm_volta_doctor_probe()
{
\tret;
}
"""


class Status(str, enum.Enum):
    """A check's verdict."""

    OK = "ok"
    PROBLEM = "problem"
    """Serving on this machine would fail or misbehave; ``fix`` says what to do."""
    INFO = "info"
    """Worth knowing, not a reason to fail (a planning machine without a GPU, a skipped plugin)."""


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    status: Status
    detail: str
    fix: str = ""
    notes: tuple[str, ...] = ()
    """Further lines (per-library architectures, further plan problems)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "detail": self.detail,
            "fix": self.fix or None,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU as NVML reports it."""

    index: int
    name: str
    capability: tuple[int, int]
    memory_bytes: int


@dataclass(frozen=True)
class GpuProbe:
    """What NVML said: the GPUs and the driver, or why it could not be asked."""

    gpus: tuple[Gpu, ...] | None
    """None when NVML is absent or did not start; ``()`` when it sees no GPU."""
    driver: str = ""
    reason: str = ""

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)


@dataclass
class Report:
    """Every check, in order."""

    checks: list[Check] = field(default_factory=list)

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.status is Status.PROBLEM]

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.problems,
            "problems": len(self.problems),
            "checks": [c.as_dict() for c in self.checks],
        }

    def render(self) -> str:
        lines = ["vllm-volta doctor"]
        for check in self.checks:
            lines.append(f"{check.status.value:<8} {check.name}: {check.detail}")
            lines += [f"           {note}" for note in check.notes]
            if check.fix:  # on an info row: what serving on a GPU would need
                label = "fix" if check.status is Status.PROBLEM else "to serve"
                lines.append(f"           {label}: {check.fix}")
        count = len(self.problems)
        lines.append(f"{count} problem{'s' if count != 1 else ''}" if count else "no problems")
        return "\n".join(lines)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of ``"12.8"`` or ``"5.16.1"`` (0 where a part has no number)."""
    parts = [re.match(r"\d*", part) for part in version.split(".")[:2]]
    major, minor, *_ = [*(int(m.group() or 0) if m else 0 for m in parts), 0, 0]
    return major, minor


def _serving_severity(gpus: GpuProbe) -> Status:
    """A CPU-only or missing piece stops serving on a GPU machine; elsewhere it is reported."""
    return Status.PROBLEM if gpus.has_gpu else Status.INFO


# -- GPUs -----------------------------------------------------------------------------------


def probe_gpus() -> GpuProbe:
    """Ask NVML for every GPU (name, compute capability, memory) and the driver version."""
    try:
        import pynvml
    except ImportError:
        return GpuProbe(None, reason="pynvml (pip install nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return GpuProbe(None, reason=f"NVML did not start: {exc}")
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(
                Gpu(
                    index,
                    _text(pynvml.nvmlDeviceGetName(handle)),
                    (int(major), int(minor)),
                    int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                )
            )
        return GpuProbe(tuple(gpus), driver=driver)
    finally:
        pynvml.nvmlShutdown()


def check_gpus(probe: GpuProbe) -> list[Check]:
    """One row per GPU; a GPU below compute capability 7.0 is a problem (vLLM needs 7.0+)."""
    if probe.gpus is None:
        return [
            Check(
                "gpus",
                Status.INFO,
                f"no NVIDIA driver/NVML: GPU checks skipped ({probe.reason}); "
                "fine for planning, not for serving",
            )
        ]
    if not probe.gpus:
        return [Check("gpus", Status.INFO, f"NVML (driver {probe.driver}) sees no GPU")]
    rows = []
    for gpu in probe.gpus:
        major, minor = gpu.capability
        detail = (
            f"{gpu.name}, compute capability {major}.{minor}, "
            f"{gpu.memory_bytes / 2**30:.1f} GiB, driver {probe.driver}"
        )
        name = f"gpu {gpu.index}"
        if gpu.capability < (7, 0):
            rows.append(
                Check(
                    name,
                    Status.PROBLEM,
                    detail,
                    fix="vLLM needs compute capability 7.0 or newer: serve on a V100 or newer GPU "
                    "(hide this one with CUDA_VISIBLE_DEVICES)",
                )
            )
        elif major == 7:
            rows.append(Check(name, Status.OK, detail + " (Volta plugins apply)"))
        else:
            rows.append(
                Check(name, Status.INFO, detail + " (not 7.x: the Volta plugins stand aside)")
            )
    return rows


# -- torch ----------------------------------------------------------------------------------

_ARCH = re.compile(r"\b(sm|compute)_(\d+)[af]?\b")


def parse_arch_flags(flags: str) -> fatbin.CudaArchs:
    """``"sm_70 sm_75 compute_90"`` (torch's compiled architecture list) as :class:`CudaArchs`."""
    found = _ARCH.findall(flags)
    sass = tuple(sorted({int(n) for kind, n in found if kind == "sm"}))
    ptx = tuple(sorted({int(n) for kind, n in found if kind == "compute"}))
    return fatbin.CudaArchs(sass=sass, ptx=ptx, entries=len(found))


def torch_archs(torch: Any) -> tuple[fatbin.CudaArchs | None, str]:
    """The architectures torch's CUDA kernels were built for, and where that was read.

    ``torch.cuda.get_arch_list()`` returns ``[]`` without a usable GPU; the compile-time list
    it wraps (``torch._C._cuda_getArchFlags``) needs none. Failing that, the ``.nv_fatbin``
    of ``lib/libtorch_cuda.so`` says the same.
    """
    get_flags = getattr(torch._C, "_cuda_getArchFlags", None)
    if get_flags is not None:
        flags = get_flags()
        if flags:
            return parse_arch_flags(str(flags)), "torch._C._cuda_getArchFlags()"
    library = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    if library.exists():
        return fatbin.cuda_archs(library), str(library)
    return None, ""


def check_torch(gpus: GpuProbe) -> Check:
    """torch's version, CUDA build, and whether its kernels run on a V100."""
    if importlib.util.find_spec("torch") is None:
        return Check("torch", _serving_severity(gpus), "not installed", fix=TORCH_FIX)
    try:
        import torch
    except Exception as exc:  # a torch whose libraries do not load is a finding, not a crash
        return Check(
            "torch", Status.PROBLEM, f"installed but fails to import: {exc}", fix=TORCH_FIX
        )

    cuda = getattr(torch.version, "cuda", None)
    head = f"{torch.__version__}"
    if not cuda:
        return Check(
            "torch",
            _serving_severity(gpus),
            f"{head}: CPU-only build (fine for planning, serves no GPU)",
            fix=TORCH_FIX,
        )
    head += f", CUDA {cuda}"
    archs, source = torch_archs(torch)
    if archs is None:
        return Check(
            "torch",
            Status.PROBLEM,
            f"{head}: its CUDA architecture list could not be read",
            fix="check with torch.cuda.get_arch_list() on the GPU machine; " + TORCH_FIX,
        )
    notes = (f"{archs.describe()} (from {source})",)
    if archs.runs_on(70):
        return Check("torch", Status.OK, f"{head}: kernels include sm_70", notes=notes)
    why = "CUDA 13 builds dropped Volta" if _release(cuda) >= (13, 0) else "no sm_70 kernels"
    return Check("torch", Status.PROBLEM, f"{head}: {why}", fix=TORCH_FIX, notes=notes)


# -- vLLM -----------------------------------------------------------------------------------


def package_dirs(name: str) -> list[Path]:
    """Where a top-level package lives, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [Path(p) for p in spec.submodule_search_locations]
    return [Path(spec.origin).parent] if spec.origin else []


def library_archs(dirs: Iterable[Path]) -> dict[Path, fatbin.CudaArchs | str]:
    """Every ``.so`` under ``dirs`` that carries CUDA code: its architectures (or the error)."""
    found: dict[Path, fatbin.CudaArchs | str] = {}
    for root in dirs:
        for library in sorted(root.rglob("*.so")):
            if not library.is_file():  # a FIFO, socket or device would block or mislead
                continue
            try:
                archs = fatbin.cuda_archs(library)
            except (OSError, fatbin.FatbinError) as exc:
                found[library] = f"unreadable: {exc}"
                continue
            if archs is not None:
                found[library] = archs
    return found


def check_vllm(gpus: GpuProbe) -> list[Check]:
    """vLLM's distribution and version against the adapter's range, and its sm_70 code."""
    from volta_core.vllm import families

    installed = families.installed_vllm()
    dirs = package_dirs("vllm")
    if installed is None and not dirs:
        return [
            Check(
                "vllm",
                _serving_severity(gpus),
                "not installed (vllm-volta plan needs no vLLM)",
                fix=SUPPORTED_VLLM_FIX,
            )
        ]
    rows = []
    label = f"{installed[0]} {installed[1]}" if installed else "vllm (no distribution metadata)"
    family = families.installed_family()
    if installed is None:
        where = ", ".join(str(d) for d in dirs)
        detail = (
            f"a vllm package at {where} has no distribution metadata (dist-info): its version "
            "cannot be told, and the Volta adapter leaves it alone"
        )
        rows.append(Check("vllm", _serving_severity(gpus), detail, fix=SUPPORTED_VLLM_FIX))
    elif family is None:
        reason = families.unsupported_reason() or f"{label} is not supported"
        rows.append(Check("vllm", Status.PROBLEM, reason, fix=SUPPORTED_VLLM_FIX))
    else:
        # An older 1Cat release is served; its owner still learns of the current one.
        newer = family.by_touchpoints and not family.later_releases
        notes = (f"the current 1Cat release: {CURRENT_1CAT}",) if newer else ()
        detail = f"{label}: supported ({family.name} family)"
        rows.append(Check("vllm", Status.OK, detail, notes=notes))
    rows.append(_check_vllm_code(label, dirs, gpus))
    return rows


def _check_vllm_code(label: str, dirs: list[Path], gpus: GpuProbe) -> Check:
    libraries = library_archs(dirs)
    if not libraries:
        return Check(
            "vllm kernels",
            _serving_severity(gpus),
            f"{label}: CPU build: no CUDA code, serves no GPU",
            fix=VLLM_FIX,
        )
    notes = []
    volta = []
    for library, archs in libraries.items():
        relative = library.name
        for root in dirs:
            if library.is_relative_to(root):
                relative = str(library.relative_to(root))
        if isinstance(archs, str):
            notes.append(f"{relative}: {archs}")
            continue
        notes.append(f"{relative}: {archs.describe()}")
        if archs.runs_on(70):
            volta.append(relative)
    if volta:
        detail = f"{label}: sm_70 code in {len(volta)} of {len(libraries)} CUDA extensions"
        return Check("vllm kernels", Status.OK, detail, notes=tuple(notes))
    count = len(libraries)
    detail = f"{label}: none of {count} CUDA extensions carries sm_70 SASS or compute_70 PTX"
    return Check("vllm kernels", Status.PROBLEM, detail, fix=VLLM_FIX, notes=tuple(notes))


# -- Triton ---------------------------------------------------------------------------------


def triton_ptxas() -> tuple[Path | None, str]:
    """The ``ptxas`` Triton uses for sm_70 and why: ``TRITON_PTXAS_PATH``, else its own.

    Triton (``triton/knobs.py``, ``nvidia.ptxas``) honours ``TRITON_PTXAS_PATH`` and otherwise
    runs the ``ptxas`` bundled in ``triton/backends/nvidia/bin``; found without importing it.
    """
    override = os.environ.get(PTXAS_ENV)
    if override:
        return Path(override), f"{PTXAS_ENV}={override}"
    for root in package_dirs("triton"):
        bundled = root / "backends" / "nvidia" / "bin" / "ptxas"
        if bundled.exists():
            return bundled, "bundled with Triton"
    return None, "no ptxas bundled with Triton"


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def ptxas_release(ptxas: Path) -> str:
    """``ptxas --version``'s CUDA release (``"12.8"``), or its last line."""
    out = _run([str(ptxas), "--version"], timeout=30).stdout
    match = re.search(r"release (\d+\.\d+)", out)
    if match:
        return match.group(1)
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def ptxas_assembles_sm70(ptxas: Path) -> tuple[bool, str]:
    """Assemble :data:`PROBE_PTX` for ``sm_70``: whether it worked, and ptxas's first error."""
    with tempfile.TemporaryDirectory(prefix="vllm-volta-doctor-") as tmp:
        source, cubin = Path(tmp) / "probe.ptx", Path(tmp) / "probe.cubin"
        source.write_text(PROBE_PTX)
        done = _run([str(ptxas), "-arch=sm_70", str(source), "-o", str(cubin)])
        if done.returncode == 0 and cubin.exists():
            return True, ""
        lines = (done.stderr or done.stdout).strip().splitlines()
        return False, lines[0] if lines else f"exit code {done.returncode}"


def check_triton(gpus: GpuProbe) -> Check:
    """Triton's version, and whether the ``ptxas`` it would use can target sm_70."""
    if not package_dirs("triton"):
        return Check(
            "triton",
            _serving_severity(gpus),
            "not installed (vLLM and the Volta kernels need it on a GPU)",
            fix="pip install triton (vLLM pins the version it needs)",
        )
    try:
        version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        version = "unknown version"
    ptxas, origin = triton_ptxas()
    from_env = origin.startswith(PTXAS_ENV)
    env_fix = f"unset {PTXAS_ENV}, or point it at a CUDA 12.x ptxas"
    fix = env_fix if from_env else f"set {PTXAS_ENV} to a CUDA 12.x ptxas, or reinstall triton"
    if ptxas is None or not ptxas.is_file():
        return Check("triton", Status.PROBLEM, f"{version}: ptxas not found ({origin})", fix=fix)
    release = ptxas_release(ptxas)
    works, error = ptxas_assembles_sm70(ptxas)
    head = f"{version}, ptxas {ptxas} (CUDA {release}, {origin})"
    if works:
        return Check("triton", Status.OK, f"{head}: assembles sm_70")
    why = "CUDA 13 dropped Volta" if _release(release) >= (13, 0) else error
    return Check("triton", Status.PROBLEM, f"{head}: cannot target sm_70 ({why})", fix=fix)


def check_nvrtc() -> Check:
    """Whether a CUDA 12 NVRTC is here to build the plugins' CUDA-source kernels for sm_70
    (Volta's tensor cores); without one their Triton kernels serve, so it is never a problem."""
    version, why = nvrtc_found()
    if version is None:
        return Check(
            "nvrtc",
            Status.INFO,
            f"no CUDA 12 NVRTC: the tensor-core kernels fall back to Triton on sm_70 ({why})",
            fix=INSTALL_HINT,
        )
    return Check("nvrtc", Status.OK, f"CUDA NVRTC {version}: builds the tensor-core kernels")


# -- plugins and the model ------------------------------------------------------------------


def check_plugins(manager: VoltaPluginManager) -> list[Check]:
    """One row per discovered Volta plugin; a failed or refused one is a problem."""
    records = sorted(manager.records.values(), key=lambda r: r.name)
    if not records:
        return [
            Check(
                "plugins",
                Status.PROBLEM,
                "no vllm-volta plugins installed: vLLM runs unchanged on a V100",
                fix="pip install vllm-volta (the host and every plugin)",
            )
        ]
    rows = []
    for record in records:
        label = f"{record.distribution} {record.version}".strip() or "unknown distribution"
        name = f"plugin {record.name}"
        detail = f"{label}: {record.status.value}"
        if record.status is PluginStatus.LOADED:
            rows.append(Check(name, Status.OK, detail))
        elif record.status is PluginStatus.SKIPPED:
            rows.append(Check(name, Status.INFO, f"{detail} (not in VLLM_VOLTA_PLUGINS)"))
        else:
            dist = record.distribution or record.name
            if record.status is PluginStatus.REFUSED:
                fix = (
                    f"install a {dist} written for host API {HOST_API_VERSION} "
                    f"(pip install -U {dist} vllm-volta-core), or pip uninstall {dist}"
                )
            else:
                fix = f"pip install --force-reinstall {dist}, or pip uninstall {dist}"
            rows.append(Check(name, Status.PROBLEM, f"{detail}: {record.error}", fix=fix))
    return rows


@dataclass(frozen=True)
class ModelTarget:
    """A model named on the command line (as typed) and its description."""

    target: str
    description: ModelDescription


def load_model(target: str) -> ModelTarget:
    """Read a model directory, ``config.json`` or bundled example, as ``vllm-volta plan`` does.

    Raises :class:`~volta_core.errors.UsageError` for bad input, before any check runs.
    """
    from volta_core.planner.model import describe_model, read_config

    name, raw = read_config(target)
    return ModelTarget(target, describe_model(name, raw))


def family_problems(model: ModelDescription) -> list[tuple[str, str]]:
    """What the installed vLLM family itself refuses of this model on SM70, with the fix: the
    limits no Volta plugin routes around (``families.Family``). The formats it refuses where no
    plugin claims the layers are the plan's problems
    (:func:`volta_core.host.engine_quant.engine_refusal`)."""
    from volta_core.vllm import families

    family = families.family_of(families.installed_vllm())
    if family is None:
        return []
    found = []
    head_sizes = {layer.head_size for layer in model.layers if layer.is_attention}
    if not family.per_layer_configs and len(head_sizes) > 1:
        release = _installed_version("transformers")
        if release is not None and _release(release) >= (5, 14):
            found.append(
                (
                    f"{family.name} reads head_dim/global_head_dim from the model config, which "
                    f"transformers {release} refuses for a model whose layers differ "
                    f"(head sizes {sorted(head_sizes)})",
                    "pip install 'transformers<5.14'",
                )
            )
    return found


def _installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_model(model: ModelTarget, manager: VoltaPluginManager) -> list[Check]:
    """The first problems of ``vllm-volta plan`` for the model on sm_70, default settings, and
    what the installed vLLM family refuses of it (:func:`family_problems`)."""
    from volta_core.device import parse_device
    from volta_core.planner.linear_attention import SM70_VERDICT
    from volta_core.planner.plan import PlanOptions, make_plan
    from volta_core.vllm.families import installed_family_name

    options = PlanOptions(device=parse_device("sm70"), engine_family=installed_family_name())
    plan = make_plan(model.description, options, manager)
    name = f"plan {model.target}"
    family_rows = [
        Check(name, Status.PROBLEM, problem, fix=fix)
        for problem, fix in family_problems(model.description)
    ]
    linear = sum(layer.layer_type == "linear_attention" for layer in model.description.layers)
    gdn = [Check(name, Status.INFO, f"{linear} Gated DeltaNet layers: {SM70_VERDICT}")]
    return family_rows + check_plan_problems(name, plan, model.target) + (gdn if linear else [])


def check_plan_problems(name: str, plan: Any, target: str) -> list[Check]:
    """The plan's first problems as checks (ok when there are none)."""
    if not plan.problems:
        return [Check(name, Status.OK, "sm_70, default settings: no problems")]
    fix = f"the whole plan: vllm-volta plan {target}"
    rows = [Check(name, Status.PROBLEM, p, fix=fix) for p in plan.problems[:MAX_PLAN_PROBLEMS]]
    if len(plan.problems) > MAX_PLAN_PROBLEMS:
        more = len(plan.problems) - MAX_PLAN_PROBLEMS
        rows.append(Check(name, Status.INFO, f"{more} more problem(s) in the plan"))
    return rows


# -- the whole report -----------------------------------------------------------------------


def _guarded(name: str, check: Callable[[], Check | list[Check]]) -> list[Check]:
    try:
        result = check()
    except ModuleNotFoundError as exc:  # a dependency is missing: name it
        return [
            Check(
                name,
                Status.PROBLEM,
                f"the check needs a module that is not installed: {exc}",
                fix=f"pip install --force-reinstall vllm-volta-core (it brings {exc.name})",
            )
        ]
    except Exception as exc:  # one broken check must not hide the others
        return [
            Check(
                name,
                Status.PROBLEM,
                f"the check itself failed: {type(exc).__name__}: {exc}",
                fix="report this line at the vllm-volta issue tracker",
            )
        ]
    return [result] if isinstance(result, Check) else list(result)


def run_checks(
    manager_fn: Callable[[], VoltaPluginManager],
    model: ModelTarget | None = None,
    gpu_probe: Callable[[], GpuProbe] = probe_gpus,
    topology_probe: Callable[[], Any] | None = None,
    *,
    tensor_parallel_size: int | None = None,
    fit: FitOptions | None = None,
) -> Report:
    """Every check, in the order a reader follows: hardware (the GPUs, then how they connect:
    :mod:`volta_core.doctor.topology`, whose probe ``topology_probe`` replaces), torch, vLLM,
    Triton, plugins. ``tensor_parallel_size`` (None: every visible GPU) and ``fit``'s
    ``--gpu-memory-utilization`` are the plan's settings the topology rows judge."""
    from volta_core.doctor import topology

    report = Report()
    probes: list[GpuProbe] = []

    def gpus() -> list[Check]:
        probes.append(gpu_probe())
        return check_gpus(probes[0])

    def connected() -> list[Check]:
        found = (topology_probe or topology.probe_topology)()
        return topology.check_topology(
            found, topology.torch_cuda(), fit=fit, tensor_parallel_size=tensor_parallel_size
        )

    report.checks += _guarded("gpus", gpus)
    report.checks += _guarded("topology", connected)
    probe = probes[0] if probes else GpuProbe(None, reason="NVML probe failed")
    report.checks += _guarded("torch", lambda: check_torch(probe))
    report.checks += _guarded("vllm", lambda: check_vllm(probe))
    report.checks += _guarded("triton", lambda: check_triton(probe))
    report.checks += _guarded("nvrtc", check_nvrtc)
    report.checks += _guarded("plugins", lambda: check_plugins(manager_fn()))
    if model is not None:
        report.checks += _guarded(f"plan {model.target}", lambda: check_model(model, manager_fn()))
    return report
