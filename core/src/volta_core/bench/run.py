"""Measuring on GPU 0: the ceilings, then every planned call, in CUDA graphs.

Safe on a serving box: it refuses to start where GPU 0 has less free memory than the run
needs (:data:`FREE_BYTES_NEEDED`), allocates only through torch (never another process's
memory), skips a call whose input sets would not fit in what is free (the report says so),
and a call that fails is one note in the report, not the end of the run. ``--quick`` times
fewer points with fewer graph replays, and starts no call once its time budget
(:data:`QUICK_SETTINGS`' ``budget_s``) is spent: those calls are reported as not measured, with
that reason.

Nothing in the report names the user's folders: a model given as a directory or a config file
is named by its config's ``_name_or_path`` or its folder's name (:func:`public_name`), and the
home directory in an error's text is written ``~``.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TextIO

from volta_core.bench.cases import FULL, QUICK, Planned, plan_cases, unmeasured_paths
from volta_core.bench.machine import describe_device, describe_software
from volta_core.bench.report import Ceilings, Measured, assemble
from volta_core.device import Device
from volta_core.errors import UsageError
from volta_core.host.manager import VoltaPluginManager
from volta_core.kernel_api import (
    L2_MULTIPLE,
    Timing,
    l2_bytes,
    measure_copy_bandwidth,
    measure_matmul,
    measure_read_bandwidth,
    rotation_count,
    time_cuda,
    time_cuda_graph,
)
from volta_core.planner.calibration import calibrations
from volta_core.planner.model import describe_model, read_config
from volta_core.planner.plan import PlanOptions, make_plan
from volta_core.vllm.families import installed_family_name

#: The models timed without a MODEL argument: the W4A16 Qwen3.5 (ct_wna16's linear kernels,
#: the Volta attention at head size 256) and, in a full run, Gemma-4 (head sizes 256 and
#: 512, sliding windows).
DEFAULT_MODELS = ("qwen3.5-27b-w4a16",)
DEFAULT_MODELS_FULL = ("qwen3.5-27b-w4a16", "gemma-4-dual-head")

#: Free memory GPU 0 must have at the start: the 1 GiB copy's two buffers, the matmuls' and
#: room for the calls' input sets.
FREE_BYTES_NEEDED = 4 << 30
#: The share of the memory free at the start a call's input sets may take.
INPUT_SHARE = 0.5


@dataclass(frozen=True)
class Settings:
    """How long each figure is timed: graph replays, the ceilings' sizes, and the seconds
    from the start after which no call is started (None: every call runs)."""

    replays: int
    copy_bytes: int
    matmul_n: int
    budget_s: float | None


#: ``--quick``: no call starts after 50 s, so that with the call then running and the report
#: the run ends within about a minute (a first run that compiles the kernels reports the
#: calls it had no time for as not measured; run it again, or ``vllm-volta warmup`` first).
QUICK_SETTINGS = Settings(replays=5, copy_bytes=1 << 29, matmul_n=4096, budget_s=50.0)
FULL_SETTINGS = Settings(replays=15, copy_bytes=1 << 30, matmul_n=8192, budget_s=None)


def require_gpu() -> Any:
    """torch with a CUDA GPU, else :class:`UsageError` (one line: exit code 2)."""
    try:
        import torch
    except ImportError as exc:
        raise UsageError(
            "bench needs a CUDA GPU and torch with CUDA; torch is not installed"
        ) from exc
    if not torch.cuda.is_available():
        raise UsageError(
            f"bench needs a CUDA GPU; torch {torch.__version__} sees none (nothing was measured)"
        )
    free, _ = torch.cuda.mem_get_info(0)
    if free < FREE_BYTES_NEEDED:
        raise UsageError(
            f"bench needs {FREE_BYTES_NEEDED / 2**30:.1f} GiB free on GPU 0, which has "
            f"{free / 2**30:.2f} GiB free: stop what holds it, or run on an idle GPU"
        )
    return torch


def release_cuda() -> None:
    """Wait for the GPU and give the freed input sets' memory back to the device."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def time_planned(
    planned: Planned,
    budget: int,
    replays: int,
    l2: int,
    graph_timer: Callable[..., Timing] = time_cuda_graph,
    eager_timer: Callable[..., Timing] = time_cuda,
    release: Callable[[], None] = release_cuda,
) -> Measured:
    """Time one call in a CUDA graph (eagerly where capture fails, said in ``timed_in``),
    with enough input sets to exceed ``L2_MULTIPLE`` times the ``l2`` bytes of L2 cache that
    fit in ``budget`` bytes (one set where one alone exceeds it)."""
    if planned.make_call is None:
        return Measured(planned)
    inputs: list[tuple[Any, ...]] = []
    try:
        call = planned.make_call()
        size = max(1, call.bytes_per_set)
        sets = 1 if size >= L2_MULTIPLE * l2 else rotation_count(size, l2=l2)
        sets = min(sets, budget // size)
        if sets < 1:
            return Measured(
                planned,
                error=f"not run: one input set needs {size / 2**30:.2f} GiB, "
                f"{budget / 2**30:.2f} GiB may be used",
            )
        inputs = [tuple(call.make_inputs()) for _ in range(sets)]
        try:
            timing = graph_timer(call.run, inputs, replays=replays)
            timed_in = "CUDA graph"
        except RuntimeError as exc:
            timing = eager_timer(call.run, inputs)
            timed_in = f"eagerly (graph capture failed: {_line(exc)})"
        return Measured(planned, timing, timed_in)
    except Exception as exc:  # a kernel that fails is a finding of the report, not its end
        return Measured(planned, error=f"failed: {type(exc).__name__}: {_line(exc)}")
    finally:
        del inputs
        release()


def _line(exc: BaseException) -> str:
    """An error's text on one line, at most 200 characters, the home directory as ``~``."""
    return " ".join(str(exc).replace(str(Path.home()), "~").split())[:200]


def public_name(target: str, name: str, raw: Mapping[str, Any]) -> str:
    """What the report calls the model ``target`` that :func:`read_config` read as ``name``
    and ``raw``: a bundled example by its name (``name`` is then ``example TARGET``); a
    directory or a config file (``name`` is its path) by the last part of its config's
    ``_name_or_path``, else by the directory's name (a ``config.json``'s folder's, another
    file's own stem): never by a path, which would name the user's folders."""
    if name != target:
        return target
    named = raw.get("_name_or_path")
    if isinstance(named, str) and PurePosixPath(named.rstrip("/")).name:
        return PurePosixPath(named.rstrip("/")).name
    path = Path(target).resolve()
    if path.is_dir():
        return path.name
    return path.parent.name if path.name == "config.json" else path.stem


def _progress(stream: TextIO, done: int, total: int, label: str) -> None:
    """A one-line progress bar on a terminal; nothing when ``stream`` is not one."""
    if not stream.isatty():
        return
    width = 30
    filled = width * done // max(1, total)
    end = "\n" if done == total else ""
    stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label[:60]:<60}{end}")
    stream.flush()


