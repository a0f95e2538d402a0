"""Gather/dequantize: the paged cache of given sequences into contiguous K and V, exactly."""

from __future__ import annotations

import pytest
import torch

from volta_fp8kv.format import CacheFormat, decode_reference
from volta_fp8kv.ops import gather_kv_cache
from volta_fp8kv.scales import kv_scales


def reference_gather(cache, table, lens, head_size_k, fmt, k_scale, v_scale, out_dtype):
    keys, values = [], []
    block_size = cache.shape[2]
    for seq, length in enumerate(lens.tolist()):
        for pos in range(length):
            entry = cache[table[seq, pos // block_size], :, pos % block_size]  # [H, C]
            k, v = entry[:, :head_size_k], entry[:, head_size_k:]
            if fmt is not CacheFormat.FLOAT16:
                k, v = decode_reference(k, k_scale, fmt), decode_reference(v, v_scale, fmt)
            keys.append(k.to(out_dtype))
            values.append(v.to(out_dtype))
    return torch.stack(keys), torch.stack(values)


@pytest.mark.parametrize("fmt", [CacheFormat.FLOAT16, CacheFormat.FP8_E5M2], ids=lambda f: f.value)
@pytest.mark.parametrize("scale_kind", ["none", "per_tensor", "per_head"])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_gather_matches_reference(fmt, scale_kind, out_dtype):
    gen = torch.Generator().manual_seed(sum(map(ord, f"{fmt}{scale_kind}{out_dtype}")))
    num_blocks, heads, block_size, hk, hv = 12, 2, 16, 64, 48
    if fmt is CacheFormat.FLOAT16:
        cache = (torch.randn(num_blocks, heads, block_size, hk + hv, generator=gen) * 30).half()
    else:
        # Every code except NaNs (those are checked bit for bit in test_rounding).
        cache = torch.randint(
            0, 256, (num_blocks, heads, block_size, hk + hv), generator=gen, dtype=torch.uint8
        )
        cache[(cache & 0x7F) > 0x7B] = 0x3C
    lens = torch.tensor([37, 0, 16, 5], dtype=torch.int32)
    table = torch.stack([torch.randperm(num_blocks, generator=gen)[:4] for _ in range(4)]).int()
    scales = {
        "none": None,
        "per_tensor": kv_scales(0.125, 3.0, heads),
        "per_head": kv_scales(torch.tensor([0.5, 0.01]), torch.tensor([2.0, 1 / 3]), heads),
    }[scale_kind]
    one = torch.ones(1)
    want_k, want_v = reference_gather(
        cache,
        table,
        lens,
        hk,
        fmt,
        scales.k if scales else one,
        scales.v if scales else one,
        out_dtype,
    )
    key, value = gather_kv_cache(cache, table, lens, fmt.value, hk, scales, out_dtype=out_dtype)
    assert key.shape == (58, heads, hk)
    assert value.shape == (58, heads, hv)
    assert torch.equal(key, want_k)
    assert torch.equal(value, want_v)


def test_gather_follows_strided_layouts_and_max_seq_len():
    """A cache whose physical order puts tokens before heads, and a grid sized by max_seq_len."""
    raw = torch.randint(0, 0x7B, (6, 16, 2, 128), dtype=torch.uint8)
    cache = raw.permute(0, 2, 1, 3)
    table = torch.tensor([[5, 1, 3], [0, 2, 4]], dtype=torch.int32)
    lens = torch.tensor([40, 17], dtype=torch.int32)
    key, value = gather_kv_cache(cache, table, lens, "fp8_e5m2", 64, max_seq_len=48)
    want_k, want_v = reference_gather(
        cache,
        table,
        lens,
        64,
        CacheFormat.FP8_E5M2,
        torch.ones(1),
        torch.ones(1),
        torch.float16,
    )
    assert torch.equal(key, want_k)
    assert torch.equal(value, want_v)


def test_no_sequences_gives_empty_outputs():
    cache = torch.zeros(2, 1, 16, 128, dtype=torch.uint8)
    key, value = gather_kv_cache(
        cache,
        torch.zeros(0, 2, dtype=torch.int32),
        torch.zeros(0, dtype=torch.int32),
        "fp8_e5m2",
        64,
    )
    assert key.shape == (0, 1, 64)
    assert value.shape == (0, 1, 64)
