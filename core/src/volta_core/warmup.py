"""``vllm-volta warmup``: compile, before ``vllm serve``, the kernels a plan's plugins launch.

The plan names the plugins that serve the model's layers on the device (an attention backend,
a quant method, the KV-cache writer). Each such plugin declares every build it launches on the
device (``volta_kernel_configs``, ``volta_cuda_kernel_configs``: what the SM70 compile gate
compiles); warmup compiles each of them into the caches the engine reads (Triton's cache
directory, the NVRTC cubin cache) through :mod:`volta_core.kernel_api._warm`, which needs no GPU,
so a cache for ``sm_70`` can be built on any Linux machine with the serving stack's Triton.
Every Triton build with ``divisible_by_16`` arguments is compiled twice, as the JIT builds it
for model-sized and for other sizes (:func:`~volta_core.kernel_api._warm.triton_variants`).
Each build is looked up in the caches first, without compiling; only the missing ones are
compiled, in a pool of processes when they are many. The Triton lookup uses Triton's private
functions (:meth:`~volta_core.kernel_api._warm.TritonTarget.cached`), which a Triton release can
change: a lookup that raises leaves its build "not known cached", so it goes to the compiler
(which finds a cached build itself), and the report counts such lookups per error, since the
only other symptom is a second run that takes minutes instead of seconds.

The hooks declare builds per plugin and device, not per layer shape, so a plugin's builds for
other shapes (head sizes, MoE experts) are compiled too: a superset of what the model launches.
A launch finds a build only if the declaration names its integer arguments' specialization as
the JIT makes it from their values (1 a constant, a multiple of 16 divisible, else plain:
``triton/runtime/jit.py`` ``create_function_from_signature``): fp8kv's cache write declares
one build per token-count and scale-stride class its launches use (``WRITE_LAUNCHES``), and
attn_v100's decode an unsplit twin of each build (``SPLIT``, where one partition compiles
without the combine); where the classes compile to the same code, or differ by a division a
program makes once, the kernel does not specialize the argument (Triton's
``do_not_specialize``: token, pair and expert counts of ct_wna16's and fp8w's linear and MoE
kernels, attention's head-group numbers, window and block-table width, fp8kv's gather's
strides). The core's tests record every plugin's launches on CPU and check each finds a build
warmup compiles (``core/tests/test_warmup.py``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import multiprocessing
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, fields, replace
from typing import Any

from volta_core.cuda_toolkit import CudaToolkitUnavailable
from volta_core.errors import UsageError
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import CudaKernelConfig, KernelConfig
from volta_core.kernel_api._nvrtc import cuda_cache_dir
from volta_core.kernel_api._warm import (
    TritonTarget,
    cuda_cached,
    triton_cache_dir,
    triton_target,
    triton_variants,
    warm_cuda,
)
from volta_core.planner.plan import Plan

TRITON, CUDA = "triton", "cuda"
BUILT, CACHED, FAILED, NOT_BUILT = "built", "cached", "failed", "not built"

#: The environment variable that turns Triton's JIT into an interpreter (nothing compiles).
INTERPRET_ENV = "TRITON_INTERPRET"

_WRITER_PREFIX = "plugin "


@dataclass(frozen=True)
class Build:
    """One kernel build a plugin declares for the device."""

    plugin: str
    config: KernelConfig | CudaKernelConfig

    @property
    def kind(self) -> str:
        return CUDA if isinstance(self.config, CudaKernelConfig) else TRITON

    @property
    def label(self) -> str:
        return f"{self.plugin}:{self.config.name}"


@dataclass(frozen=True)
class Outcome:
    """What warmup did with one build: ``status`` is built, cached, failed or not built
    (``detail`` says why for the last two); ``lookup_error``: why looking it up in the cache
    failed, when it did (the build was then compiled as not known cached)."""

    build: Build
    status: str
    seconds: float
    detail: str = ""
    lookup_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "build": self.build.label,
            "kind": self.build.kind,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
            "lookup_error": self.lookup_error or None,
        }


@dataclass
class WarmupReport:
    """Everything one warmup run did, for the text and JSON reports."""

    model: str
    device: str
    plugins: list[str]
    triton_cache: str
    cuda_cache: str
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per kind (triton, cuda), how many builds ended in each status."""
        counts: dict[str, dict[str, int]] = {
            kind: dict.fromkeys((BUILT, CACHED, FAILED, NOT_BUILT), 0) for kind in (TRITON, CUDA)
        }
        for outcome in self.outcomes:
            counts[outcome.build.kind][outcome.status] += 1
        return counts

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == FAILED]

    def lookup_errors(self) -> dict[str, int]:
        """How many cache lookups failed with each error (in the order first met)."""
        return dict(Counter(o.lookup_error for o in self.outcomes if o.lookup_error))

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.device,
            "plugins": self.plugins,
            "caches": {TRITON: self.triton_cache, CUDA: self.cuda_cache},
            "counts": self.counts(),
            "lookup_errors": self.lookup_errors(),
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
            "problems": self.problems,
            "builds": [o.as_dict() for o in self.outcomes],
        }

    def render(self) -> str:
        lines = [
            f"vllm-volta warmup: {self.model} on {self.device}",
            f"plugins serving its layers: {', '.join(self.plugins) or 'none'}",
        ]
        counts = self.counts()
        for kind, cache in ((TRITON, self.triton_cache), (CUDA, self.cuda_cache)):
            c = counts[kind]
            lines.append(
                f"{kind}: {c[BUILT]} built, {c[CACHED]} already cached, {c[FAILED]} failed, "
                f"{c[NOT_BUILT]} not built  ({cache})"
            )
        not_built = Counter(o.detail for o in self.outcomes if o.status == NOT_BUILT)
        lines += [f"not built ({n}): {why}" for why, n in not_built.items()]
        failed: dict[str, list[str]] = {}
        for o in self.failed:
            failed.setdefault(o.detail, []).append(o.build.label)
        for why, labels in failed.items():
            more = f" and {len(labels) - 3} more" if len(labels) > 3 else ""
            lines.append(f"failed ({len(labels)}): {', '.join(labels[:3])}{more}: {why}")
        lines += [
            f"cache lookup failed ({n}): {why}: compiled as not known cached (the compiler "
            "finds what is cached, so the results stand; only the time is lost)"
            for why, n in self.lookup_errors().items()
        ]
        lines.append(f"time: {self.seconds:.1f} s")
        lines += [f"note: {note}" for note in self.notes]
        lines += [f"problem: {problem}" for problem in self.problems]
        return "\n".join(lines)


