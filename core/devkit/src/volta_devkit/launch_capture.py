"""Record the Triton launches third-party host code makes, without a GPU, for the SM70 gate.

A library's host function (vLLM's ``chunk_gated_delta_rule``, say) decides which kernels it
launches, with which ``tl.constexpr`` values, and which autotune configurations its autotuner
would time: that is the code a V100 runs, so the gate should compile exactly those launches.
:func:`recording_launches` replaces Triton's launch entry points while the host code runs on
CPU tensors: ``JITFunction.run`` records the launch instead of compiling it, and
``Autotuner.run`` hands on every configuration left after the autotuner's own pruning (the
set it would time) instead of timing them. :func:`gate_inputs` then turns a recorded launch
into :func:`volta_devkit.gate.compile_for`'s arguments the way Triton's JIT specializes them
(``triton/runtime/jit.py``): a tensor is a pointer to its dtype, an integer equal to 1 is a
compile-time 1, an integer divisible by 16 is compiled as such, ``None`` is a constexpr.

The host code still runs its own tensor arithmetic (output allocation, chunk indices) on the
CPU; only the kernels do not run, so what it returns is uninitialized memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: torch dtype name -> Triton's pointer element type.
_POINTER_TYPES = {
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float64": "fp64",
    "int8": "i8",
    "uint8": "u8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "bool": "i1",
}

_INT32_RANGE = range(-(2**31), 2**31)


@dataclass(frozen=True)
class Launch:
    """One recorded launch: the ``@triton.jit`` function, every argument by name (defaults
    applied), the launch options, and ``autotune_group``: the launches one autotuner call
    would have timed share it (a launch without an autotuner has a group of its own)."""

    kernel: Any
    arguments: dict[str, Any]
    num_warps: int
    num_stages: int
    autotune_group: int

    @property
    def name(self) -> str:
        return str(self.kernel.__name__)


@dataclass
class LaunchLog:
    """The launches recorded by one :func:`recording_launches` block, in call order."""

    launches: list[Launch] = field(default_factory=list)
    _groups: int = 0

    def new_group(self) -> int:
        self._groups += 1
        return self._groups


@contextlib.contextmanager
def recording_launches() -> Iterator[LaunchLog]:
    """While open, Triton kernels record their launches in the yielded log and run nothing.

    Not thread-safe: it patches Triton's classes for the whole process, and restores them on
    exit. Kernels defined under ``TRITON_INTERPRET=1`` are interpreted functions, which carry
    no compile-time parameters to record: they run as they would without this.
    """
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    log = LaunchLog()
    current_group: list[int] = []
    jit_run, tuner_run = JITFunction.run, Autotuner.run

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
        for k in ("num_ctas", "maxnreg", "enable_fp_fusion", "debug", "launch_cooperative_grid"):
            kwargs.pop(k, None)
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        group = current_group[-1] if current_group else log.new_group()
        log.launches.append(
            Launch(
                self,
                dict(bound.arguments),
                int(options.get("num_warps") or 4),
                int(options.get("num_stages") or 3),
                group,
            )
        )

    def every_config(self: Any, *args: Any, **kwargs: Any) -> None:
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        configs = self.prune_configs(kwargs) if len(self.configs) > 1 else self.configs[:1]
        current_group.append(log.new_group())
        try:
            for config in configs:
                self.fn.run(*args, **kwargs, **config.all_kwargs())
        finally:
            current_group.pop()
            self.nargs = None

    JITFunction.run = record
    Autotuner.run = every_config
    try:
        yield log
    finally:
        JITFunction.run = jit_run
        Autotuner.run = tuner_run


@dataclass(frozen=True)
class GateInputs:
    """:func:`volta_devkit.gate.compile_for`'s arguments for one launch."""

    signature: dict[str, str]
    constexprs: dict[str, Any]
    divisible_by_16: tuple[str, ...]


def gate_inputs(launch: Launch) -> GateInputs:
    """The signature, constexprs and 16-divisible integers Triton's JIT would compile
    ``launch`` with. Raises :class:`TypeError` naming an argument of a type Triton does not
    take as a runtime argument."""
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    divisible: list[str] = []
    for param in launch.kernel.params:
        name, value = param.name, launch.arguments[param.name]
        if param.is_constexpr or value is None:
            constexprs[name] = value
        elif hasattr(value, "dtype") and hasattr(value, "data_ptr"):
            dtype = str(value.dtype).removeprefix("torch.")
            if dtype not in _POINTER_TYPES:
                raise TypeError(f"{launch.name}: argument {name} is a {dtype} tensor")
            signature[name] = "*" + _POINTER_TYPES[dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1 and not param.do_not_specialize:
                constexprs[name] = 1
                continue
            signature[name] = "i32" if value in _INT32_RANGE else "i64"
            if value % 16 == 0 and not (
                param.do_not_specialize or param.do_not_specialize_on_alignment
            ):
                divisible.append(name)
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{launch.name}: argument {name} is a {type(value).__name__}")
    return GateInputs(signature, constexprs, tuple(divisible))


def build_key(launch: Launch) -> tuple[Any, ...]:
    """What the compiler builds for ``launch``: equal keys are one compilation."""
    inputs = gate_inputs(launch)
    return (
        id(launch.kernel),
        tuple(sorted(inputs.signature.items())),
        tuple(sorted((k, repr(v)) for k, v in inputs.constexprs.items())),
        inputs.divisible_by_16,
        launch.num_warps,
        launch.num_stages,
    )
