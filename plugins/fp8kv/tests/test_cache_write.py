"""Cache write into vLLM's paged layout: every written entry exact, every other byte untouched."""

from __future__ import annotations

import pytest
import torch

from volta_fp8kv.format import CacheFormat, CacheGeometry, encode_reference
from volta_fp8kv.ops import write_kv_cache
from volta_fp8kv.scales import kv_scales

FORMATS = [CacheFormat.FLOAT16, CacheFormat.FP8_E5M2]


def poisoned_cache(geometry: CacheGeometry, fmt: CacheFormat, physical: str) -> torch.Tensor:
    """A cache full of garbage, in logical order [B, H, N, C] over a chosen physical order."""
    b, h, n, c = geometry.shape
    if physical == "BHNC":
        raw = torch.empty(b, h, n, c, dtype=fmt.storage_dtype)
        view = raw
    else:  # vLLM's other common physical order: tokens before heads within a block
        raw = torch.empty(b, n, h, c, dtype=fmt.storage_dtype)
        view = raw.permute(0, 2, 1, 3)
    if fmt is CacheFormat.FLOAT16:
        raw.copy_(torch.randn(raw.shape) * 1e4)
    else:
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
    return view


def expected_cache(cache, key, value, slots, fmt, k_scale, v_scale):
    """The poisoned cache with exactly the valid tokens written, computed with torch."""
    out = cache.clone()
    block_size, head_size_k = cache.shape[2], key.shape[2]
    if fmt is CacheFormat.FLOAT16:
        k_rows, v_rows = key, value
    else:
        k_rows = encode_reference(key, k_scale, fmt)
        v_rows = encode_reference(value, v_scale, fmt)
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        out[slot // block_size, :, slot % block_size, :head_size_k] = k_rows[t]
        out[slot // block_size, :, slot % block_size, head_size_k:] = v_rows[t]
    return out


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.value)
@pytest.mark.parametrize("scale_kind", ["none", "per_tensor", "per_head"])
@pytest.mark.parametrize(
    ("head_size_k", "head_size_v", "physical"),
    [(64, 64, "BHNC"), (80, 80, "BNHC"), (64, 32, "BHNC")],
    ids=["64-BHNC", "80-BNHC", "k64v32-BHNC"],
)
def test_paged_write_matches_reference(fmt, scale_kind, head_size_k, head_size_v, physical):
    gen = torch.Generator().manual_seed(sum(map(ord, f"{fmt}{scale_kind}{head_size_k}{physical}")))
    geometry = CacheGeometry(
        num_blocks=7,
        num_kv_heads=3,
        block_size=16,
        head_size_k=head_size_k,
        head_size_v=head_size_v,
    )
    num_tokens = 45
    # Keys and values are strided views into one packed projection output, as in vLLM.
    packed = torch.randn(num_tokens, 3, head_size_k + head_size_v + 8, generator=gen) * 4
    key = packed[:, :, :head_size_k].half()
    value = packed[:, :, head_size_k : head_size_k + head_size_v].half()
    slots = torch.randperm(geometry.num_slots, generator=gen)[:num_tokens]
    slots[::7] = -1  # padding tokens
    if scale_kind == "none":
        scales, k_scale, v_scale = None, torch.ones(1), torch.ones(1)
    elif scale_kind == "per_tensor":
        scales = kv_scales(0.37, 2.5, 3)
        k_scale, v_scale = scales.k, scales.v
    else:
        scales = kv_scales(torch.tensor([0.01, 1.0, 3.0]), torch.tensor([[[0.5]], [[2]], [[7]]]), 3)
        k_scale, v_scale = scales.k, scales.v
    cache = poisoned_cache(geometry, fmt, physical)
    want = expected_cache(cache, key, value, slots, fmt, k_scale, v_scale)
    write_kv_cache(key, value, cache, slots, fmt.value, scales)
    if fmt is CacheFormat.FLOAT16:
        assert torch.equal(cache.view(torch.int16), want.view(torch.int16))
    else:
        assert torch.equal(cache, want)


def test_all_padding_and_empty_batches_write_nothing():
    geometry = CacheGeometry(2, 2, 16, 64, 64)
    cache = poisoned_cache(geometry, CacheFormat.FP8_E5M2, "BHNC")
    before = cache.clone()
    key = torch.randn(5, 2, 64).half()
    write_kv_cache(key, key, cache, torch.full((5,), -1), "fp8_e5m2")
    empty = key[:0]
    write_kv_cache(empty, empty, cache, torch.empty(0, dtype=torch.int64), "fp8_e5m2")
    assert torch.equal(cache, before)


def test_int32_slot_mapping_and_float32_inputs():
    geometry = CacheGeometry(3, 1, 16, 64, 64)
    cache = poisoned_cache(geometry, CacheFormat.FP8_E5M2, "BHNC")
    key = torch.randn(20, 1, 64) * 100
    value = torch.randn(20, 1, 64)
    slots = torch.arange(20, dtype=torch.int32) + 5
    want = expected_cache(
        cache, key, value, slots, CacheFormat.FP8_E5M2, torch.ones(1), torch.ones(1)
    )
    write_kv_cache(key, value, cache, slots, "fp8_e5m2")
    assert torch.equal(cache, want)


def test_unchecked_out_of_range_slots_are_masked_not_written():
    """With the host check off (graph capture), the kernel still never writes outside the cache."""
    geometry = CacheGeometry(2, 1, 16, 64, 64)
    cache = poisoned_cache(geometry, CacheFormat.FP8_E5M2, "BHNC")
    key = torch.randn(4, 1, 64).half()
    slots = torch.tensor([3, 32, 10_000, 7])
    want = expected_cache(
        cache,
        key,
        key,
        torch.tensor([3, -1, -1, 7]),
        CacheFormat.FP8_E5M2,
        torch.ones(1),
        torch.ones(1),
    )
    write_kv_cache(key, key, cache, slots, "fp8_e5m2", check_indices=False)
    assert torch.equal(cache, want)
