"""The device a plan or a resolution is made for.

Kept free of torch: the CLI plans for a V100 on a machine that has no GPU, and the vLLM adapter
builds a :class:`Device` from the capability vLLM reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from volta_core.errors import UsageError

#: First compute capability with hardware e4m3 (fp8e4nv) conversion (Ada, SM89). Below it Triton
#: refuses ``fp8e4nv`` (docs/kernels.md#sm70-facts), so e5m2 is the only FP8 KV format there.
FP8_E4M3_MIN_CAPABILITY: tuple[int, int] = (8, 9)

#: First compute capability with bf16 arithmetic (Ampere). Volta runs fp16.
BF16_MIN_CAPABILITY: tuple[int, int] = (8, 0)

_DEVICE_RE = re.compile(r"^(?:sm_?(?P<sm>\d{2,3})|(?:cuda:)?(?P<major>\d+)\.(?P<minor>\d))$")


@dataclass(frozen=True, order=True)
class Device:
    """A CUDA device, identified by its compute capability ``(major, minor)``."""

    capability: tuple[int, int]
    name: str = ""

    @property
    def sm(self) -> str:
        """The ``sm_XY`` spelling used in messages, for example ``sm_70``."""
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def has_fp8_e4m3(self) -> bool:
        """Whether Triton can convert to and from e4m3 (``fp8e4nv``) on this device."""
        return self.capability >= FP8_E4M3_MIN_CAPABILITY

    @property
    def has_bf16(self) -> bool:
        """Whether the device does bf16 arithmetic (Volta does not: run fp16)."""
        return self.capability >= BF16_MIN_CAPABILITY

    def __str__(self) -> str:
        label = f"{self.sm} (compute capability {self.capability[0]}.{self.capability[1]})"
        return f"{self.name} {label}" if self.name else label


def parse_device(text: str) -> Device:
    """Parse ``sm70``, ``sm_70``, ``7.0`` or ``cuda:7.0`` into a :class:`Device`.

    Raises :class:`UsageError` naming the accepted spellings for anything else.
    """
    match = _DEVICE_RE.match(text.strip().lower())
    if match is None:
        raise UsageError(
            f"unknown device {text!r}: give a CUDA compute capability such as sm70, sm_89 or 9.0"
        )
    if match["sm"] is not None:
        digits = match["sm"]
        major, minor = int(digits[:-1]), int(digits[-1])
    else:
        major, minor = int(match["major"]), int(match["minor"])
    if not 5 <= major <= 12:
        raise UsageError(
            f"unknown device {text!r}: compute capability {major}.{minor} is out of range"
        )
    return Device((major, minor))


#: The project's target: NVIDIA V100.
V100 = Device((7, 0), "Tesla V100")
