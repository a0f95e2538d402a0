"""The SM70 compile gate: prove a Triton kernel fits a V100 without having one.

Triton compiles for any NVIDIA target on a machine with no GPU (``triton.compile`` with a
``GPUTarget``; docs/kernels.md#sm70-facts). The gate compiles
one launch configuration for ``GPUTarget("cuda", capability, 32)``, runs the bundled ``ptxas -v``
on the PTX for the register and spill figures (Triton itself only learns them when it loads the
binary on a GPU), reads the shared memory Triton allocated from the compile metadata, and
disassembles the cubin for an opcode histogram with a disassembler that reads the target
(:mod:`volta_devkit.disassembler`: Triton 3.9's bundled one refuses SM70).

A configuration passes when it compiles, spills nothing, uses at most 96 KB of shared memory
(Volta's per-block limit) and, below SM89, uses no ``fp8e4nv`` (e4m3), which Volta cannot
convert. Every failure, a compile error included, is a line in :attr:`GateReport.problems`: the
gate never raises for a bad kernel, so one test can report all configurations of a plugin.

Triton is imported inside the functions, never at import time.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import itertools
import os
import re
import subprocess
import tempfile
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from volta_core import FP8_E4M3_MIN_CAPABILITY, CudaKernelConfig, KernelConfig
from volta_devkit import measure_cache
from volta_devkit.disassembler import (
    DisassemblerUnavailable,
    disassemble,
    disassembler_for,
    nvidia_tool,
    sass_histogram,
)

#: Volta's largest shared-memory allocation per block (opt-in above 48 KB).
MAX_SHARED_BYTES = 96 * 1024

#: First compute capability with e4m3 (``fp8e4nv``) conversion, as Triton spells it (89): the
#: host's :data:`volta_core.FP8_E4M3_MIN_CAPABILITY`.
FP8E4NV_MIN_CAPABILITY = 10 * FP8_E4M3_MIN_CAPABILITY[0] + FP8_E4M3_MIN_CAPABILITY[1]

# How e4m3 shows up in each stage's text: MLIR's type in TTIR/TTGIR/LLIR, PTX's cvt suffix.
_E4M3_PATTERNS = {
    "ttir": re.compile(r"f8E4M3FN\b"),
    "ttgir": re.compile(r"f8E4M3FN\b"),
    "ptx": re.compile(r"\.e4m3x?\d*\b"),
}

_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILLS = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTX_TARGET = re.compile(r"^\s*\.target\s+(sm_\w+)", re.MULTILINE)


@dataclass
class GateReport:
    """What the gate measured for one kernel launch configuration.

    ``n_spills`` is the bytes of register spill stores ptxas reports (``n_spill_loads`` the
    loads); ``stack_bytes`` the local-memory stack frame, reported but not judged (an indexed
    local array needs one without spilling). Figures are None when the kernel did not get that
    far. ``sass_histogram`` counts SASS opcodes without modifiers (``FFMA``, ``LDG``, ``HMMA``).
    """

    name: str
    capability: int
    num_warps: int = 4
    num_stages: int = 1
    n_regs: int | None = None
    n_spills: int | None = None
    n_spill_loads: int | None = None
    stack_bytes: int | None = None
    shared_bytes: int | None = None
    sass_histogram: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when nothing stops this configuration from running on the target."""
        return not self.problems

    def describe(self) -> str:
        """One paragraph with the verdict, the figures and every problem."""
        verdict = "passes" if self.passed else "FAILS"
        lines = [
            f"{self.name} on sm_{self.capability} (num_warps={self.num_warps}, "
            f"num_stages={self.num_stages}) {verdict} the compile gate: "
            f"registers={self.n_regs}, spill stores={self.n_spills} B, "
            f"spill loads={self.n_spill_loads} B, stack={self.stack_bytes} B, "
            f"shared={self.shared_bytes} B (limit {MAX_SHARED_BYTES} B)"
        ]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def compile_for(
    kernel: Any,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any] | None = None,
    *,
    num_warps: int = 4,
    num_stages: int = 1,
    capability: int = 70,
    name: str | None = None,
    divisible_by_16: Iterable[str] = (),
    measure: bool = True,
) -> GateReport:
    """Compile one launch configuration of ``kernel`` for ``sm_<capability>`` and judge it.

    :param kernel: a ``@triton.jit`` function, or an autotuner/heuristics wrapper of one. A
        kernel defined under ``TRITON_INTERPRET=1`` is compiled in a spawned worker process that
        imports its module again with the interpreter off (see :func:`_runs_interpreted`).
    :param signature: argument name to Triton type (``*fp16``, ``i32``, ``fp32``...) for every
        runtime argument. Pointers are compiled as 16-byte aligned, as the JIT does for
        tensors from torch's allocator.
    :param constexprs: values of the ``tl.constexpr`` arguments.
    :param divisible_by_16: integer arguments compiled as multiples of 16, as the JIT
        specializes a launch whose values are (strides, sizes of real models). That
        specialization changes vectorization and software pipelining, so a kernel can compile
        without it and fail with it (Triton 3.6's SM90 pipeliner did, on the H100).
    :param measure: run ``ptxas -v`` and the disassembler for the registers, spills and SASS
        histogram the gate judges (kept in :mod:`volta_devkit.measure_cache`). False only
        compiles and reads the shared memory, for a target whose limits are not judged here:
        the report's figures are then None and :func:`compiled` is its verdict.
    """
    constexprs = dict(constexprs or {})
    divisible = tuple(divisible_by_16)
    if _runs_interpreted(kernel):
        try:
            location = _locate(kernel)
        except TypeError as exc:
            report = GateReport(name or _kernel_name(kernel), capability, num_warps, num_stages)
            report.problems.append(str(exc))
            return report
        return _compile_elsewhere(
            _CompileRequest(
                location,
                dict(signature),
                constexprs,
                num_warps,
                num_stages,
                capability,
                name or _kernel_name(kernel),
                divisible,
                measure,
            )
        )
    report = GateReport(
        name=name or _kernel_name(kernel),
        capability=capability,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    try:
        compiled = _compile(
            kernel, signature, constexprs, num_warps, num_stages, capability, divisible
        )
    except Exception as exc:  # a compile failure is a finding, not an error of the gate
        report.problems.append(_describe_compile_error(exc, capability))
        return report

    report.shared_bytes = int(_metadata_field(compiled.metadata, "shared"))
    asm = compiled.asm
    if capability < FP8E4NV_MIN_CAPABILITY:
        stages = [s for s, pattern in _E4M3_PATTERNS.items() if pattern.search(str(asm.get(s, "")))]
        if stages:
            report.problems.append(
                f"uses fp8e4nv (e4m3), which sm_{capability} cannot convert "
                f"(found in {', '.join(stages)}); use e5m2 (fp8e5) on this path"
            )
    if not measure:
        return report
    _measure(report, asm["ptx"], asm["cubin"], capability)

    if report.shared_bytes > MAX_SHARED_BYTES:
        report.problems.append(
            f"needs {report.shared_bytes} B of shared memory, over the {MAX_SHARED_BYTES} B "
            "a Volta block can have"
        )
    if report.n_spills:
        report.problems.append(
            f"spills registers: {report.n_spills} B of spill stores and {report.n_spill_loads} B "
            f"of spill loads with {report.n_regs} registers per thread; use smaller tiles or "
            "more warps"
        )
    return report


def check_kernel_config(
    cfg: KernelConfig, capability: int = 70, *, measure: bool = True
) -> GateReport:
    """Import ``cfg.kernel`` (``"package.module:function"``) and run :func:`compile_for` on it
    (``measure`` as there)."""
    try:
        kernel = import_kernel(cfg.kernel)
    except Exception as exc:
        report = GateReport(cfg.name, capability, cfg.num_warps, cfg.num_stages)
        report.problems.append(f"cannot import kernel {cfg.kernel!r}: {type(exc).__name__}: {exc}")
        return report
    return compile_for(
        kernel,
        cfg.signature,
        cfg.constexprs,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        capability=capability,
        name=cfg.name,
        divisible_by_16=cfg.divisible_by_16,
        measure=measure,
    )


def gate_variants(configs: Iterable[KernelConfig]) -> list[KernelConfig]:
    """Each configuration as declared and, where it names ``divisible_by_16`` arguments, also
    without that specialization (suffix ``[any-size]``): a device runs both, the specialized
    build for model-sized strides and the other for odd shapes, so the gate checks both.
    A configuration whose launcher refuses odd shapes (``divisibility_enforced``) never runs
    the unspecialized build and is gated as declared only."""
    variants: list[KernelConfig] = []
    for cfg in configs:
        variants.append(cfg)
        if cfg.divisible_by_16 and not cfg.divisibility_enforced:
            variants.append(replace(cfg, name=f"{cfg.name}[any-size]", divisible_by_16=()))
    return variants


def build_key(cfg: KernelConfig | CudaKernelConfig) -> tuple[Any, ...]:
    """What a compiler builds from ``cfg``: every field but its name, so two configurations
    with the same key are one build, whatever they are called (the gate compiles it once)."""
    fields = [
        (f.name, _frozen(getattr(cfg, f.name))) for f in dataclass_fields(cfg) if f.name != "name"
    ]
    return (type(cfg).__name__, *fields)


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def distinct_builds(configs: Iterable[KernelConfig]) -> list[KernelConfig]:
    """``configs`` without those repeating an earlier one's build (:func:`build_key`), in order:
    one gate test id per build, not per name."""
    seen: set[tuple[Any, ...]] = set()
    kept = []
    for cfg in configs:
        key = build_key(cfg)
        if key not in seen:
            seen.add(key)
            kept.append(cfg)
    return kept


def pairwise_cover(configs: Sequence[KernelConfig]) -> list[KernelConfig]:
    """A subset of ``configs`` in which, for each kernel and each build (specialized for
    ``divisible_by_16`` or not), every pair of launch-parameter values that occurs together in
    ``configs`` occurs together at least once: all-pairs coverage, as combinatorial testing
    uses it (NIST SP 800-142). The parameters are ``num_warps``, ``num_stages``, each
    constexpr and each argument type. Chosen greedily (the configuration covering the most
    uncovered pairs first, ties in the order given), so the result is deterministic and keeps
    the given order; it holds every configuration when each is needed for some pair.
    """
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, cfg in enumerate(configs):
        groups.setdefault((cfg.kernel, bool(cfg.divisible_by_16)), []).append(i)
    chosen: list[int] = []
    for members in groups.values():
        pairs = {i: _value_pairs(configs[i]) for i in members}
        uncovered = set().union(*pairs.values())
        while uncovered:
            best = max(members, key=lambda i: (len(pairs[i] & uncovered), -i))
            chosen.append(best)
            uncovered -= pairs[best]
    return [configs[i] for i in sorted(chosen)]


def _value_pairs(cfg: KernelConfig) -> frozenset[tuple[tuple[str, str], tuple[str, str]]]:
    values = [("num_warps", repr(cfg.num_warps)), ("num_stages", repr(cfg.num_stages))]
    values += [(f"constexpr {k}", repr(v)) for k, v in cfg.constexprs.items()]
    values += [(f"argument {k}", t) for k, t in cfg.signature.items()]
    return frozenset(itertools.combinations(sorted(values), 2))


def compiled(report: GateReport) -> bool:
    """Whether Triton compiled the configuration at all, whatever the gate then judged."""
    return report.shared_bytes is not None


def assert_gate_passes(report: GateReport) -> None:
    """Raise :class:`AssertionError` with the figures and every problem if the report fails."""
    if not report.passed:
        raise AssertionError(report.describe())


def import_kernel(path: str) -> Any:
    """Resolve ``"package.module:attr.path"`` to the object it names."""
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"kernel path {path!r} is not of the form 'package.module:function'")
    obj: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        obj = getattr(obj, attr)
    return obj


