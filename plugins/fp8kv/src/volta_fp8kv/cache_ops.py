"""The packed KV-cache formats' writer, as the host calls it (``volta_kv_cache_ops``).

An attention backend that declares the packed layout gets :func:`write` from
:func:`volta_core.kv_cache_writer` and calls it with vLLM's own tensors: the cache as vLLM
allocated it, the slot mapping of the step (padded past the batch) and the layer's scale
tensors. The engine's step passes ``check_values=False``: then nothing is read back to the host
and nothing is allocated (the layer's scale tensors reach the kernel as they are, and the kernel
forms their reciprocals), so a captured CUDA graph holds the call as one kernel launch.
"""

from __future__ import annotations

import math

import torch

from volta_fp8kv.format import CacheFormat
from volta_fp8kv.ops import (
    KVCacheInputError,
    check_slots,
    check_write,
    constant_scales,
    format_for,
    launch_cache_write,
)
from volta_fp8kv.scales import KVScales

#: What a layer's K or V scale may be: a tensor of one element or one per KV head (any shape
#: that flattens to them), a number, or None for 1.0.
Scale = torch.Tensor | float | None


def _scale(
    scale: Scale, name: str, num_kv_heads: int, device: torch.device
) -> torch.Tensor | float:
    """A number (None is 1.0), checked here since it is on the host already; or a tensor as a
    float32 vector of 1 or ``num_kv_heads`` values on ``device`` (copied there if it lives
    elsewhere; vLLM keeps a layer's scales on its device), its values unread."""
    if scale is None or isinstance(scale, int | float):
        value = 1.0 if scale is None else float(scale)
        if not (math.isfinite(value) and value > 0.0):
            raise KVCacheInputError(
                f"{name} must be finite and positive (the cache stores x / scale), got {value}"
            )
        return value
    if not isinstance(scale, torch.Tensor):
        raise KVCacheInputError(
            f"{name} must be a tensor, a number or None, got {type(scale).__name__}"
        )
    flat = scale.detach().to(device=device, dtype=torch.float32).reshape(-1)
    if flat.numel() not in (1, num_kv_heads):
        raise KVCacheInputError(
            f"{name} has {flat.numel()} values for {num_kv_heads} KV heads: give one value "
            "(per tensor) or one per KV head"
        )
    return flat


def _layer_scales(
    fmt: CacheFormat, k_scale: Scale, v_scale: Scale, num_kv_heads: int, device: torch.device
) -> KVScales:
    if fmt is CacheFormat.FLOAT16:
        return constant_scales(1.0, 1.0, device)
    k = _scale(k_scale, "k_scale", num_kv_heads, device)
    v = _scale(v_scale, "v_scale", num_kv_heads, device)
    if isinstance(k, float) and isinstance(v, float):
        return constant_scales(k, v, device)
    k = constant_scales(k, k, device).k if isinstance(k, float) else k
    v = constant_scales(v, v, device).v if isinstance(v, float) else v
    if k.numel() != v.numel():
        # The kernel reads both through one stride, so a per-tensor side is spelled out per head
        # (a copy, only for a layer that mixes the two granularities).
        k, v = k.expand(num_kv_heads).contiguous(), v.expand(num_kv_heads).contiguous()
    return KVScales(k, v)


def _check_values(scales: KVScales) -> None:
    """Refuse scales that are not finite and positive (reads them back to the host)."""
    for name, tensor in (("k_scale", scales.k), ("v_scale", scales.v)):
        if not bool((torch.isfinite(tensor) & (tensor > 0)).all()):
            raise KVCacheInputError(
                f"{name} must be finite and positive (the cache stores x / scale), got "
                f"{tensor.tolist()}"
            )


def write(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    kv_cache_dtype: str,
    k_scale: Scale = None,
    v_scale: Scale = None,
    check_values: bool = True,
) -> None:
    """Store ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` at ``slot_mapping``.

    ``kv_cache`` is the packed ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` cache:
    float16 for ``float16``; ``uint8`` or the torch FP8 dtype for ``fp8_e5m2``/``fp8_e4m3``.
    Only the first ``num_tokens`` slots are used; negative slots are padding and are skipped.
    FP8 formats store ``fp8(x · (1/scale))`` (:mod:`volta_fp8kv.format`); float16 ignores the
    scales. ``check_values`` also refuses slots past the cache and scales that are not finite
    and positive, which reads them back to the host. Every refusal is one
    :class:`~volta_fp8kv.ops.KVCacheInputError`, raised before anything is written.
    """
    fmt = format_for(kv_cache_dtype)
    cache = check_write(key, value, kv_cache, slot_mapping, fmt)
    num_tokens, num_kv_heads = key.shape[:2]
    scales = _layer_scales(fmt, k_scale, v_scale, num_kv_heads, cache.device)
    if check_values:
        if fmt is not CacheFormat.FLOAT16:
            _check_values(scales)
        check_slots(slot_mapping, num_tokens, cache)
    launch_cache_write(key, value, cache, slot_mapping, fmt, scales)
