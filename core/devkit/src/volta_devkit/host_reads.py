"""A trap for host reads of tensors, so a synchronisation cannot creep into a step unnoticed.

On a GPU, reading a device tensor's values on the host (``.item()``, ``.tolist()``, ``.cpu()``,
``int()``, ``bool()`` or ``float()`` of a tensor, ``nonzero``, a boolean mask index...) waits
for the device to finish everything queued before it: once per layer, that costs a decode step
its overlap of host and device work. ``torch.cuda.set_sync_debug_mode("error")`` catches it on
a GPU only; CI has none. :func:`no_host_reads` catches it on CPU tensors: inside the block every
such read raises :class:`HostReadError`, except reads of the tensors the caller says live on
the host (vLLM's CPU copies of a step's lengths, say) and of tensors computed from those alone.

It is a :class:`torch.overrides.TorchFunctionMode`, so it sees the Python-level torch calls
(every tensor method and ``torch.*`` function), not what a compiled kernel does: run it with
the kernels replaced by launchers that do nothing (:class:`NoLaunch`), over the host code of
one step. :func:`torch_calls` records those calls by name, so a test can count the host work
of a call (its allocations, its tensor operations) without a clock; :func:`host_time_us` is
the clock, for the benchmarks that record the figures.

torch is imported when :func:`no_host_reads` is called, never at import time.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Tensor methods and torch functions that hand a tensor's values to the host (each a
#: device-to-host copy and a synchronisation on a GPU), by ``__name__``.
READS = frozenset(
    {
        "item",
        "tolist",
        "cpu",
        "numpy",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__format__",
        "nonzero",
        "argwhere",
        "masked_select",
        "unique",
        "unique_consecutive",
        "equal",
        "allclose",
        "is_nonzero",
    }
)

#: Torch calls that allocate a tensor, by the name :func:`torch_calls` records.
ALLOCATIONS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "zeros",
        "zeros_like",
        "new_zeros",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
        "tensor",
        "as_tensor",
        "clone",
        "arange",
    }
)


class HostReadError(AssertionError):
    """A tensor's values were read on the host inside :func:`no_host_reads`."""


class NoLaunch:
    """A Triton kernel whose launch does nothing (``kernel[grid](*args, **constexprs)``): set
    in a kernel's place, the host's work around it runs alone (the Triton interpreter would
    read the tensors itself)."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return _no_launch


def _no_launch(*args: Any, **kwargs: Any) -> None:
    return None


def host_time_us(call: Callable[[], Any], calls: int, repeat: int) -> tuple[float, float]:
    """The calling thread's CPU time per ``call()`` in microseconds, averaged over ``calls``
    calls a round: the median and the least of ``repeat`` rounds after a first, warming one."""
    rounds = []
    for _ in range(repeat + 1):
        start = time.thread_time_ns()
        for _ in range(calls):
            call()
        rounds.append((time.thread_time_ns() - start) / calls / 1e3)
    return statistics.median(rounds[1:]), min(rounds[1:])


@contextmanager
def torch_calls() -> Iterator[list[str]]:
    """The names of the Python-level torch calls inside the block, in order: a tensor method
    or ``torch.*`` function by its name (``new_empty``, ``stride``), a tensor attribute read
    by the attribute's (``shape``, ``dtype``), an operator by its own (``ns::op``). A call the
    mode sees is counted once, not the calls it makes."""
    from torch.overrides import TorchFunctionMode

    names: list[str] = []

    def record(
        mode: Any,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        names.append(_name(func))
        return func(*args, **(kwargs or {}))

    mode = type("TorchCallRecorder", (TorchFunctionMode,), {"__torch_function__": record})
    with mode():
        yield names


def _name(func: Callable[..., Any]) -> str:
    """A torch call's name: an attribute read (a descriptor's ``__get__``) by the attribute."""
    name = getattr(func, "__name__", "")
    if name == "__get__":
        return str(getattr(getattr(func, "__self__", None), "__name__", name))
    return name or str(func)


@contextmanager
def no_host_reads(allow: Iterable[torch.Tensor] = ()) -> Iterator[None]:
    """Raise :class:`HostReadError` at the first host read of a tensor inside the block
    (:data:`READS`; ``.to("cpu")``; indexing with a boolean mask, whose result's size the device
    decides). Reads of ``allow``'s tensors, of their views and of tensors computed
    from them alone (no other tensor among the inputs) are the host's own and pass."""
    import torch
    from torch.overrides import TorchFunctionMode

    host: dict[int, weakref.ref[torch.Tensor]] = {}

    def mark(t: torch.Tensor) -> None:
        host[id(t)] = weakref.ref(t)

    def on_host(t: torch.Tensor) -> bool:
        ref = host.get(id(t))
        if ref is not None and ref() is t:
            return True
        base = t._base
        return base is not None and on_host(base)

    for t in allow:
        mark(t)

    def trap(
        mode: Any,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        tensors = _tensors(torch, (args, kwargs))
        read = _read(torch, func, args, kwargs)
        if read and not (tensors and all(on_host(t) for t in tensors)):
            raise HostReadError(
                f"{read} reads a tensor's values on the host (a device synchronisation on "
                "a GPU); keep it out of the step, or pass the host copy it reads as allowed"
            )
        result = func(*args, **kwargs)
        if tensors and all(on_host(t) for t in tensors):
            for out in _tensors(torch, result):
                mark(out)
        return result

    # torch calls the mode's ``__torch_function__`` for every torch call inside the block (the
    # mode itself is off while it runs, so the calls it makes are not trapped).
    mode = type("HostReadTrap", (TorchFunctionMode,), {"__torch_function__": trap})
    with mode():
        yield


def _read(
    torch: Any, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str:
    """What ``func(*args, **kwargs)`` reads on the host, named for the error, or ``""``."""
    name = getattr(func, "__name__", "")
    if name in READS:
        return f"{name}()"
    if name == "to" and any(_names_cpu(a) for a in (*args[1:], kwargs.get("device"))):
        return 'to("cpu")'
    if name == "__getitem__" and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
            return "indexing with a boolean mask"
    return ""


def _names_cpu(value: Any) -> bool:
    """Whether ``value`` names the CPU as a string: code that moves a tensor to another
    tensor's device (``t.to(x.device)``) is the device's business, CPU in CI or not."""
    return isinstance(value, str) and value.split(":", 1)[0] == "cpu"


def _tensors(torch: Any, value: Any) -> list[torch.Tensor]:
    """The tensors in ``value`` (nested tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(torch, v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(torch, v)]
    return []
