"""Load a family's staged FLA op files without vLLM, as on a V100, with the sm_70 configurations.

The staged modules (``fla_stage.py``) import a few vLLM names (four modules). vLLM is not
installed on the GPU machine, and importing it would pull its whole engine, so
:func:`install_vllm_standins` puts small stand-ins in ``sys.modules`` that answer as vLLM
does on a V100:

- ``vllm.triton_utils``: Triton itself (``triton``, ``tl``, ``tldevice``), as vLLM re-exports it
  when Triton is installed;
- ``vllm.platforms.current_platform``: a CUDA platform of capability 7.0 (not ROCm, not
  Blackwell: the only questions the ops ask);
- ``vllm.utils.gpu_sync_debug.gpu_sync_allowed``: a no-op context, what vLLM returns while
  its GPU-sync debugging is off (the default);
- ``vllm.utils.torch_utils.async_tensor_h2d``: the host-to-device copy it names.

The families read the device when their modules are imported (1Cat-vLLM's SM70 autotune
spaces, FLA's Hopper and shared-memory checks) and, in 1Cat-vLLM, per call (its recurrent
``BV`` follows the SM count): :func:`as_v100` answers those questions as a V100-SXM2 would
(capability 7.0, 80 SMs, 96 KB of shared memory per block) while the GPU it runs on computes.
:func:`force_configs` then leaves each autotuner only the configuration the sm_70 gate found
to build and fit (``docs/perf/gdn/<family>.json``: the cheapest that fits, so also the one
of 1Cat-vLLM's SM70 schedules), and :func:`recording_launches` records what each kernel
launch ran with. The kernels are compiled for the GPU at hand: its sm_70 configuration, not
its sm_70 code.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import json
import os
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: What a V100-SXM2 answers: capability, SMs, name, and the shared memory one block may use
#: (96 KB: CUDA C Programming Guide, "Compute Capabilities", table for 7.0).
V100_CAPABILITY = (7, 0)
V100_SMS = 80
V100_NAME = "Tesla V100-SXM2-32GB"
V100_SHARED_BYTES = 96 * 1024


class V100Platform:
    """The parts of vLLM's ``current_platform`` the ops ask about, answered for a V100."""

    def is_cuda(self) -> bool:
        return True

    def is_cuda_alike(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        return capability // 10 == V100_CAPABILITY[0]


def _async_tensor_h2d(
    data: Any,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """vLLM's ``async_tensor_h2d`` (vllm/utils/torch_utils.py) without its pinned staging."""
    t = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=dtype)
    if out is not None:
        return out.copy_(t, non_blocking=True)
    return t.to(device=device, dtype=dtype, non_blocking=True)


def install_vllm_standins() -> None:
    """Put the vLLM stand-ins in ``sys.modules`` (see the module docstring)."""
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice

    def module(name: str, package: bool = False, **attrs: Any) -> None:
        mod = types.ModuleType(name)
        if package:
            mod.__path__ = []
        for key, value in attrs.items():
            setattr(mod, key, value)
        sys.modules[name] = mod

    module("vllm", package=True)
    module("vllm.triton_utils", triton=triton, tl=tl, tldevice=tldevice, HAS_TRITON=True)
    module("vllm.platforms", package=True, current_platform=V100Platform())
    module("vllm.utils", package=True)
    module(
        "vllm.utils.gpu_sync_debug",
        gpu_sync_allowed=lambda first_only=False: contextlib.nullcontext(),
    )
    module("vllm.utils.torch_utils", async_tensor_h2d=_async_tensor_h2d)


class _V100Properties:
    """The device's properties with a V100's SM count and name."""

    def __init__(self, real: Any) -> None:
        self._real = real

    multi_processor_count = V100_SMS
    name = V100_NAME
    major, minor = V100_CAPABILITY

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def as_v100() -> Iterator[None]:
    """While open, torch answers the device questions as a V100 does.

    On a GPU, Triton's driver compiles for what its ``get_device_capability`` answers
    (triton/backends/driver.py, ``GPUDriver.__init__`` keeps torch's, which reads the device
    properties answered here): it is pinned to the real GPU's capability, read before any
    answer changes (:func:`compile_target` checks it, inside this context). On a machine
    without a GPU (the Triton interpreter), torch also says CUDA is available on device 0, so
    the families' "is this an sm_70 device" checks see one, while Triton's CUDA driver, which
    would believe torch and look for libcuda, stays inactive.
    """
    import triton
    from triton.backends.nvidia.driver import CudaDriver

    on_gpu = torch.cuda.is_available()
    if on_gpu:
        # The driver keeps torch's get_device_capability, which reads the (patched) device
        # properties: it is given the real GPU's answer, read now, instead.
        real = torch.cuda.get_device_capability()
        triton.runtime.driver.active.get_device_capability = lambda device=None: real
    is_active = vars(CudaDriver)["is_active"]
    real_props = torch.cuda.get_device_properties
    patches: dict[str, Any] = {
        "get_device_capability": lambda device=None: V100_CAPABILITY,
        "get_device_name": lambda device=None: V100_NAME,
        "get_device_properties": (
            (lambda device=None: _V100Properties(real_props(device)))
            if on_gpu
            else (lambda device=None: _V100Properties(None))
        ),
    }
    if not on_gpu:
        patches |= {"is_available": lambda: True, "device_count": lambda: 1}
    saved = {name: getattr(torch.cuda, name) for name in patches}
    current_index = torch.accelerator.current_device_index
    try:
        for name, fn in patches.items():
            setattr(torch.cuda, name, fn)
        if not on_gpu:
            torch.accelerator.current_device_index = lambda: 0  # type: ignore[assignment]
            CudaDriver.is_active = staticmethod(lambda: False)  # type: ignore[method-assign]
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)
        torch.accelerator.current_device_index = current_index  # type: ignore[assignment]
        CudaDriver.is_active = is_active


