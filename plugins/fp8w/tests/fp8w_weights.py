"""Random layers for the kernel tests: every finite e4m3fn code alike, fresh per seed."""

from __future__ import annotations

import torch

from volta_fp8w.layout import Fp8Weights, block_weights, channel_weights


def random_layer(
    n: int,
    k: int,
    block: tuple[int, int] | None,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> Fp8Weights:
    """Fresh random e4m3fn codes (every finite code alike) and scales ``2**U(-6, -2)``: a
    block-quantized layer of ``block`` scales, or channel-wise (None)."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (n, k), generator=gen, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] -= 1  # no NaN codes: S.1111.110, the largest finite
    if block is None:
        scale = 2.0 ** (torch.rand(n, 1, generator=gen) * 4 - 6)
        return channel_weights("t", codes.to(device), scale.to(device), n, k)
    shape = (-(-n // block[0]), -(-k // block[1]))
    scale = 2.0 ** (torch.rand(shape, generator=gen) * 4 - 6)
    return block_weights("t", codes.to(device), scale.to(device), n, k, block)