def serving_plugins(plan: Plan) -> list[str]:
    """The plugins whose kernels serve some layer of ``plan``: attention backends, KV-cache
    writers and quant methods, sorted."""
    names = {layer.plugin for layer in plan.layers if layer.plugin}
    names |= {
        layer.cache_writer.removeprefix(_WRITER_PREFIX)
        for layer in plan.layers
        if layer.cache_writer and layer.cache_writer.startswith(_WRITER_PREFIX)
    }
    names |= {entry.plugin for entry in plan.quant if entry.plugin}
    return sorted(name for name in names if name)


def plan_builds(
    plan: Plan, manager: VoltaPluginManager, only: Sequence[str] = ()
) -> tuple[list[str], list[Build]]:
    """The plugins serving ``plan`` and every build they declare for its device, each once
    (Triton builds in both specializations); ``only``: keep the builds whose
    ``plugin:name`` matches one of these shell patterns."""
    plugins = serving_plugins(plan)
    device = plan.options.device
    builds = [
        Build(name, variant)
        for name, cfg in manager.kernel_configs(device)
        if name in plugins
        for variant in triton_variants([cfg])
    ]
    builds += [
        Build(name, cfg) for name, cfg in manager.cuda_kernel_configs(device) if name in plugins
    ]
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for build in builds:
        key = _build_key(build.config)
        if key not in seen:
            seen.add(key)
            unique.append(build)
    if only:
        unique = [b for b in unique if any(fnmatch.fnmatchcase(b.label, p) for p in only)]
    return plugins, unique


