"""pytest plugin for kernel tests: the ``gpu`` marker, the Triton interpreter on CPU, checks.

Opt-in, never auto-loaded (it changes how a suite runs): a project loads it with
``-p volta_devkit.testing`` (each vllm-volta distribution's ``addopts`` does).

* The ``gpu`` marker: tests that need a CUDA device. Without one they are skipped with the
  reason; ``pytest -m gpu`` selects only them.
* With no CUDA device, ``TRITON_INTERPRET=1`` is set before any conftest or test module is
  imported (``@triton.jit`` reads it when a kernel is defined), so the same kernel tests run on
  CPU tensors in CI. An explicit ``TRITON_INTERPRET`` in the environment is left alone.
* :func:`poison_`, :func:`rel_error`, :func:`assert_rel_close`: fill outputs before a launch so
  unwritten elements show, and compare against a float64 reference.
* The ``kernel_device`` fixture: ``"cuda"`` with a GPU, ``"cpu"`` under the interpreter.
* Under pytest-xdist with ``--dist loadgroup``, a test that uses a module-, package- or
  session-scoped fixture joins its module's group, so what such a fixture builds (an engine, a
  server, a checkpoint) is built once, on one worker; every other test goes to whichever worker
  is free (compile-gate and interpreter cases are one core's work each). Without xdist the
  marks do nothing.

Loading this module is cheap: torch is imported only on a machine that shows an NVIDIA driver (to
ask whether CUDA really works there) and inside the helpers.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import torch

GPU_MARKER = "gpu"
INTERPRET_ENV = "TRITON_INTERPRET"
SHARED_SCOPES = {"module", "package", "session"}

#: The byte integer outputs are filled with by :func:`poison_` (0xA5: odd, neither 0 nor -1).
POISON_BYTE = 0xA5

_cuda: bool | None = None


def cuda_available() -> bool:
    """Whether a CUDA device can run kernels here; decided once per process.

    A machine with no sign of an NVIDIA driver answers without importing torch, so CPU-only runs
    (CI) stay fast; where the nodes exist, torch decides (and honours ``CUDA_VISIBLE_DEVICES``).
    """
    global _cuda
    if _cuda is None:
        _cuda = _probe_cuda()
    return _cuda


def _probe_cuda() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    if not _nvidia_driver_present():
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _nvidia_driver_present() -> bool:
    """Cheap signs of an NVIDIA driver: device nodes, the driver's proc entry, nvidia-smi."""
    return (
        any(Path("/dev").glob("nvidia[0-9]*"))
        or Path("/proc/driver/nvidia").exists()
        or shutil.which("nvidia-smi") is not None
    )


def _use_interpreter_without_cuda() -> None:
    if INTERPRET_ENV not in os.environ and not cuda_available():
        os.environ[INTERPRET_ENV] = "1"


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests() -> None:
    """Set the interpreter switch before the first conftest can import a kernel module."""
    _use_interpreter_without_cuda()


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker; set the interpreter switch if this plugin was loaded late."""
    config.addinivalue_line(
        "markers",
        f"{GPU_MARKER}: needs a CUDA device (skipped without one; select with -m {GPU_MARKER})",
    )
    config.addinivalue_line("markers", "xdist_group(name): run on one pytest-xdist worker")
    _use_interpreter_without_cuda()


def pytest_report_header() -> str:
    if cuda_available():
        return "volta kernels: CUDA device found, gpu tests run"
    return (
        f"volta kernels: no CUDA device, gpu tests skipped, "
        f"{INTERPRET_ENV}={os.environ.get(INTERPRET_ENV, '')}"
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the marks into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none here (kernels ran interpreted)")
    for item in items:
        if item.get_closest_marker(GPU_MARKER) is not None:
            item.add_marker(skip)


def _shares_a_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definition.scope in SHARED_SCOPES
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )


@pytest.fixture
def kernel_device() -> str:
    """The torch device kernel tests launch on: ``"cuda"``, or ``"cpu"`` under the interpreter."""
    return "cuda" if cuda_available() else "cpu"


# -- checks -------------------------------------------------------------------------------


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` in place with values no kernel should leave: NaN, or the byte ``0xA5``.

    Floating tensors get NaN (fp8 included, through their byte pattern 0xFF, which is NaN in
    both e4m3fn and e5m2); integer and bool tensors get every byte set to :data:`POISON_BYTE`.
    Returns ``t``.
    """
    import torch

    if t.dtype.is_floating_point and t.element_size() > 1:
        return t.fill_(math.nan)
    byte = 0xFF if t.dtype.is_floating_point else POISON_BYTE
    pattern = torch.full((t.element_size(),), byte, dtype=torch.uint8).view(t.dtype)
    t.copy_(pattern.expand(t.shape) if t.dim() else pattern[0])
    return t


def _as_float64(t: Any) -> torch.Tensor:
    import torch

    t = torch.as_tensor(t)
    return t.detach().to(device="cpu").to(torch.float64)


def rel_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in float64 on the CPU; ``inf`` if ``out`` has NaN or Inf.

    A zero reference gives 0.0 for an exact zero output and ``inf`` otherwise. Shapes must
    match; the reference must be finite.
    """
    import torch

    o, r = _as_float64(out), _as_float64(ref)
    if o.shape != r.shape:
        raise ValueError(f"output shape {tuple(o.shape)} != reference shape {tuple(r.shape)}")
    if not bool(torch.isfinite(r).all()):
        raise ValueError("the reference has NaN or Inf values: compare finite references only")
    if not bool(torch.isfinite(o).all()):
        return math.inf
    diff = float(torch.linalg.vector_norm(o - r))
    norm = float(torch.linalg.vector_norm(r))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def assert_rel_close(out: Any, ref: Any, tol: float, what: str) -> None:
    """Fail unless every element of ``out`` is finite and ``rel_error(out, ref) <= tol``.

    The message names ``what``, the number of non-finite (unwritten, poisoned) elements and the
    first of them, or the error and the element farthest from the reference.
    """
    import torch

    o, r = _as_float64(out), _as_float64(ref)
    if o.shape != r.shape:
        raise AssertionError(
            f"{what}: output shape {tuple(o.shape)} != reference shape {tuple(r.shape)}"
        )
    bad = ~torch.isfinite(o)
    if bool(bad.any()):
        first = _index(bad.flatten().nonzero()[0].item(), o.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {o.numel()} elements are NaN/Inf (unwritten or "
            f"poisoned), first at index {first}; expected {r[first].item():.6g} there"
        )
    err = rel_error(o, r)
    if not err <= tol:
        worst = _index(int((o - r).abs().flatten().argmax()), o.shape)
        raise AssertionError(
            f"{what}: relative error {err:.3e} > tolerance {tol:.1e}; worst element at index "
            f"{worst}: got {o[worst].item():.6g}, expected {r[worst].item():.6g}"
        )


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return tuple(reversed(index))