# -- compiling ----------------------------------------------------------------------------


def _compile(
    kernel: Any,
    signature: Mapping[str, str],
    constexprs: dict[str, Any],
    num_warps: int,
    num_stages: int,
    capability: int,
    divisible_by_16: tuple[str, ...] = (),
) -> Any:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = as_jit_function(kernel)
    arg_names = list(fn.arg_names)
    unknown = sorted((set(signature) | set(constexprs)) - set(arg_names))
    if unknown:
        raise ValueError(f"{fn.__name__} has no argument(s) {unknown}; its arguments: {arg_names}")
    missing = [a for a in arg_names if a not in signature and a not in constexprs]
    if missing:
        raise ValueError(f"no type or constexpr value given for argument(s) {missing}")
    full_signature = {a: ("constexpr" if a in constexprs else signature[a]) for a in arg_names}
    not_integers = sorted(
        a for a in divisible_by_16 if a not in signature or signature[a] not in ("i32", "i64")
    )
    if not_integers:
        raise ValueError(
            f"divisible_by_16 names {not_integers}, which are not i32/i64 runtime arguments of "
            f"{fn.__name__}"
        )
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, a in enumerate(arg_names)
        if a not in constexprs and (full_signature[a].startswith("*") or a in divisible_by_16)
    }
    source = make_ast_source(ASTSource, fn, full_signature, constexprs, aligned)
    target = GPUTarget("cuda", capability, 32)
    noise = io.StringIO()  # Triton prints a ptxas reproducer on failure: keep it in the report
    with contextlib.redirect_stdout(noise):
        return triton.compile(
            source, target=target, options={"num_warps": num_warps, "num_stages": num_stages}
        )