def _build_key(cfg: KernelConfig | CudaKernelConfig) -> tuple[Any, ...]:
    """What a compiler builds from ``cfg``: every field but its name (two configurations that
    differ only in name are one build, compiled once)."""
    values = (_frozen(getattr(cfg, f.name)) for f in fields(cfg) if f.name != "name")
    return (type(cfg).__name__, *values)


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def warm(
    builds: Sequence[Build],
    capability: tuple[int, int],
    *,
    jobs: int | None = None,
    progress: bool | None = None,
) -> list[Outcome]:
    """Compile every build for ``capability`` that the caches do not hold, with a progress bar
    on stderr (``progress``: None shows it on a terminal only): first each build is looked up
    here (milliseconds each), then the missing ones are compiled in ``jobs`` processes (one:
    in this one; None: :func:`default_jobs`). Outcomes come in the order of ``builds``; a
    build that fails is an outcome, never a raise, and so is a lookup that fails (the build's
    ``lookup_error``: it is compiled)."""
    from tqdm import tqdm

    cap = 10 * capability[0] + capability[1]
    bar = tqdm(
        total=len(builds),
        desc=f"warmup sm_{cap}",
        unit="kernel",
        file=sys.stderr,
        disable=None if progress is None else not progress,
    )
    outcomes: dict[int, Outcome] = {}
    lookup_errors: dict[int, str] = {}
    with bar, triton_target(cap) as target:
        missing = []
        for i, build in enumerate(builds):
            start = time.perf_counter()
            try:
                cached = _is_cached(build, cap, target)
            except Exception as exc:  # reported per error; the compile decides
                lookup_errors[i] = f"{type(exc).__name__}: {_first_line(exc)}"
                cached = False
            if cached:
                outcomes[i] = Outcome(build, CACHED, time.perf_counter() - start)
                bar.update()
            else:
                missing.append(i)
        jobs = default_jobs(len(missing)) if jobs is None else jobs
        if jobs <= 1 or len(missing) <= 1:
            for i in missing:
                outcomes[i] = _warm_one(builds[i], cap, target.warm)
                bar.update()
        else:
            todo = [builds[i] for i in missing]
            done = _warm_in_pool(todo, cap, jobs, bar.update)
            outcomes.update(zip(missing, done, strict=True))
    for i, error in lookup_errors.items():
        outcomes[i] = replace(outcomes[i], lookup_error=error)
    return [outcomes[i] for i in range(len(builds))]


def _is_cached(build: Build, cap: int, target: TritonTarget) -> bool:
    """Whether the caches hold ``build``; False where no NVRTC is here to key a CUDA build
    (compiling it then says why: not built).

    :raises Exception: whatever the lookup raised otherwise (a Triton whose private functions
        changed, an unreadable cache).
    """
    if isinstance(build.config, CudaKernelConfig):
        try:
            return cuda_cached(build.config, cap)
        except CudaToolkitUnavailable:
            return False
    return target.cached(build.config)


def _warm_in_pool(
    builds: Sequence[Build], cap: int, jobs: int, done: Callable[[], object]
) -> list[Outcome]:
    """Each build in a pool of ``jobs`` fresh processes (spawned: none inherits this one's
    Triton or CUDA state), each compiling for ``sm_<cap>`` from its start."""
    context = multiprocessing.get_context("spawn")
    outcomes: dict[int, Outcome] = {}
    pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_start_worker, initargs=(cap,))
    try:
        futures = {pool.submit(_warm_in_worker, build): i for i, build in enumerate(builds)}
        for future in as_completed(futures):
            i = futures[future]
            try:
                outcomes[i] = future.result()
            except Exception as exc:  # the worker died (killed, out of memory)
                detail = f"the compile worker failed: {type(exc).__name__}: {_first_line(exc)}"
                outcomes[i] = Outcome(builds[i], FAILED, 0.0, detail)
            done()
    except BaseException:  # interrupted: stop the workers rather than wait for their builds
        pool.shutdown(wait=False, cancel_futures=True)
        # Safe mid-build: Triton and the cubin cache write each entry whole or not at all.
        for worker in multiprocessing.active_children():
            worker.terminate()
        raise
    pool.shutdown()
    return [outcomes[i] for i in range(len(builds))]