def compile_target(capability: tuple[int, int]) -> str:
    """What Triton compiles for (``cuda:90`` on an H100/H200), or a RuntimeError if that is
    not the GPU's own ``capability`` (read before :func:`as_v100`)."""
    import triton

    target = triton.runtime.driver.active.get_current_target()
    if target.arch != 10 * capability[0] + capability[1]:
        raise RuntimeError(
            f"Triton compiles for {target.backend}:{target.arch}, not this GPU's "
            f"{capability[0]}.{capability[1]}: its driver took the V100 answers"
        )
    return f"{target.backend}:{target.arch}"


@dataclass
class Family:
    """One family's ops, loaded from its staged folder."""

    name: str
    folder: Path
    manifest: dict[str, Any]
    modules: dict[str, types.ModuleType]

    def op(self, module: str, name: str) -> Any:
        return getattr(self.modules[module], name)


def load(folder: Path, name: str, on_gpu: bool) -> Family:
    """Import ``folder``'s modules as package ``gdn_fla_<name>``; call under :func:`as_v100`
    (``on_gpu``: whether the tensors will be on a GPU, asked before, as it then says yes).

    ``utils`` is imported first and told a V100's shared memory before the modules that size
    their autotune spaces by it at import (``check_shared_mem``) are.
    """
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"{folder} is not staged; run: python tests/gdn_sm70/fla_stage.py {name}"
        )
    install_vllm_standins()
    package = "gdn_fla_" + re.sub(r"\W", "_", name)
    spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[package] = pkg
    utils = importlib.import_module(f"{package}.utils")
    utils.get_all_max_shared_mem = lambda: [V100_SHARED_BYTES]
    utils.check_shared_mem.cache_clear()
    modules = {"utils": utils}
    for mod in ("chunk", "fused_recurrent", "fused_sigmoid_gating"):
        modules[mod] = importlib.import_module(f"{package}.{mod}")
    for key, mod in list(sys.modules.items()):
        if key.startswith(package + ".") and mod is not None:
            modules.setdefault(key.rsplit(".", 1)[1], mod)
    if os.environ.get("TRITON_INTERPRET") == "1":
        for mod in modules.values():
            _interpreter_shims(mod)
    if not on_gpu:
        # 1Cat-vLLM asks whether the tensors' device is an sm_70 one, and answers no for a CPU
        # tensor before it reads the capability: without a GPU the tensors stand for cuda:0's.
        for mod in modules.values():
            if hasattr(mod, "_is_sm70_device"):
                mod._is_sm70_device = lambda device: (
                    torch.cuda.get_device_capability() == V100_CAPABILITY
                )
    return Family(name, folder, json.loads(manifest_path.read_text()), modules)


class _LoopIndex(int):
    """A loop index that, like a compiled kernel's, converts with ``.to(dtype)``."""

    def to(self, dtype: Any, **kwargs: Any) -> int:
        return int(self)


def _range(*args: int) -> Iterator[int]:
    return map(_LoopIndex, range(*args))


def _interpreter_shims(module: types.ModuleType) -> None:
    """Under ``TRITON_INTERPRET=1`` only, two gaps of Triton 3.6's interpreter that the
    compiler does not have, so a GPU run never takes this path:

    - a Triton builtin the module holds under its own name (FLA's ``op.py``: ``exp = tl.exp``,
      then ``from .op import exp``) is looked up in ``triton.language`` at each call: the
      interpreter swaps its implementations into ``triton.language`` while a kernel runs and
      never sees such aliases;
    - ``for i_t in range(NT)`` gives a plain int, which has no ``.to(tl.int64)`` (1Cat-vLLM's and
      0.33's ``chunk_delta_h``): the module's ``range`` yields ints that have one.
    """
    import triton.language as tl

    module.range = _range  # type: ignore[attr-defined]
    for name, value in list(vars(module).items()):
        if not tl.core.is_builtin(value):
            continue
        for owner in (tl, tl.math):
            attr = next((k for k, v in vars(owner).items() if v is value), None)
            if attr is not None:
                setattr(module, name, _late(owner, attr))
                break