def make_ast_source(
    source_cls: Callable[..., Any],
    fn: Any,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any],
    attrs: Mapping[Any, Any] | None = None,
) -> Any:
    """Build an ``ASTSource`` whatever the installed Triton calls its arguments.

    Triton 3.5+ names the constexpr values ``constexprs``; earlier 3.x named them ``constants``.
    The parameter names are read off the constructor, not guessed from the version string.
    """
    params = inspect.signature(source_cls).parameters
    kwargs: dict[str, Any] = {}
    if "constexprs" in params:
        kwargs["constexprs"] = dict(constexprs)
    elif "constants" in params:
        kwargs["constants"] = dict(constexprs)
    else:
        raise TypeError(
            f"{getattr(source_cls, '__qualname__', source_cls)} takes neither 'constexprs' nor "
            f"'constants' (parameters: {list(params)}): unsupported Triton version"
        )
    if attrs and "attrs" in params:
        kwargs["attrs"] = dict(attrs)
    return source_cls(fn, dict(signature), **kwargs)


def as_jit_function(kernel: Any) -> Any:
    """Unwrap ``kernel`` (autotuner, heuristics) to the ``JITFunction`` the compiler takes.

    Raises :class:`TypeError` for anything else, an interpreted function included.
    """
    from triton.runtime.jit import JITFunction

    fn = kernel
    while not isinstance(fn, JITFunction):
        inner = getattr(fn, "fn", None)
        if inner is None or inner is fn:
            raise TypeError(f"{kernel!r} is not a @triton.jit function")
        fn = inner
    return fn