def load_plugins(modules: Sequence[str]) -> VoltaPluginManager:
    """A manager holding the plugin modules named by import path (``volta_attn_v100.plugin``),
    registered as their entry points would be, each under its package's name without
    ``volta_``: for a source checkout on ``PYTHONPATH``, where no entry point is installed."""
    manager = VoltaPluginManager()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise UsageError(f"--plugin {name}: cannot be imported: {exc}") from exc
        package = name.partition(".")[0]
        version = str(getattr(sys.modules[package], "__version__", ""))
        manager.register(
            module, package.removeprefix("volta_"), distribution=package, version=version
        )
    return manager


def run_bench(
    models: Sequence[str],
    *,
    quick: bool,
    dtype: str,
    kv_cache_dtype: str,
    manager: VoltaPluginManager,
    progress: TextIO = sys.stderr,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Measure the ceilings and every call the plans of ``models`` (at activation ``dtype``
    and ``kv_cache_dtype``) name on GPU 0, starting none past the settings' budget by
    ``clock``'s seconds."""
    begin = clock()
    torch = require_gpu()
    settings = QUICK_SETTINGS if quick else FULL_SETTINGS
    points = QUICK if quick else FULL
    targets = list(models) or list(DEFAULT_MODELS if quick else DEFAULT_MODELS_FULL)
    device = Device(tuple(torch.cuda.get_device_capability(0)))
    family = installed_family_name()
    names: list[str] = []
    planned: list[Planned] = []
    unmeasured: list[dict[str, str]] = []
    for target in targets:
        name, raw = read_config(target)
        shown = public_name(target, name, raw)
        names.append(shown)
        plan = make_plan(
            describe_model(name, raw),
            PlanOptions(
                device=device, dtype=dtype, kv_cache_dtype=kv_cache_dtype, engine_family=family
            ),
            manager,
        )
        mine = plan_cases(manager, plan, shown, points)
        planned += mine
        unmeasured += unmeasured_paths(plan, mine, shown, points)
    total = len(planned) + 4
    _progress(progress, 0, total, "copy bandwidth")
    copy, _ = measure_copy_bandwidth(settings.copy_bytes)
    _progress(progress, 1, total, "read bandwidth")
    read, _ = measure_read_bandwidth(settings.copy_bytes)
    _progress(progress, 2, total, "fp16 cuBLAS")
    fp16, _ = measure_matmul(settings.matmul_n, "float16")
    _progress(progress, 3, total, "fp32 FMA")
    fp32, _ = measure_matmul(settings.matmul_n, "float32")
    torch.cuda.empty_cache()
    budget = int(torch.cuda.mem_get_info(0)[0] * INPUT_SHARE)
    l2 = l2_bytes()
    measured = []
    for i, p in enumerate(planned):
        _progress(progress, 4 + i, total, f"{p.family.value}: {p.module} {p.shape}")
        if settings.budget_s is not None and clock() - begin > settings.budget_s:
            spent = f"not run: --quick starts no call after {settings.budget_s:.0f} s"
            measured.append(Measured(p, error=spent))
        else:
            measured.append(time_planned(p, budget, settings.replays, l2))
    _progress(progress, total, total, "done")
    device_facts = describe_device()
    return assemble(
        models=names,
        quick=quick,
        device=device_facts,
        software=describe_software(manager),
        ceilings=Ceilings(copy, read, fp16, fp32),
        measured=measured,
        unmeasured=unmeasured,
        seconds=clock() - begin,
        calibrated=device_facts["name"] in calibrations(),
    )
