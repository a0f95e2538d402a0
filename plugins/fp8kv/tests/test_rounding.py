"""Bit-exactness of the integer FP8 rounding, through the real kernels (interpreter on CPU).

Every one of the 65,536 fp16 bit patterns is written through the cache-write kernel and
compared with torch's float8 conversion (made saturating); every one of the 256 codes of each
format is read back through the gather kernel and compared with torch's decoding.
"""

from __future__ import annotations

import pytest
import torch

from volta_fp8kv.format import CacheFormat, encode_reference
from volta_fp8kv.ops import gather_kv_cache, write_kv_cache
from volta_fp8kv.scales import kv_scales

ALL_FP16 = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
FP8 = [CacheFormat.FP8_E5M2, CacheFormat.FP8_E4M3]


def _write_rows(x: torch.Tensor, fmt: CacheFormat, scales=None) -> torch.Tensor:
    """Write ``x`` ([tokens, 1, 128]) as K and V into a fresh cache; return the K codes."""
    tokens = x.shape[0]
    cache = torch.randint(0, 256, (tokens // 16, 1, 16, 256), dtype=torch.uint8)
    write_kv_cache(x, x, cache, torch.arange(tokens), fmt.value, scales)
    rows = cache.reshape(tokens, 256)
    assert torch.equal(rows[:, :128], rows[:, 128:])  # K and V took the same path
    return rows[:, :128].reshape(-1)


@pytest.mark.parametrize("fmt", FP8, ids=lambda f: f.value)
def test_every_fp16_bit_pattern_rounds_like_torch_saturating(fmt):
    x = ALL_FP16.reshape(512, 1, 128)
    got = _write_rows(x, fmt)
    assert torch.equal(got, encode_reference(x, torch.ones(1), fmt).reshape(-1))

    # The same facts spelled out independently of encode_reference:
    torch_codes = x.reshape(-1).to(fmt.torch_fp8_dtype).view(torch.uint8)
    finite = torch_codes.view(fmt.torch_fp8_dtype).float().isfinite()
    assert torch.equal(got[finite], torch_codes[finite])  # RNE, exactly torch's
    nan = ALL_FP16.isnan()
    assert torch.equal(
        got[nan], torch.where(ALL_FP16[nan].view(torch.int16) < 0, 0xFF, 0x7F).to(torch.uint8)
    )
    overflow = ~finite & ~nan  # torch: inf (e5m2) for |x| >= 61440 and for inf; kernel saturates
    max_code = 0x7B if fmt is CacheFormat.FP8_E5M2 else 0x7E
    expected = torch.where(ALL_FP16[overflow] < 0, 0x80 | max_code, max_code).to(torch.uint8)
    assert torch.equal(got[overflow], expected)
    if fmt is CacheFormat.FP8_E5M2:
        # [61440, 65504] (fp16 0x7B80..0x7BFF) and inf, of each sign
        assert int(overflow.sum()) == 2 * (0x7BFF - 0x7B80 + 1 + 1)


@pytest.mark.parametrize("fmt", FP8, ids=lambda f: f.value)
def test_scaled_float32_values_round_like_torch(fmt):
    """float32 inputs over 2^-40..2^24 with per-head scales: x / s rounded once, like torch."""
    gen = torch.Generator().manual_seed(7)
    magnitude = torch.exp2(torch.empty(64, 4, 128).uniform_(-40, 24, generator=gen))
    sign = torch.where(torch.rand(64, 4, 128, generator=gen) < 0.5, -1.0, 1.0)
    x = (magnitude * sign).float()
    # Scales chosen so x / s lands on exact ties and in the subnormal range too.
    x[0, :, :8] = torch.tensor([1.125, 1.375, 2**-16 * 1.5, 2**-16 * 2.5, 2**-17, 3.0, 5.0, 7.0])
    scales = kv_scales(torch.tensor([0.5, 1.0, 3.0, 2.0**-10]), torch.tensor([1.0]), 4)
    cache = torch.zeros(4, 4, 16, 256, dtype=torch.uint8)
    write_kv_cache(x, x, cache, torch.arange(64), fmt.value, scales)
    codes = cache.permute(0, 2, 1, 3).reshape(64, 4, 256)
    assert torch.equal(codes[..., :128], encode_reference(x, scales.k, fmt))
    assert torch.equal(codes[..., 128:], encode_reference(x, scales.v, fmt))


@pytest.mark.parametrize("fmt", FP8, ids=lambda f: f.value)
def test_every_code_decodes_like_torch(fmt):
    codes = torch.arange(256, dtype=torch.uint8).repeat(2).reshape(4, 1, 1, 128)
    cache = torch.cat([codes, codes.flip(-1)], dim=-1).repeat(1, 1, 16, 1).contiguous()
    table = torch.tensor([[2, 0, 3, 1]], dtype=torch.int32)
    lens = torch.tensor([64], dtype=torch.int32)
    k, v = gather_kv_cache(cache, table, lens, fmt.value, 128, out_dtype=torch.float32)
    expected = cache[table[0].long()].reshape(64, 1, 256).view(fmt.torch_fp8_dtype).float()
    for got, want in ((k, expected[..., :128]), (v, expected[..., 128:])):
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(torch.nan_to_num(got, nan=0.0), torch.nan_to_num(want, nan=0.0))
        assert torch.equal(got.signbit(), want.signbit())  # -0.0 stays -0.0


def test_e5m2_decodes_to_the_high_byte_of_fp16():
    """The fact the attention side relies on: an e5m2 code shifted left 8 is its fp16 value."""
    codes = torch.arange(256, dtype=torch.int32)
    as_fp16 = (codes << 8).to(torch.int16).view(torch.float16).float()
    torch_value = codes.to(torch.uint8).view(torch.float8_e5m2).float()
    assert torch.equal(as_fp16.isnan(), torch_value.isnan())
    finite = ~torch_value.isnan()
    assert torch.equal(as_fp16[finite], torch_value[finite])
