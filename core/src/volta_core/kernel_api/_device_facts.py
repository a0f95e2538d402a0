"""The compute capability and SM count a kernel launch is planned for."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch


class DeviceFacts(NamedTuple):
    """What launch choices depend on: the compute capability and the number of SMs."""

    capability: tuple[int, int]
    sm_count: int


#: What a launch on a CPU tensor (Triton's interpreter) is planned for: a V100 (SXM2, 80 SMs),
#: so the interpreter runs the SM70 configurations the project ships.
INTERPRETER_FACTS = DeviceFacts((7, 0), 80)


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _cuda_facts(index: int) -> DeviceFacts:
    """Asked once per device and process: every launch needs them and they do not change."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return DeviceFacts((props.major, props.minor), props.multi_processor_count)


def device_facts(device: torch.device) -> DeviceFacts:
    """The facts of a CUDA ``device`` (its current device when it has no index), or
    :data:`INTERPRETER_FACTS` for any other device."""
    if device.type != "cuda":
        return INTERPRETER_FACTS
    import torch

    return _cuda_facts(device.index if device.index is not None else torch.cuda.current_device())
