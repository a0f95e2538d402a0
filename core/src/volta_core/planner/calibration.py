"""Per-device calibrations: a device's measured bandwidth and arithmetic rates, as data.

The speed estimate prices each kernel's bytes and FLOPs at a device's rates; without a
calibration those are the V100 whitepaper's (:data:`~volta_core.kernel_api.V100_RATES`). A
``vllm-volta bench`` report's ``calibration`` entry (copy bandwidth, fp16 cuBLAS and fp32 FMA
rates measured on the owner's GPU) is added as it is to ``calibrations.json`` beside this
module, keyed by the GPU's name as the driver reports it, with the report it came from as its
``source``; ``vllm-volta plan --calibration NAME`` then prices with it and says so. Adding a
device is a data change, no code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from volta_core.errors import UsageError

#: The table's file in this package.
TABLE = "calibrations.json"

#: The fields of an entry, each a number but ``device`` and ``source``.
FIELDS = ("device", "bandwidth_gbps", "tensor_tflops", "fma_tflops", "source")


@dataclass(frozen=True)
class Calibration:
    """One device's measured rates: copy bandwidth (GB/s, bytes both ways), fp16 tensor-core
    and fp32 FMA matmul rates (TFLOP/s), and the report they come from."""

    device: str
    bandwidth_gbps: float
    tensor_tflops: float
    fma_tflops: float
    source: str

    @property
    def label(self) -> str:
        """How the plan names it: the device and its source."""
        return f"{self.device} ({self.source})"


def parse_table(raw: Any) -> dict[str, Calibration]:
    """The entries of a table (``{"devices": [entry, ...]}``) by device name; a malformed
    entry is a :class:`ValueError` naming it and what is wrong."""
    entries = raw.get("devices") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{TABLE} must be an object with a 'devices' list")
    table: dict[str, Calibration] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or sorted(entry) != sorted(FIELDS):
            raise ValueError(f"{TABLE} entry {i} must have exactly the fields {', '.join(FIELDS)}")
        texts = (entry["device"], entry["source"])
        numbers = [entry[f] for f in FIELDS[1:4]]
        if not all(isinstance(t, str) and t for t in texts) or not all(
            isinstance(n, int | float) and not isinstance(n, bool) and n > 0 for n in numbers
        ):
            raise ValueError(
                f"{TABLE} entry {i}: device and source are text, the rates positive numbers"
            )
        if entry["device"] in table:
            raise ValueError(f"{TABLE} names {entry['device']!r} twice")
        device, source = texts
        bandwidth, tensor, fma = (float(n) for n in numbers)
        table[device] = Calibration(device, bandwidth, tensor, fma, source)
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