#: A pool worker's compile target and the context keeping it open for the worker's life
#: (:func:`_start_worker`): the context is held here, since a collected one would close.
_worker_target: list[tuple[int, TritonTarget, contextlib.ExitStack]] = []


def _start_worker(cap: int) -> None:
    # Ctrl-C reaches the whole process group: the parent stops the pool, a worker finishes
    # the build in hand.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stack = contextlib.ExitStack()
    _worker_target.append((cap, stack.enter_context(triton_target(cap)), stack))


def _warm_in_worker(build: Build) -> Outcome:
    cap, target, _ = _worker_target[0]
    return _warm_one(build, cap, target.warm)


def _warm_one(build: Build, cap: int, warm_triton: Callable[[KernelConfig], bool]) -> Outcome:
    start = time.perf_counter()
    try:
        if isinstance(build.config, CudaKernelConfig):
            cached = warm_cuda(build.config, cap)
        else:
            cached = warm_triton(build.config)
    except CudaToolkitUnavailable as exc:
        return Outcome(build, NOT_BUILT, time.perf_counter() - start, _first_line(exc))
    except Exception as exc:  # a kernel that does not compile is reported, the others go on
        detail = f"{type(exc).__name__}: {_first_line(exc)}"
        return Outcome(build, FAILED, time.perf_counter() - start, detail)
    return Outcome(build, CACHED if cached else BUILT, time.perf_counter() - start)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(exc).__name__


#: Builds per compile process at least, by default: a process spends seconds importing Triton,
#: torch and the plugins before its first compile.
BUILDS_PER_JOB = 32

#: Compile processes at most, by default (each holds Triton, torch and the plugins in memory).
MAX_JOBS = 8


def default_jobs(builds: int) -> int:
    """Compile processes for ``builds`` builds: one per :data:`BUILDS_PER_JOB`, at most one per
    CPU and :data:`MAX_JOBS`, at least one (then this process compiles)."""
    return max(1, min(MAX_JOBS, os.cpu_count() or 1, builds // BUILDS_PER_JOB))


def check_environment() -> None:
    """Refuse, before any planning, an environment where warmup cannot compile.

    :raises UsageError: ``TRITON_INTERPRET`` is set (the interpreter compiles nothing), or
        Triton or torch is missing.
    """
    if os.environ.get(INTERPRET_ENV, "0") not in ("", "0"):
        raise UsageError(
            f"{INTERPRET_ENV}={os.environ[INTERPRET_ENV]} makes Triton interpret kernels, so "
            f"nothing would be compiled: unset it to warm the caches"
        )
    missing = [name for name in ("triton", "torch") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"warmup compiles with Triton and torch, and {' and '.join(missing)} is not "
            "installed: run it in the serving environment (or pip install "
            "'vllm-volta-core[kernels]' with the serving stack's Triton version)"
        )


def run_warmup(
    plan: Plan,
    manager: VoltaPluginManager,
    *,
    only: Sequence[str] = (),
    jobs: int | None = None,
    progress: bool | None = None,
) -> WarmupReport:
    """Warm the caches for ``plan``'s plugins on its device and say what happened.

    :raises UsageError: as :func:`check_environment`, or ``only`` matches no build.
    """
    check_environment()
    start = time.perf_counter()
    plugins, builds = plan_builds(plan, manager, only)
    if only and not builds:
        raise UsageError(f"--only {' '.join(only)} matches none of the plan's builds")
    device = plan.options.device
    report = WarmupReport(
        plan.model.name,
        device.sm,
        plugins,
        str(triton_cache_dir()),
        str(cuda_cache_dir()),
        problems=list(plan.problems),
    )
    report.outcomes = warm(builds, device.capability, jobs=jobs, progress=progress)
    report.seconds = time.perf_counter() - start
    if not os.environ.get("TRITON_CACHE_DIR"):
        report.notes.append(
            "TRITON_CACHE_DIR is not set: export the same value for warmup and `vllm serve` "
            "(vLLM's torch.compile points Triton at its own per-model cache when it is unset)"
        )
    return report
