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
from dataclasses import dataclass

import torch

from volta_fp8kv.format import CacheFormat
from volta_fp8kv.ops import (
    CacheLaunch,
    KVCacheInputError,
    cache_launch,
    check_slots,
    check_step,
    check_write,
    constant_scales,
    format_for,
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

    A layer's cache, format and scale tensors are the same at every step: what follows from
    them alone (the cache's storage view and checks, the scales as the kernel takes them) is
    worked out once and kept on the cache tensor (:class:`_LayerWrite`).
    """
    layer: _LayerWrite | None = getattr(kv_cache, _LAYER, None)
    if layer is not None and layer.serves(kv_cache_dtype, k_scale, v_scale, key, value):
        check_step(key, value, slot_mapping, layer.fmt, layer.device)
    else:
        fmt = format_for(kv_cache_dtype)
        cache = check_write(key, value, kv_cache, slot_mapping, fmt)
        scales = _layer_scales(fmt, k_scale, v_scale, key.shape[1], cache.device)
        launch = cache_launch(cache, fmt, scales, key.shape[2], value.shape[2])
        layer = _LayerWrite(
            kv_cache_dtype, fmt, k_scale, v_scale, key.shape[1:], value.shape[2], cache.device,
            launch,
        )  # fmt: skip
        if _aliases(k_scale, scales.k) and _aliases(v_scale, scales.v):
            setattr(kv_cache, _LAYER, layer)
    if check_values:
        if layer.fmt is not CacheFormat.FLOAT16:
            _check_values(layer.launch.scales)
        check_slots(slot_mapping, key.shape[0], layer.launch.cache)
    layer.launch.run(key, value, slot_mapping)


#: The Python attribute of a layer's cache tensor that holds its :class:`_LayerWrite` (vLLM
#: keeps a tensor's own facts on it the same way, ``set_weight_attrs``), so it lives and dies
#: with the cache.
_LAYER = "_fp8kv_write"


@dataclass(frozen=True)
class _LayerWrite:
    """A layer's write as :func:`write` made it: the arguments it was made for and the launch
    (:class:`~volta_fp8kv.ops.CacheLaunch`) they give."""

    kv_cache_dtype: str
    fmt: CacheFormat
    k_scale: Scale
    v_scale: Scale
    heads: tuple[int, ...]
    head_size_v: int
    device: torch.device
    launch: CacheLaunch

    def serves(
        self,
        kv_cache_dtype: str,
        k_scale: Scale,
        v_scale: Scale,
        key: torch.Tensor,
        value: torch.Tensor,
    ) -> bool:
        """Whether a call with these arguments (on the same cache) makes the same launch."""
        return (
            kv_cache_dtype == self.kv_cache_dtype
            and _same(k_scale, self.k_scale)
            and _same(v_scale, self.v_scale)
            and key.shape[1:] == self.heads
            and value.shape[2:] == (self.head_size_v,)
        )


def _same(a: Scale, b: Scale) -> bool:
    """The same scale tensor, or equal numbers (None included)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    return a == b


def _aliases(scale: Scale, made: torch.Tensor) -> bool:
    """Whether the kernel's scale ``made`` reads ``scale`` itself (a number, or a tensor that
    needed no copy), so a later in-place change of the layer's scale reaches it: only then is
    a layer's write kept."""
    return not isinstance(scale, torch.Tensor) or made.data_ptr() == scale.data_ptr()
