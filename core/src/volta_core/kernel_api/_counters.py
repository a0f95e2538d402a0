"""Arrival counters for kernels that reduce their own partial results in one launch.

A split-K GEMV (ct_wna16) and a split-KV decode (attn_v100) both cut one output tile's work
across programs and combine the partials at the end. Doing that in the same launch needs one
int32 counter per output tile: each program stores its partial, increments the counter
(release-acquire, GPU scope), and the program that arrives last reads every partial, writes
the output and sets the counter back to zero. The counters are then all zero again after every
launch, so the next launch on the stream (a CUDA graph replay included) needs no memset.

A split reduction may instead add its partials into fp32 accumulators with atomics
(:func:`zeroed_accumulators`), kept at zero between launches the same way.

One buffer per (device, stream), because launches on one stream run one after another while
launches on two streams may overlap and would count into each other's tiles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Counters a stream's first buffer holds, so model-sized launches never grow it.
MIN_COUNTERS = 4096

#: Buffers by (dtype, device, stream); the last of each list is current.
_BUFFERS: dict[tuple[object, object, int], list[torch.Tensor]] = {}


def _zeroed(device: torch.device, count: int, dtype: torch.dtype) -> torch.Tensor:
    """The current zeroed ``dtype`` buffer of ``device``'s current stream, at least ``count``
    long: a stream whose buffer is shorter gets a new zeroed one, at least twice as large; the
    old ones stay allocated, because a CUDA graph captured with one keeps using it on every
    replay (freed, its memory could be handed to another tensor and be non-zero then)."""
    import torch

    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    buffers = _BUFFERS.setdefault((dtype, device, stream), [])
    if not buffers or buffers[-1].numel() < count:
        size = max(MIN_COUNTERS, count, 2 * buffers[-1].numel() if buffers else 0)
        buffers.append(torch.zeros(size, dtype=dtype, device=device))
    return buffers[-1]


def arrival_counters(device: torch.device, count: int = 0) -> torch.Tensor:
    """The int32 arrival counters (all zero between launches) of ``device``'s current stream
    (see :func:`_zeroed` for how the buffer grows)."""
    import torch

    return _zeroed(device, count, torch.int32)


def zeroed_accumulators(device: torch.device, count: int = 0) -> torch.Tensor:
    """fp32 accumulators (all zero between launches) of ``device``'s current stream, for a
    split reduction that adds its partials atomically into one tile: the program that arrives
    last on the tile's counter reads the sum and writes zeros back, as it resets the counter,
    so the next launch needs no memset either."""
    import torch

    return _zeroed(device, count, torch.float32)