def _python_function(kernel: Any) -> types.FunctionType:
    """The Python function under a ``@triton.jit`` kernel, whatever wraps it."""
    fn = kernel
    while not isinstance(fn, types.FunctionType):
        inner = getattr(fn, "fn", None)
        if inner is None or inner is fn:
            raise TypeError(f"{kernel!r} is not a @triton.jit function")
        fn = inner
    return fn


def _runs_interpreted(kernel: Any) -> bool:
    """Whether ``kernel`` or Triton's own library functions were built by the interpreter.

    ``TRITON_INTERPRET=1`` at import turns every ``@triton.jit`` function into an interpreted
    one, ``tl.cdiv``, ``tl.max`` and the tensor methods included: the compiler takes none of
    them, so such a kernel is compiled in a worker process where the switch is off.
    """
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    try:
        as_jit_function(kernel)
    except TypeError:
        return True
    return not isinstance(tl.cdiv, JITFunction)


# -- the clean worker for kernels defined under the interpreter ---------------------------

_INTERPRET_ENV = "TRITON_INTERPRET"


class _Worker:
    """A child Python, kept for the session, that compiles with the interpreter switched off.

    Requests and reports travel as length-prefixed pickles over its stdin and stdout (whole
    frames, so one bad request cannot desynchronize the next); the child points its own file
    descriptor 1 at stderr first, so whatever Triton or ptxas prints cannot corrupt them. A
    plain subprocess (not multiprocessing) never re-imports the caller's ``__main__``.
    """

    def __init__(self) -> None:
        import sys

        env = {k: v for k, v in os.environ.items() if k != _INTERPRET_ENV}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from volta_devkit.gate import _serve; _serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    def call(self, payload: bytes) -> bytes:
        """Send one request frame and return the reply frame; EOFError if the worker is gone."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        if stdin is None or stdout is None:
            raise EOFError("the compile worker has no pipes")
        try:
            _write_frame(stdin, payload)
        except BrokenPipeError as exc:
            raise EOFError(str(exc)) from exc
        return _read_frame(stdout)


def _write_frame(stream: Any, payload: bytes) -> None:
    stream.write(len(payload).to_bytes(8, "little") + payload)
    stream.flush()


def _read_frame(stream: Any) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = stream.read(n - len(data))
            if not chunk:
                raise EOFError("the compile worker closed its pipe")
            data += chunk
        return data

    return exactly(int.from_bytes(exactly(8), "little"))


_worker: _Worker | None = None


@dataclass(frozen=True)
class _CompileRequest:
    """One configuration to compile in the worker: :func:`compile_for`'s arguments, with the
    kernel given by where to find it (``module``, ``qualname``, ``filename``)."""

    location: tuple[str, str, str]
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    capability: int
    name: str
    divisible_by_16: tuple[str, ...]
    measure: bool = True


def _compile_elsewhere(request: _CompileRequest) -> GateReport:
    """Compile in the worker; a request or worker failure becomes a problem, never a raise."""
    import pickle

    global _worker
    name = request.name
    report = GateReport(name, request.capability, request.num_warps, request.num_stages)
    try:
        payload = pickle.dumps(request)
    except Exception as exc:
        report.problems.append(
            f"cannot hand {name} to the compile worker (needed because the kernel was defined "
            f"under {_INTERPRET_ENV}=1): {type(exc).__name__}: {exc}"
        )
        return report
    if _worker is None or _worker.proc.poll() is not None:
        _worker = _Worker()
    try:
        return pickle.loads(_worker.call(payload))
    except EOFError:
        code = _worker.proc.wait()
        _worker = None
        report.problems.append(f"the gate's compile worker exited (code {code}) compiling {name}")
        return report


def _serve() -> None:
    """The worker's loop: one request frame in, one report frame out, until stdin closes."""
    import pickle
    import sys

    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    while True:
        try:
            payload = _read_frame(requests)
        except EOFError:
            return
        try:
            report = _compile_in_worker(pickle.loads(payload))
        except Exception as exc:  # unpicklable request: answer, and stay in step
            report = GateReport("?", 0)
            report.problems.append(f"the compile worker could not take the request: {exc!r}")
        _write_frame(replies, pickle.dumps(report))


