"""The kernels on a real GPU (marker ``gpu``): bit-exact against torch, every element checked.

Run on the H100 with ``-m gpu`` (and under ``compute-sanitizer --tool memcheck``); skipped
without CUDA. Sizes stay small enough for the sanitizer.
"""

from __future__ import annotations

import pytest
import torch

from volta_core import (
    FP8_E4M3_MIN_CAPABILITY,
    PACKED_KV_LAYOUT,
    VoltaPluginManager,
    kv_cache_writer,
)
from volta_fp8kv import plugin
from volta_fp8kv.format import CacheFormat, encode_reference
from volta_fp8kv.ops import KVCacheInputError, gather_kv_cache, write_kv_cache
from volta_fp8kv.scales import kv_scales

pytestmark = pytest.mark.gpu

CUDA = "cuda"


def formats() -> list[CacheFormat]:
    fmts = [CacheFormat.FP8_E5M2]
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= FP8_E4M3_MIN_CAPABILITY:
        fmts.append(CacheFormat.FP8_E4M3)
    return fmts


@pytest.mark.parametrize("fmt", formats(), ids=lambda f: f.value)
def test_every_fp16_bit_pattern_on_gpu(fmt):
    x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    x = x.reshape(512, 1, 128)
    cache = torch.full((32, 1, 16, 256), 0xA5, dtype=torch.uint8, device=CUDA)
    write_kv_cache(x.to(CUDA), x.to(CUDA), cache, torch.arange(512, device=CUDA), fmt.value)
    rows = cache.cpu().reshape(512, 256)
    want = encode_reference(x, torch.ones(1), fmt)[:, 0]
    nan = x[:, 0].isnan()
    for half in (rows[:, :128], rows[:, 128:]):
        # Bit-exact on every non-NaN pattern (63,490 of them); NaN stays NaN, but GPUs
        # canonicalise NaNs in float arithmetic, so a NaN's sign is not kept there.
        assert torch.equal(half[~nan], want[~nan])
        assert ((half[nan] & 0x7F) == 0x7F).all()
    assert int((~nan).sum()) == 65536 - 2 * 1023


@pytest.mark.parametrize("fmt", formats(), ids=lambda f: f.value)
def test_every_code_decodes_on_gpu(fmt):
    codes = torch.arange(256, dtype=torch.uint8).reshape(2, 1, 1, 128).repeat(1, 1, 16, 2)
    table = torch.tensor([[1, 0]], dtype=torch.int32)
    lens = torch.tensor([32], dtype=torch.int32)
    k, _ = gather_kv_cache(
        codes.to(CUDA), table.to(CUDA), lens.to(CUDA), fmt.value, 128, out_dtype=torch.float32
    )
    want = codes[table[0].long()].reshape(32, 1, 256)[..., :128].view(fmt.torch_fp8_dtype).float()
    k = k.cpu()
    assert torch.equal(k.isnan(), want.isnan())
    assert torch.equal(k.nan_to_num(0.0), want.nan_to_num(0.0))
    assert torch.equal(k.signbit()[~want.isnan()], want.signbit()[~want.isnan()])


