"""Per-device calibrations: a device's measured rates and kernels' ratios, as data.

The speed estimate prices each kernel's bytes and FLOPs at a device's rates; without a
calibration those are the V100 whitepaper's (:data:`~volta_core.kernel_api.V100_RATES`). A
``vllm-volta bench`` report's ``calibration`` entry is added as it is to ``calibrations.json``
beside this module, keyed by the GPU's name as the driver reports it, with the report it came
from as its ``source``: the copy bandwidth, fp16 cuBLAS and fp32 FMA rates measured on the
owner's GPU and, optionally (entries from before bench reported them have none), ``ratios``:
per kernel :class:`Family`, the median of measured time over the estimate at those rates and
the number of timed calls it is the median of. ``vllm-volta plan --calibration NAME`` then
prices with the rates, multiplies the plugins' kernels of each family that has a ratio by it,
and says so. Adding a device is a data change, no code.

The families are defined here, the lowest layer both the bench (which judges each family) and
the estimate (which scales it) import, with the rules that give a kernel its family
(:func:`attention_family`, :func:`module_family`), so that a ratio measured for a family scales
exactly the work the bench timed under that name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import Enum
from importlib import resources
from typing import Any

from volta_core.errors import UsageError
from volta_core.host.types import LayerKind

#: The table's file in this package.
TABLE = "calibrations.json"

#: The fields every entry has, each a number but ``device`` and ``source``.
FIELDS = ("device", "bandwidth_gbps", "tensor_tflops", "fma_tflops", "source")

#: The field an entry may have besides :data:`FIELDS`: its per-family ratios.
RATIOS = "ratios"

#: The fields of each family's ratio in an entry's :data:`RATIOS`.
RATIO_FIELDS = ("median_ratio", "calls")


class Family(str, Enum):
    """The kernel families a bench verdict is given for and a calibration's ratio scales."""

    ATTENTION_DECODE = "attention decode"
    ATTENTION_PREFILL = "attention prefill"
    LINEAR = "linear"
    MOE = "MoE experts"
    KV_WRITE = "KV-cache write"


def attention_family(stage: str) -> Family | None:
    """The family of an attention layer's kernel in ``stage`` (a kernel path's stage, or a
    cost's): by the stage name's first word, ``prefill`` or ``decode`` (the attention
    plugins' stages, ``"prefill"``, ``"decode, 1-4 query tokens"``); None for any other name,
    which the bench chooses no workload for, so no ratio judges it."""
    if stage.startswith("prefill"):
        return Family.ATTENTION_PREFILL
    if stage.startswith("decode"):
        return Family.ATTENTION_DECODE
    return None


def module_family(kind: LayerKind) -> Family:
    """The family of a quant method's module of ``kind``: fused experts run the MoE kernels,
    every other module a linear layer's."""
    return Family.MOE if kind is LayerKind.FUSED_MOE else Family.LINEAR


@dataclass(frozen=True)
class FamilyRatio:
    """A family's median of measured time over the estimate, from ``calls`` timed calls."""

    family: Family
    median_ratio: float
    calls: int

    @property
    def label(self) -> str:
        """How the plan names it: ``linear x1.94 (12 calls)``."""
        return f"{self.family.value} x{self.median_ratio:.2f} ({self.calls} calls)"


@dataclass(frozen=True)
class Calibration:
    """One device's measured rates: copy bandwidth (GB/s, bytes both ways), fp16 tensor-core
    and fp32 FMA matmul rates (TFLOP/s), the report they come from, and its per-family ratios
    (in :class:`Family` order; none for an entry without them)."""

    device: str
    bandwidth_gbps: float
    tensor_tflops: float
    fma_tflops: float
    source: str
    ratios: tuple[FamilyRatio, ...] = ()

    @property
    def label(self) -> str:
        """How the plan names it: the device and its source."""
        return f"{self.device} ({self.source})"


def _positive(value: Any) -> bool:
    """A finite number above zero (JSON's ``true`` is not a number; ``NaN`` and ``Infinity``,
    which Python's reader accepts, are no measurement)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _ratios(raw: Any, where: str) -> tuple[FamilyRatio, ...]:
    """An entry's ``ratios`` (``{family: {"median_ratio": r, "calls": n}}``), in
    :class:`Family` order; a :class:`ValueError` starting with ``where`` (the entry) and
    saying what is wrong otherwise."""
    known = {f.value: f for f in Family}
    names = ", ".join(known)
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: ratios: must be an object by family ({names})")
    ratios: dict[Family, FamilyRatio] = {}
    for name, value in raw.items():
        family = known.get(name)
        if family is None:
            raise ValueError(f"{where}: ratios: unknown family {name!r} (families: {names})")
        if not isinstance(value, dict) or sorted(value) != sorted(RATIO_FIELDS):
            raise ValueError(
                f"{where}: ratios: {name!r} must have exactly the fields {', '.join(RATIO_FIELDS)}"
            )
        ratio, calls = value["median_ratio"], value["calls"]
        if not _positive(ratio):
            raise ValueError(
                f"{where}: ratios: {name!r} median_ratio must be a positive number, not {ratio!r}"
            )
        if not (isinstance(calls, int) and not isinstance(calls, bool) and calls > 0):
            raise ValueError(
                f"{where}: ratios: {name!r} calls must be a positive whole number, not {calls!r}"
            )
        ratios[family] = FamilyRatio(family, float(ratio), calls)
    return tuple(ratios[f] for f in Family if f in ratios)


def parse_table(raw: Any) -> dict[str, Calibration]:
    """The entries of a table (``{"devices": [entry, ...]}``) by device name; a malformed
    entry is a :class:`ValueError` naming it and what is wrong."""
    entries = raw.get("devices") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{TABLE} must be an object with a 'devices' list")
    table: dict[str, Calibration] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or sorted(set(entry) - {RATIOS}) != sorted(FIELDS):
            raise ValueError(
                f"{TABLE} entry {i} must have exactly the fields {', '.join(FIELDS)} "
                f"(and optionally {RATIOS})"
            )
        texts = (entry["device"], entry["source"])
        numbers = [entry[f] for f in FIELDS[1:4]]
        if not all(isinstance(t, str) and t for t in texts) or not all(map(_positive, numbers)):
            raise ValueError(
                f"{TABLE} entry {i}: device and source are text, the rates positive numbers"
            )
        device, source = texts
        if device in table:
            raise ValueError(f"{TABLE} names {device!r} twice")
        ratios = _ratios(entry[RATIOS], f"{TABLE} entry {i} ({device})") if RATIOS in entry else ()
        bandwidth, tensor, fma = (float(n) for n in numbers)
        table[device] = Calibration(device, bandwidth, tensor, fma, source, ratios)
    return table


def calibrations() -> dict[str, Calibration]:
    """The bundled table, by device name."""
    text = resources.files("volta_core.planner").joinpath(TABLE).read_text(encoding="utf-8")
    return parse_table(json.loads(text))


def calibration_for(device: str, table: dict[str, Calibration] | None = None) -> Calibration:
    """The calibration of ``device`` (a name in the table); :class:`UsageError` naming the
    devices measured so far otherwise."""
    table = calibrations() if table is None else table
    if device not in table:
        known = ", ".join(sorted(table)) or "none yet: share a vllm-volta bench report"
        raise UsageError(f"no calibration for {device!r} (measured devices: {known})")
    return table[device]
