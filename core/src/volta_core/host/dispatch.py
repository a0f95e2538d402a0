"""The dispatch contract: which kernel runs a call on a device family, and what it costs.

Plugins import it from :mod:`volta_core.kernel_api`; the host's plan and estimate from here.

Each kernel plugin answers three questions in one module of its own (its ``dispatch``), and
everything that needs an answer reads that module:

* for a call (its shapes, dtypes, token count, query length) on a device family, *the* launch:
  a :class:`Choice` naming the kernel, the unit its arithmetic runs on and the launch's
  parameters; a CUDA build compiled at first use by NVRTC carries the Triton choice that
  serves where the build cannot load (``fallback``). The runtime launcher calls it per call;
* every launch the plugin ships for a device family: what the compile gates compile;
* what a launch costs (:class:`KernelCost`): bytes read and written, floating-point operations,
  the unit they run on, launch by launch; the plan's speed estimate reads it through the
  ``volta_kernel_cost`` hook (:class:`StageCost`), and the plugin's own choices between two
  kernels compare the same costs at the same device rates (:data:`V100_RATES`).

The plan's per-layer kernel paths (:class:`volta_core.KernelPath`) are made from the same
choices (:func:`kernel_paths`), so what the plan prints, what the estimate prices and what the
launcher runs are one answer. Torch- and triton-free: the ``vllm-volta`` command imports it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from volta_core.host.types import KernelPath


class Unit(str, Enum):
    """Where a kernel's products run: Volta's tensor cores (``HMMA``: cuBLAS and the plugins'
    CUDA ``mma.m8n8k4`` kernels) or the fp32 FMA units (Triton's ``tl.dot`` on SM70 since
    triton-lang/triton#5066, and every GEMV)."""

    TENSOR_CORES = "tensor cores"
    FMA = "FMA"


@dataclass(frozen=True)
class DeviceRates:
    """A device's memory bandwidth and its arithmetic rate on each :class:`Unit` (per second)."""

    name: str
    bandwidth: float
    tensor_flops: float
    fma_flops: float

    def rate(self, unit: Unit) -> float:
        return self.tensor_flops if unit is Unit.TENSOR_CORES else self.fma_flops


#: V100 SXM2, from NVIDIA's Tesla V100 GPU Architecture whitepaper: 900 GB/s HBM2, 125 TFLOP/s
#: fp16 on tensor cores, 15.7 TFLOP/s fp32 FMA. The one statement of these rates: the plugins'
#: choices and the plan's estimate both read it.
V100_RATES = DeviceRates("V100 SXM2", 900e9, 125e12, 15.7e12)


@dataclass(frozen=True)
class LaunchCost:
    """One launch's traffic and arithmetic: its time on a device is the larger of its bytes
    at the bandwidth and its FLOPs at its unit's rate (a roofline)."""

    bytes_read: int
    bytes_written: int
    flops: int
    unit: Unit

    def seconds(self, rates: DeviceRates) -> float:
        memory = (self.bytes_read + self.bytes_written) / rates.bandwidth
        return max(memory, self.flops / rates.rate(self.unit))

    def bound(self, rates: DeviceRates) -> str:
        """``"HBM"`` where the bytes take longer than the arithmetic, else the unit's name."""
        memory = (self.bytes_read + self.bytes_written) / rates.bandwidth
        return "HBM" if memory >= self.flops / rates.rate(self.unit) else self.unit.value


@dataclass(frozen=True)
class KernelCost:
    """What one call costs on the kernel that runs it: its launches, one after another."""

    kernel: str
    launches: tuple[LaunchCost, ...]

    def __post_init__(self) -> None:
        if not self.launches:
            raise ValueError(f"a kernel cost has at least one launch: {self.kernel!r}")

    @property
    def unit(self) -> Unit:
        """The unit of the launch that runs the most arithmetic (the first on a tie)."""
        return max(self.launches, key=lambda launch: launch.flops).unit

    @property
    def bytes(self) -> int:
        return sum(launch.bytes_read + launch.bytes_written for launch in self.launches)

    @property
    def flops(self) -> int:
        return sum(launch.flops for launch in self.launches)

    def seconds(self, rates: DeviceRates = V100_RATES) -> float:
        return sum(launch.seconds(rates) for launch in self.launches)

    def bound(self, rates: DeviceRates = V100_RATES) -> str:
        """What bounds the longest launch (:meth:`LaunchCost.bound`)."""
        return max(self.launches, key=lambda launch: launch.seconds(rates)).bound(rates)


@dataclass(frozen=True)
class Workload:
    """One step's work on a layer: ``sequences`` sequences of ``query_len`` new tokens each;
    an attention layer's queries also read ``context`` tokens of cache per sequence."""

    sequences: int
    query_len: int = 1
    context: int = 0

    def __post_init__(self) -> None:
        if self.sequences < 1 or self.query_len < 1 or self.context < 0:
            raise ValueError(f"a workload has sequences and query tokens, context >= 0: {self}")

    @property
    def tokens(self) -> int:
        return self.sequences * self.query_len


@dataclass(frozen=True)
class StageCost:
    """A workload's cost on a layer, by the plugin that serves it: the ``stage`` of the
    layer's :class:`~volta_core.KernelPath` list the workload falls in, the cost of the kernel
    chosen there and, where that kernel needs NVRTC, of the fallback serving without it."""

    stage: str
    cost: KernelCost
    fallback: KernelCost | None = None

    def serving(self, nvrtc: bool) -> KernelCost:
        """The cost of what runs: the chosen kernel, or its fallback where NVRTC is missing."""
        return self.cost if nvrtc or self.fallback is None else self.fallback


L = TypeVar("L")


@dataclass(frozen=True)
class Choice(Generic[L]):
    """The launch a call gets on a device family: the kernel's name as plans print it, the unit
    its products run on and the launch itself. A CUDA build compiled by NVRTC names the Triton
    choice that serves where the build does not load (``fallback``)."""

    kernel: str
    unit: Unit
    launch: L
    fallback: Choice[L] | None = None

    @property
    def needs_nvrtc(self) -> bool:
        return self.fallback is not None

    def path(self, stage: str) -> KernelPath:
        """This choice as the plan prints it for ``stage``."""
        if self.fallback is None:
            return KernelPath(stage, self.kernel, unit=self.unit.value)
        return KernelPath(
            stage,
            self.kernel,
            needs_nvrtc=True,
            fallback=self.fallback.kernel,
            unit=self.unit.value,
            fallback_unit=self.fallback.unit.value,
        )

    def same_kernels(self, other: Choice[L]) -> bool:
        """Whether ``other`` runs the same kernel on the same unit, with the same fallback:
        two token counts with the same kernels share a stage of the plan."""
        mine = (self.kernel, self.unit, self.fallback and self.fallback.kernel)
        return mine == (other.kernel, other.unit, other.fallback and other.fallback.kernel)


def token_stage(first: int, last: int | None, noun: str = "token") -> str:
    """A stage named by a range of counts: ``"1 token"``, ``"2-4 tokens"``, ``"257+ tokens"``."""
    plural = f"{noun}s"
    if last is None:
        return f"{first}+ {plural}"
    if first == last:
        return f"{first} {plural if first > 1 else noun}"
    return f"{first}-{last} {plural}"


def stage_ranges(
    counts: Iterable[int], choose: Callable[[int], Choice[L]], open_ended: bool = False
) -> list[tuple[int, int | None, Choice[L]]]:
    """``counts`` (increasing, consecutive) grouped into runs with the same kernels
    (:meth:`Choice.same_kernels`): ``(first, last, choice)`` per run, the last run's ``last``
    None where ``open_ended`` (the choice no longer changes past the last count)."""
    runs: list[tuple[int, int | None, Choice[L]]] = []
    values = list(counts)
    first = values[0]
    chosen = choose(first)
    for previous, count in itertools.pairwise(values):
        nxt = choose(count)
        if not nxt.same_kernels(chosen):
            runs.append((first, previous, chosen))
            first, chosen = count, nxt
    runs.append((first, None if open_ended else values[-1], chosen))
    return runs


def stage_of(count: int, runs: Iterable[tuple[int, int | None, Choice[L]]]) -> int:
    """The index of the run of :func:`stage_ranges` that holds ``count``."""
    for index, (first, last, _) in enumerate(runs):
        if first <= count and (last is None or count <= last):
            return index
    raise ValueError(f"{count} lies in none of the stages")


def kernel_paths(
    runs: Iterable[tuple[int, int | None, Choice[L]]], name: Callable[[int, int | None], str]
) -> list[KernelPath]:
    """One :class:`~volta_core.KernelPath` per run of :func:`stage_ranges`, named by ``name``."""
    return [choice.path(name(first, last)) for first, last, choice in runs]
