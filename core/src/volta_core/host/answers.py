"""Checking every hook answer at the boundary, before the host or a resolution reads it.

A plugin is someone else's code: its answer may be of any type. Each hook's answer is checked
here against the hook's declared return type (a list of declarations, one declaration, or
None), and every declaration against its dataclass's field types, so that a wrong answer is a
:class:`InvalidAnswer` naming the hook and what was wrong, never an ``AttributeError`` deep in a
resolution. Declaration hooks must answer a list or tuple (a bare declaration, a string, a dict
or a generator is refused: the host reads the answer more than once and a string is iterable).
"""

from __future__ import annotations

import enum
import functools
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from volta_core.errors import PluginError
from volta_core.host.bench_case import BenchCase
from volta_core.host.dispatch import KernelCost, LaunchCost, StageCost
from volta_core.host.types import (
    AttentionBackendSpec,
    CudaKernelConfig,
    KernelConfig,
    KernelPath,
    KVCacheOpsSpec,
    KVVerdict,
    QuantClaim,
    QuantDecline,
    QuantMethodSpec,
    ReasoningParserSpec,
    ReasoningSplit,
)


class InvalidAnswer(PluginError):
    """A hook answered with a value of the wrong type or shape."""


#: Hooks answering a list of declarations, and the type of each element.
LIST_HOOKS: dict[str, type] = {
    "volta_attention_backends": AttentionBackendSpec,
    "volta_quant_methods": QuantMethodSpec,
    "volta_reasoning_parsers": ReasoningParserSpec,
    "volta_kernel_configs": KernelConfig,
    "volta_kv_cache_ops": KVCacheOpsSpec,
    "volta_cuda_kernel_configs": CudaKernelConfig,
    "volta_kernel_paths": KernelPath,
}

#: Hooks answering one declaration or None, and the types it may be.
ONE_HOOKS: dict[str, tuple[type, ...]] = {
    "volta_quant_method": (QuantClaim, QuantDecline),
    "volta_kv_cache_verdict": (KVVerdict,),
    "volta_reasoning_postprocess": (ReasoningSplit,),
    "volta_kernel_cost": (StageCost,),
    "volta_bench_case": (BenchCase,),
}

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
"""Declared names: letters, digits, '.', '_' or '-' (they appear in flags and listings)."""

IMPL_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
"""Implementation paths: ``package.module:Attribute``."""


def _type_name(value: object) -> str:
    return type(value).__name__


def check_answer(hook: str, answer: object) -> Any:
    """Return ``answer`` (a list hook's as a tuple) if it has the hook's type; else raise.

    Raises :class:`InvalidAnswer` naming the hook, the expected type and what came instead.
    """
    if hook in LIST_HOOKS:
        return _check_list(hook, answer, LIST_HOOKS[hook])
    if hook in ONE_HOOKS:
        if answer is None:
            return None
        allowed = ONE_HOOKS[hook]
        if not isinstance(answer, allowed):
            names = " or ".join(t.__name__ for t in allowed)
            raise InvalidAnswer(f"{hook} returned {_type_name(answer)}, expected {names} or None")
        _check_fields(hook, answer)
        return answer
    raise InvalidAnswer(f"{hook} is not a hook of this host")


def _check_list(hook: str, answer: object, element: type) -> tuple[Any, ...]:
    if answer is None:
        return ()
    if not isinstance(answer, list | tuple):
        raise InvalidAnswer(
            f"{hook} returned {_type_name(answer)}, expected a list of {element.__name__}"
        )
    for i, item in enumerate(answer):
        if not isinstance(item, element):
            raise InvalidAnswer(
                f"{hook} returned a list whose item {i} is {_type_name(item)}, expected "
                f"{element.__name__}"
            )
        _check_fields(hook, item)
    if element is KernelPath:
        stages = [path.stage for path in answer]
        repeated = sorted({stage for stage in stages if stages.count(stage) > 1})
        if repeated:
            raise InvalidAnswer(f"{hook} returned stage(s) {', '.join(map(repr, repeated))} twice")
    return tuple(answer)