def _locate(kernel: Any) -> tuple[str, str, str]:
    fn = _python_function(kernel)
    return fn.__module__, fn.__qualname__, fn.__code__.co_filename


def _load_kernel(module: str, qualname: str, filename: str) -> Any:
    """Find the kernel again in the worker: by module name, else by the file it was defined in."""
    import importlib.util

    spec = None
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec(module)
    same_file = (
        spec is not None and spec.origin and Path(spec.origin).resolve() == Path(filename).resolve()
    )
    if same_file:
        obj: Any = importlib.import_module(module)
    else:  # a test module imported by path (pytest's importlib mode): load the file itself
        private = f"_volta_gate_{abs(hash(filename))}"
        spec = importlib.util.spec_from_file_location(private, filename)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {filename} to find {qualname}")
        obj = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(obj)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    return obj


def _compile_in_worker(request: _CompileRequest) -> GateReport:
    try:
        kernel = _load_kernel(*request.location)
    except Exception as exc:
        report = GateReport(request.name, request.capability, request.num_warps, request.num_stages)
        report.problems.append(
            f"cannot load {request.location[1]} from {request.location[2]} with the interpreter "
            f"off: {type(exc).__name__}: {exc}"
        )
        return report
    return compile_for(
        kernel,
        request.signature,
        request.constexprs,
        num_warps=request.num_warps,
        num_stages=request.num_stages,
        capability=request.capability,
        name=request.name,
        divisible_by_16=request.divisible_by_16,
        measure=request.measure,
    )


def _kernel_name(kernel: Any) -> str:
    return str(getattr(kernel, "__name__", None) or type(kernel).__name__)


def _metadata_field(metadata: Any, key: str) -> Any:
    return metadata[key] if isinstance(metadata, Mapping) else getattr(metadata, key)


