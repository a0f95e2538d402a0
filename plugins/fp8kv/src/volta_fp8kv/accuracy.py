"""Accuracy evidence: attention over an FP8 cache versus the same attention over an fp16 cache.

The activations imitate what real decoder layers produce (no model weights are needed to run
it): per-head magnitudes spread over an order of magnitude, a few K channels with outliers 20x
the rest (the massive-activation channels of LLM keys), values with a per-channel mean, a first
"sink" token with large V, and
queries leaning on the keys' outlier channels and scaled so each head's logits spread over a few
units (a peaked softmax, as trained layers have, rather than a flat or one-hot one).

The FP8 side goes through the real kernels (cache write, then gather/dequantize) and the fp16
side stores the same K/V in an fp16 cache; attention of both is computed in float64, so the
measured difference is the cache format's alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from volta_fp8kv.format import CacheFormat, attention_reference
from volta_fp8kv.ops import gather_kv_cache, write_kv_cache
from volta_fp8kv.scales import KVScales, kv_scales


@dataclass(frozen=True)
class Activations:
    """One layer's decode-time tensors: queries ``[Hq, D]``, keys and values ``[T, Hkv, D]``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def realistic_activations(
    num_tokens: int,
    num_kv_heads: int,
    head_size: int,
    *,
    group: int = 4,
    seed: int = 0,
    device: torch.device | str = "cpu",
    outlier_channels: int = 4,
    outlier_gain: float = 20.0,
    logit_std: float = 3.0,
) -> Activations:
    """fp16 Q/K/V with per-head spread, outlier K channels and an attention sink (see module)."""
    gen = torch.Generator().manual_seed(seed)
    head_gain = torch.exp(
        torch.empty(num_kv_heads).uniform_(math.log(0.3), math.log(3.0), generator=gen)
    )
    channel_gain = torch.ones(num_kv_heads, head_size)
    for h in range(num_kv_heads):
        idx = torch.randperm(head_size, generator=gen)[:outlier_channels]
        channel_gain[h, idx] = outlier_gain
    k = (
        torch.randn(num_tokens, num_kv_heads, head_size, generator=gen)
        * channel_gain
        * head_gain[:, None]
    )
    # Values carry a per-channel mean (real V rows are far from zero-mean noise).
    v_mean = torch.randn(num_kv_heads, head_size, generator=gen)
    v = (v_mean + torch.randn(num_tokens, num_kv_heads, head_size, generator=gen)) * head_gain[
        :, None
    ]
    v[0] *= 30.0  # the sink token's values dwarf the rest, as in real layers
    # Queries lean on the keys' outlier channels, then are scaled so each head's logits have a
    # standard deviation of ``logit_std`` (trained layers keep logits in a few units).
    q = torch.randn(num_kv_heads * group, head_size, generator=gen)
    q = q + (channel_gain > 1).repeat_interleave(group, dim=0) * torch.randn(
        num_kv_heads * group, 1, generator=gen
    )
    logits = torch.einsum("hd,thd->ht", q, k.repeat_interleave(group, dim=1)) / math.sqrt(head_size)
    q = q * (logit_std / logits.std(dim=1, keepdim=True))
    to = {"dtype": torch.float16, "device": device}
    return Activations(q.to(**to), k.to(**to), v.to(**to))


def calibrated_scales(acts: Activations, target_max: float) -> KVScales:
    """Per-attention-head scales as a calibrator makes them: ``amax(head) / target_max``.

    ``target_max`` 448 reproduces an llm-compressor e4m3 calibration (what a checkpoint ships).
    """
    k_amax = acts.k.float().abs().amax(dim=(0, 2))
    v_amax = acts.v.float().abs().amax(dim=(0, 2))
    return kv_scales(k_amax / target_max, v_amax / target_max, acts.k.shape[1], acts.k.device)


def _roundtrip(acts: Activations, fmt: CacheFormat, scales: KVScales | None, block_size: int):
    tokens, heads, dim = acts.k.shape
    blocks = -(-tokens // block_size)
    cache = torch.empty(
        (blocks + 1, heads, block_size, 2 * dim), dtype=fmt.storage_dtype, device=acts.k.device
    )
    # Blocks in reverse order: the gather must follow the table, not memory order.
    table = torch.arange(blocks, 0, -1, dtype=torch.int32, device=acts.k.device)
    slots = table.long()[:, None] * block_size + torch.arange(block_size, device=acts.k.device)
    write_kv_cache(acts.k, acts.v, cache, slots.reshape(-1)[:tokens], fmt.value, scales)
    lens = torch.tensor([tokens], dtype=torch.int32, device=acts.k.device)
    return gather_kv_cache(
        cache, table[None, :], lens, fmt.value, dim, scales, out_dtype=torch.float32
    )


def attention_error(
    acts: Activations, fmt: CacheFormat, scales: KVScales | None, *, block_size: int = 16
) -> float:
    """Relative error (float64 norm ratio) of attention over ``fmt`` vs over an fp16 cache."""
    softmax_scale = 1.0 / math.sqrt(acts.q.shape[-1])
    k16, v16 = _roundtrip(acts, CacheFormat.FLOAT16, None, block_size)
    reference = attention_reference(acts.q, k16, v16, softmax_scale)
    k8, v8 = _roundtrip(acts, fmt, scales, block_size)
    out = attention_reference(acts.q, k8, v8, softmax_scale)
    return float((out - reference).norm() / reference.norm())


def error_table(acts: Activations, formats: tuple[CacheFormat, ...]) -> dict[str, float]:
    """The errors the README reports: unit and per-head (e4m3-calibrated) scales per format."""
    per_head = calibrated_scales(acts, 448.0)
    table = {}
    for fmt in formats:
        table[f"{fmt.value}/unit"] = attention_error(acts, fmt, None)
        table[f"{fmt.value}/per_head_e4m3_calibrated"] = attention_error(acts, fmt, per_head)
    return table
