"""What ``vllm-volta bench`` runs for a plugin's stage: a declaration and the call it names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BenchCase:
    """The call a plugin's kernel makes for a workload on a layer, declared for timing.

    ``stage`` is the stage of the layer's kernel paths the call falls in (the one
    ``volta_kernel_cost`` names for the same workload) and ``kernel`` the kernel the launcher
    runs there, as the plan prints it. ``impl`` names by import path (``package.module:name``)
    the function that makes the call, imported only when the bench command times it::

        impl(layer, quant, work) -> BenchCall

    with the hook's ``layer``, ``quant`` and ``work``.
    """

    stage: str
    kernel: str
    impl: str


@dataclass(frozen=True)
class BenchCall:
    """A call ready to be timed, made by a :class:`BenchCase`'s ``impl``.

    ``make_inputs()`` builds one input set (the call's arguments) on the current CUDA device,
    random data of the layer's shapes; the host calls it several times, so that the sets
    together exceed the L2 cache. ``run(*inputs)`` makes the call as the engine's step does:
    no host synchronisation and no allocation outside torch's allocator, so a CUDA graph can
    capture it. ``bytes_per_set`` is one input set's size on the device, from which the host
    counts the sets and checks that they fit.
    """

    make_inputs: Callable[[], tuple[Any, ...]]
    run: Callable[..., object]
    bytes_per_set: int