def _late(owner: types.ModuleType, attr: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(owner, attr)(*args, **kwargs)

    return call


# -- the sm_70 configurations -------------------------------------------------------------------


def _innermost(obj: Any) -> Any:
    """The JIT (or, under ``TRITON_INTERPRET=1``, interpreted) function under any autotuner
    and heuristics."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    while isinstance(obj, (Autotuner, Heuristics)):
        obj = obj.fn
    return obj


def kernels(family: Family) -> dict[str, Any]:
    """Every Triton kernel the family's modules define (its outermost wrapper), by name."""
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import KernelInterface

    out: dict[str, Any] = {}
    for mod in family.modules.values():
        for value in vars(mod).values():
            if isinstance(value, (Autotuner, Heuristics, KernelInterface)):
                out.setdefault(_innermost(value).__name__, value)
    return out


def autotuner_of(kernel: Any) -> Any:
    """The kernel's Autotuner (under any heuristics), or None."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    obj = kernel
    while isinstance(obj, (Autotuner, Heuristics)):
        if isinstance(obj, Autotuner):
            return obj
        obj = obj.fn
    return None


_DESCRIPTION = re.compile(r"^(?P<name>\w+)\[(?P<items>.*)\]$")


def parse_description(text: str) -> tuple[str, dict[str, int]]:
    """``name[BT=64, BV=16, warps=8, stages=1]`` (the gate's description) as name and values."""
    match = _DESCRIPTION.match(text)
    if match is None:
        raise ValueError(f"not a configuration description: {text!r}")
    values = {}
    for item in match["items"].split(","):
        key, _, value = item.strip().partition("=")
        values[key] = int(value)
    return match["name"], values


def gate_configs(report: Path) -> dict[str, dict[str, int]]:
    """The configuration the sm_70 gate found to build and fit, per kernel, from its report."""
    data = json.loads(report.read_text())
    out: dict[str, dict[str, int]] = {}
    for kernel in data["kernels"]:
        if kernel["fits"] and kernel["config"]:
            name, values = parse_description(kernel["config"])
            out.setdefault(name, values)
    return out


def _matches(config: Any, values: dict[str, int]) -> bool:
    return (
        config.num_warps == values["warps"]
        and config.num_stages == values["stages"]
        and all(values.get(k) == v for k, v in config.kwargs.items())
    )


@dataclass
class Forced:
    """What :func:`force_configs` did: kernel -> the configuration left, and the autotuned
    kernels it could not force (no gate entry, or no configuration matching it)."""

    forced: dict[str, str] = field(default_factory=dict)
    not_forced: dict[str, str] = field(default_factory=dict)


def force_configs(family: Family, report: Path) -> Forced:
    """Leave each autotuned kernel only the configuration the gate's ``report`` names for it."""
    wanted = gate_configs(report)
    result = Forced()
    for name, kernel in sorted(kernels(family).items()):
        tuner = autotuner_of(kernel)
        if tuner is None:
            continue
        values = wanted.get(name)
        if values is None:
            result.not_forced[name] = f"{len(tuner.configs)} configurations, none gated"
            continue
        keep = [c for c in tuner.configs if _matches(c, values)]
        if not keep:
            result.not_forced[name] = f"no configuration matches {values}"
            continue
        tuner.configs = keep[:1]
        result.forced[name] = describe(name, keep[0].kwargs, keep[0].num_warps, keep[0].num_stages)
    return result


def describe(name: str, constexprs: dict[str, Any], warps: int, stages: int) -> str:
    """The gate's description of a build: tile constexprs, warps, stages."""
    tiles = [
        f"{k}={v}"
        for k, v in constexprs.items()
        if k.startswith("B") and isinstance(v, int) and not isinstance(v, bool)
    ]
    return f"{name}[{', '.join([*tiles, f'warps={warps}', f'stages={stages}'])}]"


@contextlib.contextmanager
def recording_launches(family: Family) -> Iterator[list[str]]:
    """While open, each launch of the family's kernels appends its description (tile
    constexprs, warps, stages: Triton's defaults 4 and 3 where the launch sets none)."""
    log: list[str] = []
    wrapped: list[tuple[Any, Any]] = []
    for kernel in kernels(family).values():
        inner = _innermost(kernel)
        run = inner.run

        def record(*args: Any, _run: Any = run, _inner: Any = inner, **kwargs: Any) -> Any:
            named = dict(zip(_inner.arg_names, args, strict=False)) | kwargs
            log.append(
                describe(
                    _inner.__name__,
                    named,
                    int(kwargs.get("num_warps") or 4),
                    int(kwargs.get("num_stages") or 3),
                )
            )
            return _run(*args, **kwargs)

        inner.run = record
        wrapped.append((inner, run))
    try:
        yield log
    finally:
        for inner, run in wrapped:
            inner.run = run