def _describe_compile_error(exc: BaseException, capability: int) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    if capability < FP8E4NV_MIN_CAPABILITY and ("fp8e4nv" in text or "e4m3" in text.lower()):
        prefix = (
            f"uses fp8e4nv (e4m3), which sm_{capability} cannot convert; use e5m2 (fp8e5) "
            "on this path. Compiler said: "
        )
    else:
        prefix = f"does not compile for sm_{capability}: "
    # Triton's message is the source up to the failing line, a caret, then the reason: keep
    # the head (which error, where) and the tail (the line and the reason).
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 14:
        lines = [lines[0], f"... ({len(lines) - 13} lines)", *lines[-12:]]
    return prefix + "\n".join(lines)


# -- measuring ----------------------------------------------------------------------------


def _measure(report: GateReport, ptx: str, cubin: bytes, capability: int) -> None:
    """Registers, spills and the SASS histogram: from the cache when this PTX and cubin were
    measured with the same tools, else measured (and kept when nothing went wrong)."""
    name = _measurement_key(ptx, cubin, capability)
    found = measure_cache.load(name) if name else None
    if found is not None:
        report.n_regs, report.stack_bytes = found.n_regs, found.stack_bytes
        report.n_spills, report.n_spill_loads = found.n_spills, found.n_spill_loads
        report.sass_histogram = dict(found.sass_histogram)
        return
    problems = len(report.problems)
    _measure_registers(report, ptx, capability)
    _measure_sass(report, cubin, capability)
    regs, stack, spills, loads = (
        report.n_regs,
        report.stack_bytes,
        report.n_spills,
        report.n_spill_loads,
    )
    if name is None or len(report.problems) != problems:
        return
    if regs is None or stack is None or spills is None or loads is None:
        return
    histogram = dict(report.sass_histogram)
    measure_cache.store(name, measure_cache.Measurement(regs, stack, spills, loads, histogram))


def _measurement_key(ptx: str, cubin: bytes, capability: int) -> str | None:
    """The cache entry for this measurement, or None when the cache is off or a tool is
    missing or unnamed (the measurement then runs, and reports what is missing)."""
    if measure_cache.cache_dir() is None:
        return None
    ptxas = nvidia_tool(_ptxas_name(capability))
    if ptxas is None:
        return None
    try:
        disassembler = disassembler_for(f"sm_{capability}").tool
    except DisassemblerUnavailable:
        return None
    ptxas_id = measure_cache.tool_identity(ptxas)
    disassembler_id = measure_cache.tool_identity(disassembler)
    if ptxas_id is None or disassembler_id is None:
        return None
    return measure_cache.key(ptx, cubin, capability, [ptxas_id, disassembler_id])


def _ptxas_name(capability: int) -> str:
    return "ptxas-blackwell" if capability >= 100 else "ptxas"


def _measure_registers(report: GateReport, ptx: str, capability: int) -> None:
    match = _PTX_TARGET.search(ptx)
    arch = match.group(1) if match else f"sm_{capability}"
    ptxas = nvidia_tool(_ptxas_name(capability))
    if ptxas is None:
        report.problems.append("ptxas not found: registers and spills could not be measured")
        return
    with tempfile.TemporaryDirectory(prefix="volta-gate-") as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        run = subprocess.run(
            [str(ptxas), "-v", f"--gpu-name={arch}", str(src), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
            check=False,
        )
    log = run.stdout + run.stderr
    regs, spills = _PTXAS_REGS.search(log), _PTXAS_SPILLS.search(log)
    if run.returncode != 0 or regs is None or spills is None:
        report.problems.append(
            f"{ptxas} -v gave no resource report for {arch} (exit {run.returncode}): "
            + log.strip()[-500:]
        )
        return
    report.n_regs = int(regs.group(1))
    report.stack_bytes, report.n_spills, report.n_spill_loads = map(int, spills.groups())


def _measure_sass(report: GateReport, cubin: bytes, capability: int) -> None:
    """The opcode histogram, from a disassembler that reads the target (never an empty one:
    a target no disassembler here reads is a problem naming what was tried)."""
    try:
        sass = disassemble(cubin, f"sm_{capability}")
    except DisassemblerUnavailable as exc:
        report.problems.append(f"no SASS histogram: {exc}")
        return
    report.sass_histogram = sass_histogram(sass)