def _check_fields(hook: str, declaration: object) -> None:
    """Every field of a declaration has its annotated type (bool is not accepted as int)."""
    assert is_dataclass(declaration)
    cls: type = type(declaration)
    hints = _hints(cls)
    for f in fields(declaration):
        value = getattr(declaration, f.name)
        if not _conforms(value, hints[f.name]):
            raise InvalidAnswer(
                f"{hook} returned a {type(declaration).__name__} whose {f.name} is "
                f"{_short(value)} ({_type_name(value)}), expected {_spell(hints[f.name])}"
            )
    if isinstance(declaration, AttentionBackendSpec) and (
        declaration.min_capability > declaration.max_capability
    ):
        raise InvalidAnswer(
            f"{hook} returned backend {declaration.name!r} whose min_capability "
            f"{declaration.min_capability} is above its max_capability {declaration.max_capability}"
        )
    if isinstance(declaration, StageCost):
        _check_stage_cost(hook, declaration)
    if isinstance(declaration, BenchCase) and (
        not declaration.stage or not declaration.kernel or not IMPL_RE.match(declaration.impl)
    ):
        raise InvalidAnswer(
            f"{hook} returned a BenchCase with an empty stage or kernel, or an impl "
            f"{declaration.impl!r} that is not 'package.module:Attribute'"
        )
    if isinstance(declaration, KernelPath):
        if not declaration.stage or not declaration.kernel:
            raise InvalidAnswer(f"{hook} returned a KernelPath with an empty stage or kernel")
        if declaration.needs_nvrtc and not declaration.fallback:
            raise InvalidAnswer(
                f"{hook} returned stage {declaration.stage!r} needing NVRTC without a fallback"
            )


def _check_stage_cost(hook: str, answer: StageCost) -> None:
    """A stage's costs: a named stage, and each launch's counts whole and not negative."""
    if not answer.stage:
        raise InvalidAnswer(f"{hook} returned a StageCost with an empty stage")
    for cost in (answer.cost, answer.fallback):
        if cost is None:
            continue
        if not isinstance(cost, KernelCost) or not cost.kernel:
            raise InvalidAnswer(f"{hook} returned stage {answer.stage!r} with a malformed cost")
        for launch in cost.launches:
            if not isinstance(launch, LaunchCost):
                raise InvalidAnswer(
                    f"{hook} returned stage {answer.stage!r} whose {cost.kernel!r} has a launch "
                    f"that is not a LaunchCost: {_short(launch)}"
                )
            _check_fields(hook, launch)
            if min(launch.bytes_read, launch.bytes_written, launch.flops) < 0:
                raise InvalidAnswer(
                    f"{hook} returned stage {answer.stage!r} whose {cost.kernel!r} has a "
                    f"negative count: {_short(launch)}"
                )


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _spell(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _conforms(value: object, hint: Any) -> bool:
    """Whether ``value`` matches a declaration field's type hint (the subset types.py uses)."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is int:
        return _is_int(value)
    if hint is float:
        return _is_int(value) or isinstance(value, float)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return isinstance(value, hint)
    if isinstance(hint, type) and origin is None:
        return isinstance(value, hint)
    checker = _CONTAINERS.get(origin)
    return checker is not None and checker(value, args)


def _tuple(value: object, args: tuple[Any, ...]) -> bool:
    if not isinstance(value, tuple):
        return False
    if len(args) == 2 and args[1] is Ellipsis:
        return all(_conforms(v, args[0]) for v in value)
    return len(value) == len(args) and all(
        _conforms(v, a) for v, a in zip(value, args, strict=True)
    )


def _frozenset(value: object, args: tuple[Any, ...]) -> bool:
    return isinstance(value, frozenset) and all(_conforms(v, args[0]) for v in value)


def _mapping(value: object, args: tuple[Any, ...]) -> bool:
    return isinstance(value, Mapping) and all(
        _conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items()
    )


_CONTAINERS: dict[Any, Callable[[object, tuple[Any, ...]], bool]] = {
    tuple: _tuple,
    frozenset: _frozenset,
    Mapping: _mapping,
}


def check_names(label: str, declaration: Any) -> None:
    """A declaration's name and impl path are well formed (they are printed and imported)."""
    if not NAME_RE.match(declaration.name) or not IMPL_RE.match(declaration.impl):
        raise InvalidAnswer(
            f"{label} {declaration.name!r} with impl {declaration.impl!r}: names are letters, "
            "digits, '.', '_' or '-', and impl is 'package.module:Attribute'"
        )
