"""Arrival counters for kernels that reduce their own partial results in one launch.

A split-K GEMV (ct_wna16) and a split-KV decode (attn_v100) both cut one output tile's work
across programs and combine the partials at the end. Doing that in the same launch needs one
int32 counter per output tile: each program stores its partial, increments the counter
(release-acquire, GPU scope), and the program that arrives last reads every partial, writes
the output and sets the counter back to zero. The counters are then all zero again after every
launch, so the next launch on the stream (a CUDA graph replay included) needs no memset.

One buffer per (device, stream), because launches on one stream run one after another while
launches on two streams may overlap and would count into each other's tiles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Counters a stream's first buffer holds, so model-sized launches never grow it.
MIN_COUNTERS = 4096

#: Buffers by (device, stream); the last of each list is current.
_BUFFERS: dict[tuple[object, int], list[torch.Tensor]] = {}


def arrival_counters(device: torch.device, count: int = 0) -> torch.Tensor:
    """The int32 arrival counters (all zero between launches) of ``device``'s current stream.

    A stream whose buffer has fewer than ``count`` counters gets a new zeroed one, at least
    twice as large; the old ones stay allocated, because a CUDA graph captured with one keeps
    using it on every replay (freed, its memory could be handed to another tensor and be
    non-zero then).
    """
    import torch

    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    buffers = _BUFFERS.setdefault((device, stream), [])
    if not buffers or buffers[-1].numel() < count:
        size = max(MIN_COUNTERS, count, 2 * buffers[-1].numel() if buffers else 0)
        buffers.append(torch.zeros(size, dtype=torch.int32, device=device))
    return buffers[-1]