@pytest.mark.parametrize("fmt", formats(), ids=lambda f: f.value)
@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
def test_paged_write_then_gather_on_gpu(fmt, per_head):
    gen = torch.Generator().manual_seed(21)
    heads, hk, hv, block_size, num_blocks = 4, 128, 128, 16, 64
    lens = [300, 1, 129, 0, 77]
    tokens = sum(lens)
    key = (torch.randn(tokens, heads, hk, generator=gen) * 50).half()
    value = torch.randn(tokens, heads, hv, generator=gen).half()
    if per_head:
        scales = kv_scales(torch.tensor([0.01, 0.1, 1.0, 10.0]), torch.tensor([2.0, 1, 0.5, 3]), 4)
    else:
        scales = kv_scales(0.25, 0.5, heads)
    # Each sequence owns random blocks; slots follow its block table; a few padding tokens.
    perm = torch.randperm(num_blocks, generator=gen)
    tables, slots, start = [], [], 0
    for length in lens:
        need = -(-length // block_size)
        blocks = perm[start : start + need]
        start += need
        # Columns past a sequence's blocks hold stale entries, as in vLLM.
        tables.append(torch.cat([blocks, torch.full((20 - need,), 9999)]))
        pos = torch.arange(length)
        slots.append(blocks[pos // block_size] * block_size + pos % block_size)
    table = torch.stack(tables).int()
    slot_mapping = torch.cat(slots)
    padded_key = torch.cat([key, key[:3]])
    padded_value = torch.cat([value, value[:3]])
    slot_mapping = torch.cat([slot_mapping, torch.full((3,), -1)])
    raw = torch.full((num_blocks, block_size, heads, hk + hv), 0xA5, dtype=torch.uint8)
    cache = raw.to(CUDA).permute(0, 2, 1, 3)  # physical [B, N, H, C], logical [B, H, N, C]
    s = scales.to(CUDA)
    write_kv_cache(
        padded_key.to(CUDA), padded_value.to(CUDA), cache, slot_mapping.to(CUDA), fmt.value, s
    )
    k, v = gather_kv_cache(
        cache,
        table.to(CUDA),
        torch.tensor(lens, dtype=torch.int32, device=CUDA),
        fmt.value,
        hk,
        s,
        out_dtype=torch.float32,
    )
    want_k = encode_reference(key, scales.k, fmt).view(fmt.torch_fp8_dtype).float()
    want_v = encode_reference(value, scales.v, fmt).view(fmt.torch_fp8_dtype).float()
    assert torch.equal(k.cpu(), want_k * scales.k.reshape(-1, 1))
    assert torch.equal(v.cpu(), want_v * scales.v.reshape(-1, 1))
    # Nothing outside the written slots changed.
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slot_mapping[slot_mapping >= 0]] = True
    untouched = cache.permute(0, 2, 1, 3).cpu().reshape(num_blocks * block_size, -1)[~written]
    assert (untouched == 0xA5).all()


def test_fp16_cache_round_trips_exactly_on_gpu():
    key = torch.randn(100, 2, 64, device=CUDA).half()
    cache = torch.full((8, 2, 16, 128), float("nan"), dtype=torch.float16, device=CUDA)
    write_kv_cache(key, key, cache, torch.arange(100, device=CUDA), "float16")
    table = torch.arange(7, dtype=torch.int32, device=CUDA)[None]
    k, v = gather_kv_cache(
        cache, table, torch.tensor([100], dtype=torch.int32, device=CUDA), "float16", 64
    )
    assert torch.equal(k, key)
    assert torch.equal(v, key)


def test_bad_slot_on_gpu_is_refused_before_launch():
    cache = torch.zeros(2, 1, 16, 128, dtype=torch.uint8, device=CUDA)
    key = torch.randn(3, 1, 64, device=CUDA).half()
    with pytest.raises(KVCacheInputError, match="past the cache"):
        write_kv_cache(key, key, cache, torch.tensor([0, 1, 32], device=CUDA), "fp8_e5m2")
    assert int(cache.count_nonzero()) == 0


def test_unchecked_out_of_range_slots_stay_inside_the_cache_on_gpu():
    """With the host check off, out-of-range slots are masked: memcheck sees no bad access."""
    cache = torch.zeros(2, 1, 16, 128, dtype=torch.uint8, device=CUDA)
    key = torch.ones(3, 1, 64, device=CUDA).half()
    slots = torch.tensor([0, 1 << 40, 32], device=CUDA)
    write_kv_cache(key, key, cache, slots, "fp8_e5m2", check_indices=False)
    torch.cuda.synchronize()
    assert int(cache.count_nonzero()) == 128


@pytest.mark.parametrize("fmt", ["float16", *(f.value for f in formats())])
def test_host_writer_is_captured_in_a_cuda_graph_and_replays_exactly(fmt):
    """The engine's step as vLLM runs it: the writer the host hands out, called with
    ``check_values=False`` inside a CUDA graph (any host read would break the capture), on a
    cache allocated as torch's FP8 dtype, a padded slot mapping and the layer's scale tensors;
    each replay writes the inputs' current contents."""
    host = VoltaPluginManager(strict=True)
    host.register(plugin, "fp8kv")
    write = kv_cache_writer(PACKED_KV_LAYOUT, fmt, manager=host)
    heads, head_size, block_size, num_blocks, tokens = 4, 128, 16, 32, 200
    gen = torch.Generator().manual_seed(5)
    storage = torch.float16 if fmt == "float16" else CacheFormat(fmt).torch_fp8_dtype
    cache = torch.zeros(num_blocks, heads, block_size, 2 * head_size, device=CUDA)
    cache = cache.to(storage)
    key = torch.empty(tokens, heads, head_size, dtype=torch.float16, device=CUDA)
    value = torch.empty_like(key)
    slots = torch.empty(tokens + 56, dtype=torch.int64, device=CUDA)
    k_scale = torch.tensor([0.01, 0.1, 1.0, 10.0], device=CUDA)
    v_scale = torch.tensor([0.5], device=CUDA)

    def step() -> None:
        write(
            key,
            value,
            cache,
            slots,
            kv_cache_dtype=fmt,
            k_scale=k_scale,
            v_scale=v_scale,
            check_values=False,
        )

    def fill(seed: int) -> torch.Tensor:
        gen.manual_seed(seed)
        key.copy_(torch.randn(tokens, heads, head_size, generator=gen) * 30)
        value.copy_(torch.randn(tokens, heads, head_size, generator=gen))
        batch = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
        batch[::9] = -1
        # vLLM pads the slot mapping past the batch; the tail must not be written.
        slots.copy_(torch.cat([batch, torch.randperm(num_blocks * block_size)[:56]]))
        return batch

    fill(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    cache.view(torch.uint8).fill_(0xA5)
    batch = fill(1)
    graph.replay()
    torch.cuda.synchronize()
    got = cache.view(torch.uint8).cpu().reshape(num_blocks, heads, block_size, -1)
    want = torch.full_like(got, 0xA5)
    if fmt == "float16":
        k_rows, v_rows = key.cpu().view(torch.uint8), value.cpu().view(torch.uint8)
    else:
        scale_k = k_scale.cpu()
        scale_v = v_scale.cpu().expand(heads)
        k_rows = encode_reference(key.cpu(), scale_k, CacheFormat(fmt))
        v_rows = encode_reference(value.cpu(), scale_v, CacheFormat(fmt))
    half = k_rows.shape[-1]
    for t, slot in enumerate(batch.tolist()):
        if slot >= 0:
            want[slot // block_size, :, slot % block_size, :half] = k_rows[t]
            want[slot // block_size, :, slot % block_size, half:] = v_rows[t]
    assert torch.equal(got, want)
