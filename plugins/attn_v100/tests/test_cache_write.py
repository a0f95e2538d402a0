"""The cache write against torch: fp16 copies, fp8 e5m2 and e4m3 codes bit-exact to torch's RNE
(saturating) conversion of ``x * (1/scale)`` in float32 (the fp8kv plugin's format, one
rounding); padding slots skipped; every fp16 bit pattern."""

from __future__ import annotations

import pytest
import torch
from attn_v100_cases import TORCH_FP8

from volta_attn_v100.ops import AttentionInputError, write_kv_cache

KV_DTYPES = ["float16", *TORCH_FP8]


def torch_codes(x: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    """Reference codes: RNE via torch, saturated to the largest finite code (NaN kept)."""
    fp8 = TORCH_FP8[kv_dtype]
    top = torch.finfo(fp8).max
    clamped = torch.where(torch.isnan(x), x, x.clamp(-top, top))
    return clamped.to(fp8).view(torch.uint8)


@pytest.mark.parametrize("kv_dtype", list(TORCH_FP8))
def test_every_fp16_bit_pattern(kv_dtype) -> None:
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = bits.view(torch.float16).reshape(-1, 1, 64)
    n = values.shape[0]
    cache = torch.zeros((n, 1, 1, 128), dtype=torch.uint8)
    write_kv_cache(
        values,
        values,
        cache,
        torch.arange(n, dtype=torch.int64),
        kv_cache_dtype=kv_dtype,
        check_values=False,
    )
    got = cache[:, 0, 0, :64].reshape(-1)
    ref = torch_codes(values.reshape(-1).float(), kv_dtype)
    nan = torch.isnan(values.reshape(-1))
    assert torch.equal(got[~nan], ref[~nan])
    assert torch.isnan(got[nan].view(TORCH_FP8[kv_dtype]).float()).all()


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("scales", ["none", "head"])
def test_write_at_slots(kv_dtype, scales) -> None:
    gen = torch.Generator().manual_seed(1)
    tokens, heads, head_size, blocks, block = 11, 2, 80, 5, 16
    key = (torch.randn(tokens, heads, head_size, generator=gen) * 3).to(torch.float16)
    value = (torch.randn(tokens, heads, head_size, generator=gen) * 3).to(torch.float16)
    slots = torch.randperm(blocks * block, generator=gen)[:tokens]
    slots[3] = -1
    storage = torch.float16 if kv_dtype == "float16" else torch.uint8
    cache = torch.full((blocks, heads, block, 2 * head_size), 7, dtype=storage)
    before = cache.clone()
    k_scale = v_scale = None
    if scales == "head":
        k_scale, v_scale = torch.tensor([0.5, 2.0]), torch.tensor([0.25, 1.5])
    write_kv_cache(
        key, value, cache, slots, kv_cache_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale
    )
    written = torch.zeros_like(cache, dtype=torch.bool)
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        b, o = divmod(s, block)
        written[b, :, o] = True
        for name, src, sc, part in (
            ("K", key, k_scale, slice(0, head_size)),
            ("V", value, v_scale, slice(head_size, None)),
        ):
            if kv_dtype == "float16":
                assert torch.equal(cache[b, :, o, part], src[t]), name
            else:
                s_ = sc if sc is not None else torch.ones(heads)
                ref = torch_codes(src[t].float() * torch.reciprocal(s_.float())[:, None], kv_dtype)
                assert torch.equal(cache[b, :, o, part], ref), name
    assert torch.equal(cache[~written], before[~written]), "a padding slot or other slot changed"


def test_slot_past_the_cache() -> None:
    key = torch.zeros(2, 1, 64, dtype=torch.float16)
    cache = torch.zeros((2, 1, 16, 128), dtype=torch.float16)
    with pytest.raises(AttentionInputError, match="slot 32 is past the KV cache of 32 slots"):
        write_kv_cache(key, key, cache, torch.tensor([0, 32]))


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_gpu_write_matches_cpu(kv_dtype) -> None:
    """The compiled kernel writes the same bytes as the interpreted one, at serving sizes."""
    gen = torch.Generator().manual_seed(2)
    tokens, heads, head_size, blocks, block = 300, 8, 128, 64, 16
    key = (torch.randn(tokens, heads, head_size, generator=gen) * 4).to(torch.float16)
    value = (torch.randn(tokens, heads, head_size, generator=gen) * 4).to(torch.float16)
    slots = torch.randperm(blocks * block, generator=gen)[:tokens]
    slots[::7] = -1
    storage = torch.float16 if kv_dtype == "float16" else torch.uint8
    cache = torch.zeros((blocks, heads, block, 2 * head_size), dtype=storage)
    k_scale, v_scale = (
        torch.rand(heads, generator=gen) + 0.5,
        torch.rand(heads, generator=gen) + 0.5,
    )
    gpu = cache.cuda()
    write_kv_cache(
        key.cuda(), value.cuda(), gpu, slots.cuda(), kv_cache_dtype=kv_dtype,
        k_scale=k_scale.cuda(), v_scale=v_scale.cuda(),
    )  # fmt: skip
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        b, o = divmod(s, block)
        got = gpu[b, :, o].cpu()
        if kv_dtype == "float16":
            assert torch.equal(got, torch.cat([key[t], value[t]], dim=-1))
        else:
            ref_k = torch_codes(key[t].float() * torch.reciprocal(k_scale)[:, None], kv_dtype)
            ref_v = torch_codes(value[t].float() * torch.reciprocal(v_scale)[:, None], kv_dtype)
            assert torch.equal(got, torch.cat([ref_k, ref_v], dim=-1))
