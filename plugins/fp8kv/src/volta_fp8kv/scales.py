"""K and V scales: per-tensor or per-attention-head, from the checkpoint or 1.0, sharded for TP.

A scale ``s`` is a *dequantization* multiplier, as in vLLM: the cache stores ``fp8(x · (1/s))``
and a reader recovers ``x ≈ decode(code) * s`` (see :mod:`volta_fp8kv.format`). Per-attention-head
scales (compressed-tensors ``strategy: attn_head``, vLLM PR #30141) have one entry per KV head;
llm-compressor stores them as ``[num_kv_heads, 1, 1]``.

Scales are checked once, on the host, when they are built (at model load), so the per-step
kernel launches carry no device-to-host synchronisation for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


class KVScaleError(ValueError):
    """A K/V scale that cannot be used: not positive, not finite, or of the wrong shape."""


class TensorParallelError(ValueError):
    """Per-head scales whose KV heads cannot be divided across the tensor-parallel ranks."""


@dataclass(frozen=True)
class KVScales:
    """Validated float32 K and V scales for one layer on one rank.

    ``k`` and ``v`` have shape ``[1]`` (per-tensor) or ``[num_kv_heads]`` (per-head, this
    rank's heads only). Build them with :func:`kv_scales`, :func:`unit_scales` or
    :func:`kv_scales_from_checkpoint`, which validate.
    """

    k: torch.Tensor
    v: torch.Tensor

    @property
    def per_head(self) -> bool:
        return self.k.numel() > 1 or self.v.numel() > 1

    def to(self, device: torch.device | str) -> KVScales:
        return KVScales(self.k.to(device), self.v.to(device))


def unit_scales(device: torch.device | str | None = None) -> KVScales:
    """Scales of 1.0: what a checkpoint without KV scales gets (e5m2 needs none)."""
    one = torch.ones(1, dtype=torch.float32, device=device)
    return KVScales(one, one.clone())


def check_scale(value: object, name: str, num_kv_heads: int) -> torch.Tensor:
    """Return ``value`` as a float32 tensor of shape ``[1]`` or ``[num_kv_heads]``, or raise.

    Accepts a Python number, a 0-d or 1-element tensor (per-tensor), or ``num_kv_heads``
    values in any shape that flattens to them (``[H]``, llm-compressor's ``[H, 1, 1]``).
    """
    tensor = torch.as_tensor(value, dtype=torch.float32).detach()
    if tensor.numel() == 1:
        flat = tensor.reshape(1)
    elif tensor.numel() == num_kv_heads and all(d == 1 for d in tensor.shape if d != num_kv_heads):
        flat = tensor.reshape(num_kv_heads)
    else:
        raise KVScaleError(
            f"{name} has shape {tuple(tensor.shape)}: expected a scalar (per-tensor) or "
            f"{num_kv_heads} values, one per KV head ([{num_kv_heads}] or "
            f"[{num_kv_heads}, 1, 1])"
        )
    host = flat.cpu().tolist()
    bad = [(i, s) for i, s in enumerate(host) if not (math.isfinite(s) and s > 0.0)]
    if bad:
        where = ", ".join(f"head {i}: {s}" for i, s in bad[:4])
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        what = "it is" if flat.numel() == 1 else f"{len(bad)} of {flat.numel()} are"
        shown = f"{host[0]}" if flat.numel() == 1 else f"{where}{more}"
        raise KVScaleError(
            f"{name} must be finite and positive (the cache stores x / scale), but {what} "
            f"not: {shown}"
        )
    return flat.to(tensor.device)


def kv_scales(
    k_scale: object, v_scale: object, num_kv_heads: int, device: torch.device | str | None = None
) -> KVScales:
    """Validate this rank's K and V scales (already sharded) and place them on ``device``."""
    if num_kv_heads < 1:
        raise KVScaleError(f"num_kv_heads must be at least 1, got {num_kv_heads}")
    k = check_scale(k_scale, "k_scale", num_kv_heads)
    v = check_scale(v_scale, "v_scale", num_kv_heads)
    return KVScales(k.to(device), v.to(device))


def shard_per_head(
    scale: torch.Tensor, total_kv_heads: int, tp_size: int, tp_rank: int
) -> torch.Tensor:
    """This rank's slice of a per-head scale of ``[total_kv_heads]``.

    Follows vLLM's KV-head partitioning: with ``total_kv_heads`` a multiple of ``tp_size`` each
    rank holds a contiguous block of heads; with ``tp_size`` a multiple of ``total_kv_heads``
    each head is replicated on ``tp_size / total_kv_heads`` consecutive ranks. Anything else
    cannot be partitioned and is an error naming both numbers.
    """
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise TensorParallelError(f"tp_rank {tp_rank} is not a rank of tp_size {tp_size}")
    flat = scale.reshape(-1)
    if flat.numel() != total_kv_heads:
        raise KVScaleError(
            f"per-head scale has {flat.numel()} values for {total_kv_heads} KV heads"
        )
    if total_kv_heads % tp_size == 0:
        per_rank = total_kv_heads // tp_size
        return flat[tp_rank * per_rank : (tp_rank + 1) * per_rank].clone()
    if tp_size % total_kv_heads == 0:
        replicas = tp_size // total_kv_heads
        head = tp_rank // replicas
        return flat[head : head + 1].clone()
    raise TensorParallelError(
        f"{total_kv_heads} KV heads cannot be divided across {tp_size} tensor-parallel ranks "
        "(neither divides the other), so per-attention-head scales have no per-rank slice; "
        f"use a tensor-parallel size that divides {total_kv_heads} or is a multiple of it"
    )


def kv_scales_from_checkpoint(
    k_scale: object | None,
    v_scale: object | None,
    total_kv_heads: int,
    *,
    tp_size: int = 1,
    tp_rank: int = 0,
    device: torch.device | str | None = None,
) -> KVScales:
    """Scales for one layer on one rank, from the checkpoint's tensors or 1.0 when it has none.

    ``k_scale``/``v_scale`` are what the checkpoint stores for the whole layer: a scalar, or
    ``total_kv_heads`` values that are validated, then sharded with :func:`shard_per_head`.
    A checkpoint with only one of them is an error: half-calibrated caches are not guessed at.
    """
    if (k_scale is None) != (v_scale is None):
        missing = "v_scale" if v_scale is None else "k_scale"
        raise KVScaleError(f"the checkpoint has one of k_scale/v_scale but no {missing}")
    if k_scale is None:
        return unit_scales(device)
    k = check_scale(k_scale, "k_scale", total_kv_heads)
    v = check_scale(v_scale, "v_scale", total_kv_heads)
    if k.numel() > 1 or v.numel() > 1:
        if tp_size < 1 or not 0 <= tp_rank < tp_size:
            raise TensorParallelError(f"tp_rank {tp_rank} is not a rank of tp_size {tp_size}")
        k = shard_per_head(k.expand(total_kv_heads), total_kv_heads, tp_size, tp_rank)
        v = shard_per_head(v.expand(total_kv_heads), total_kv_heads, tp_size, tp_rank)
    return KVScales(k.to(device), v.to(device))
