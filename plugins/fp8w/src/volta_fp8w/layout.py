"""From checkpoint tensors to the kernels' layout, with every check done before any launch.

The kernels read one layout whatever the checkpoint's scheme: ``weight`` uint8 ``[n, k]``, the
e4m3fn bit patterns of the checkpoint's ``float8_e4m3fn`` tensor (rows contiguous, as stored), and
``scales`` float32 ``[ceil(n / block_n), ceil(k / block_k)]``, so that

    W[i, j] = e4m3(weight[i, j]) * scales[i // block_n, j // block_k].

A block-quantized checkpoint (``weight_block_size`` / ``block_structure``) keeps its blocks; a
channel-wise one is ``block_n = 1`` with one block spanning the input (``block_k`` rounded up to
:data:`CHANNEL_BLOCK_K` so every kernel tile divides it); a per-tensor one (one scale per
checkpoint shard: a merged QKV or gate/up layer holds two or three) is expanded to one scale per
row of its shard. Every failure raises :class:`WeightFormatError` naming the layer and the tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from volta_fp8w.limits import BLOCK_K_QUANTUM

#: A channel-wise layer's ``block_k`` is its input length rounded up to this (a multiple of
#: every kernel's input tile, so the one scale column serves each tile).
CHANNEL_BLOCK_K = 128

#: The dtypes a checkpoint's scales may have.
SCALE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: The two e4m3fn codes that are NaN (``S.1111.111``): no finite weight has them.
NAN_CODES = (0x7F, 0xFF)


class WeightFormatError(ValueError):
    """A checkpoint tensor that does not match its layer's scheme or shape."""


@dataclass(frozen=True)
class Fp8Weights:
    """One layer's weights in the kernels' layout (per tensor-parallel rank); see the module."""

    weight: torch.Tensor
    scales: torch.Tensor
    n: int
    k: int
    block_n: int
    block_k: int

    def nbytes(self) -> int:
        """Bytes a kernel reads for the weights: one per weight, four per scale."""
        return self.weight.numel() + self.scales.numel() * 4

    def dequantize(self) -> torch.Tensor:
        """``W`` in float32 (tests and references; not on the serving path)."""
        w = self.weight.view(torch.float8_e4m3fn).float()
        rows = torch.arange(self.n, device=w.device) // self.block_n
        cols = torch.arange(self.k, device=w.device) // self.block_k
        return w * self.scales[rows][:, cols]


def channel_block_k(k: int) -> int:
    """The ``block_k`` of a channel-wise layer with ``k`` inputs (:data:`CHANNEL_BLOCK_K`)."""
    return -(-k // CHANNEL_BLOCK_K) * CHANNEL_BLOCK_K


def check_block(name: str, block: tuple[int, int]) -> None:
    """A block shape the kernels take: positive, its input length a multiple of
    :data:`~volta_fp8w.limits.BLOCK_K_QUANTUM`."""
    block_n, block_k = block
    if block_n < 1 or block_k < 1 or block_k % BLOCK_K_QUANTUM:
        raise WeightFormatError(
            f"layer {name}: weight block {block_n}x{block_k} is not run here: the input length of "
            f"a block must be a positive multiple of {BLOCK_K_QUANTUM}"
        )


def as_codes(name: str, weight: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The checkpoint's e4m3fn weight ``[n, k]`` as contiguous uint8 codes, refusing another dtype
    (e5m2 weights), another shape, or NaN codes."""
    if weight.dtype == torch.float8_e5m2:
        raise WeightFormatError(
            f"layer {name}: tensor 'weight' is float8_e5m2; fp8w runs e4m3fn weights only"
        )
    if weight.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise WeightFormatError(
            f"layer {name}: tensor 'weight' is {weight.dtype}, expected float8_e4m3fn"
        )
    if tuple(weight.shape) != (n, k):
        raise WeightFormatError(
            f"layer {name}: tensor 'weight' has shape {tuple(weight.shape)}, expected {(n, k)}"
        )
    codes = weight.contiguous().view(torch.uint8)
    nan = (codes & 0x7F) == 0x7F
    if bool(nan.any()):
        where = tuple(int(i) for i in nan.nonzero()[0])
        raise WeightFormatError(
            f"layer {name}: tensor 'weight' holds {int(nan.sum())} NaN code(s), first at {where}"
        )
    return codes


def check_scales(name: str, tensor: str, scales: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Scales of the expected shape and dtype, every one finite and positive."""
    if scales.dtype not in SCALE_DTYPES:
        raise WeightFormatError(
            f"layer {name}: tensor {tensor!r} is {scales.dtype}, expected one of "
            f"{', '.join(str(d) for d in SCALE_DTYPES)}"
        )
    if tuple(scales.shape) != shape:
        raise WeightFormatError(
            f"layer {name}: tensor {tensor!r} has shape {tuple(scales.shape)}, expected {shape}"
        )
    values = scales.float()
    bad = ~(torch.isfinite(values) & (values > 0))
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise WeightFormatError(
            f"layer {name}: tensor {tensor!r} holds {int(bad.sum())} scale(s) that are not finite "
            f"and positive, first at {first}: {float(values[first])}"
        )


def block_weights(
    name: str,
    weight: torch.Tensor,
    scale: torch.Tensor,
    n: int,
    k: int,
    block: tuple[int, int],
    tensor: str = "weight_scale_inv",
) -> Fp8Weights:
    """A block-quantized layer: ``scale`` ``[ceil(n / block_n), ceil(k / block_k)]``."""
    check_block(name, block)
    block_n, block_k = block
    codes = as_codes(name, weight, n, k)
    check_scales(name, tensor, scale, (-(-n // block_n), -(-k // block_k)))
    return Fp8Weights(codes, scale.float().contiguous(), n, k, block_n, block_k)


def channel_weights(
    name: str, weight: torch.Tensor, scale: torch.Tensor, n: int, k: int
) -> Fp8Weights:
    """A channel-wise layer: ``scale`` ``[n, 1]`` (or ``[n]``), one per output row."""
    codes = as_codes(name, weight, n, k)
    check_scales(name, "weight_scale", scale.reshape(-1, 1) if scale.dim() == 1 else scale, (n, 1))
    scales = scale.float().reshape(n, 1).contiguous()
    return Fp8Weights(codes, scales, n, k, 1, channel_block_k(k))


def tensor_weights(
    name: str, weight: torch.Tensor, scale: torch.Tensor, n: int, k: int, shards: Sequence[int]
) -> Fp8Weights:
    """A per-tensor layer: ``scale`` holds one value per checkpoint shard (``shards`` their row
    counts, summing to ``n``), expanded to one scale per row."""
    if sum(shards) != n:
        raise WeightFormatError(f"layer {name}: shard rows {list(shards)} do not sum to {n}")
    flat = scale.reshape(-1)
    check_scales(name, "weight_scale", flat, (len(shards),))
    rows = torch.repeat_interleave(
        flat.float(), torch.tensor(list(shards), device=flat.device)
    ).reshape(n, 1)
    return Fp8Weights(as_codes(name, weight, n, k), rows.contiguous(), n, k, 1, channel_block_k(k))
