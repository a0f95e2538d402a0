"""The packed KV-cache writer as the host hands it out: declared formats, exact codes, checks.

The writer is obtained the way an attention backend obtains it (``volta_core.kv_cache_writer``
over a manager with this plugin registered), fed vLLM's tensors (a poisoned cache as vLLM
allocates it, a slot mapping padded past the batch, the layer's scale tensors) and compared
with codes computed in float64 from the FP8 bit fields, not with torch's own FP8 conversion.
"""

from __future__ import annotations

import math

import pytest
import torch

from volta_core import PACKED_KV_LAYOUT, KVCacheWriter, VoltaPluginManager, kv_cache_writer
from volta_fp8kv import __version__, cache_ops, plugin
from volta_fp8kv.kernels import cache_write
from volta_fp8kv.ops import KVCacheInputError, constant_scales

FORMATS = ("float16", "fp8_e5m2", "fp8_e4m3")
TORCH_FP8 = {"fp8_e5m2": torch.float8_e5m2, "fp8_e4m3": torch.float8_e4m3fn}
#: (exponent bits, mantissa bits, bias) of each FP8 format (OCP FP8 specification; e4m3 is the
#: "fn" variant: no infinities, only S.1111.111 is NaN).
FP8_FIELDS = {"fp8_e5m2": (5, 2, 15), "fp8_e4m3": (4, 3, 7)}


@pytest.fixture(scope="module")
def host() -> VoltaPluginManager:
    manager = VoltaPluginManager(strict=True)
    manager.register(plugin, "fp8kv", distribution="vllm-volta-fp8kv", version=__version__)
    return manager


def writer(host: VoltaPluginManager, kv_cache_dtype: str) -> KVCacheWriter:
    return kv_cache_writer(PACKED_KV_LAYOUT, kv_cache_dtype, manager=host)


def fp8_magnitudes(fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every non-negative finite code of ``fmt``, ascending, and its value in float64."""
    exp_bits, man_bits, bias = FP8_FIELDS[fmt]
    codes, values = [], []
    for code in range(128):
        e, m = code >> man_bits, code & ((1 << man_bits) - 1)
        top = (1 << exp_bits) - 1
        if (fmt == "fp8_e5m2" and e == top) or (fmt == "fp8_e4m3" and e == top and m == 7):
            continue  # infinities and NaNs
        frac = m / (1 << man_bits)
        codes.append(code)
        values.append(math.ldexp(frac, 1 - bias) if e == 0 else math.ldexp(1 + frac, e - bias))
    return torch.tensor(codes), torch.tensor(values, dtype=torch.float64)


def reference_codes(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """The format's codes of ``x`` ``[T, H, D]`` with per-head ``scale`` ``[H]``, in float64.

    ``r = 1/s`` rounded once to float32; ``x · r`` (exact in float64: 11 x 24 significant bits)
    rounded once to float32; then the nearest FP8 value, ties to the even code, saturated to the
    largest finite one, the sign kept.
    """
    r = torch.reciprocal(scale.to(torch.float32)).double()
    y = (x.double() * r[:, None]).float().double()
    codes, values = fp8_magnitudes(fmt)
    a = y.abs().clamp(max=float(values[-1]))
    hi = torch.searchsorted(values, a.contiguous()).clamp(max=len(values) - 1)
    lo = (hi - 1).clamp(min=0)
    below, above = a - values[lo], values[hi] - a
    take_hi = (above < below) | ((above == below) & (codes[hi] % 2 == 0))
    magnitude = torch.where(take_hi, codes[hi], codes[lo])
    return (magnitude | (y.signbit().long() << 7)).to(torch.uint8)


def bits(cache: torch.Tensor) -> torch.Tensor:
    """The cache's raw elements, for bit-exact comparison (NaN-safe)."""
    return cache.view(torch.int16) if cache.dtype == torch.float16 else cache.view(torch.uint8)


def poisoned_cache(
    fmt: str, blocks: int, heads: int, block_size: int, entry: int, *, storage: str, physical: str
) -> torch.Tensor:
    """Random garbage in vLLM's allocation: ``[B, H, N, C]`` logical over a chosen physical order;
    fp16, or FP8 as ``uint8`` or as torch's FP8 dtype."""
    shape = (blocks, heads, block_size, entry)
    if physical == "BNHC":
        shape = (blocks, block_size, heads, entry)
    raw = torch.randint(0, 256, (*shape[:-1], entry * (2 if fmt == "float16" else 1)))
    raw = raw.to(torch.uint8)
    if fmt == "float16":
        cache = raw.view(torch.float16)
    else:
        cache = raw.view(TORCH_FP8[fmt]) if storage == "float8" else raw
    return cache.permute(0, 2, 1, 3) if physical == "BNHC" else cache


def random_rows(gen: torch.Generator, tokens: int, heads: int, head_size: int) -> torch.Tensor:
    """fp16 rows over 2^-20..2^15 in magnitude: subnormal codes, saturation and everything
    between, whatever the scale."""
    magnitude = torch.exp2(torch.empty(tokens, heads, head_size).uniform_(-20, 15, generator=gen))
    x = torch.randn(tokens, heads, head_size, generator=gen) * magnitude
    return x.clamp(-60000, 60000).half()


def expected(cache, key, value, slots, fmt, k_scale, v_scale):
    """The poisoned cache with exactly the batch's valid slots written, K then V in each entry."""
    out = cache.clone()
    block_size, head_size = cache.shape[2], key.shape[2]
    if fmt == "float16":
        k_rows, v_rows = key, value
    else:
        k_rows = reference_codes(key, k_scale, fmt).view(out.dtype)
        v_rows = reference_codes(value, v_scale, fmt).view(out.dtype)
    for t, slot in enumerate(slots[: key.shape[0]].tolist()):
        if slot >= 0:
            out[slot // block_size, :, slot % block_size, :head_size] = k_rows[t]
            out[slot // block_size, :, slot % block_size, head_size:] = v_rows[t]
    return out


def layer_scales(kind: str, heads: int, gen: torch.Generator):
    """The layer's (k_scale, v_scale) as the backend passes them, and their per-head values."""
    per_head_k = torch.exp2(torch.empty(heads).uniform_(-7, 2, generator=gen))
    per_head_v = torch.exp2(torch.empty(heads).uniform_(-7, 2, generator=gen))
    one_k, one_v = per_head_k[:1].clone(), per_head_v[:1].clone()
    given = {
        "none": (None, None),
        "number": (0.37, 2.5),
        "per_tensor": (one_k, one_v),
        "per_tensor_0d": (one_k.reshape(()), one_v.reshape(())),
        "per_head": (per_head_k, per_head_v),
        "per_head_h11": (per_head_k.reshape(heads, 1, 1), per_head_v.reshape(heads, 1, 1)),
        "mixed": (per_head_k, one_v),
    }[kind]
    values = []
    for scale in given:
        if scale is None or isinstance(scale, float):
            values.append(torch.full((heads,), 1.0 if scale is None else scale))
        else:
            values.append(scale.reshape(-1).expand(heads))
    return given, values


def test_formats_are_declared_in_the_packed_layout_and_attributed(host):
    formats = host.kv_cache_formats()
    assert {name for name, _ in formats} == {"fp8kv"}
    assert sorted(spec.kv_cache_dtype for _, spec in formats) == sorted(FORMATS)
    assert all(spec.layout == PACKED_KV_LAYOUT for _, spec in formats)
    assert all(spec.impl == "volta_fp8kv.cache_ops:write" for _, spec in formats)
    for dtype in FORMATS:
        owner, spec = host.kv_cache_format(PACKED_KV_LAYOUT, dtype)
        assert (owner, spec.name) == ("fp8kv", f"packed.{dtype}")


@pytest.mark.parametrize("asked", [*FORMATS, "auto", "fp8"])
def test_the_host_resolves_every_spelling_to_this_writer(host, asked):
    assert kv_cache_writer(PACKED_KV_LAYOUT, asked, "float16", host) is cache_ops.write


def test_other_layouts_and_dtypes_are_not_claimed(host):
    assert host.kv_cache_format("flash", "fp8_e5m2") is None
    assert host.kv_cache_format(PACKED_KV_LAYOUT, "bfloat16") is None


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "scale_kind",
    ["none", "number", "per_tensor", "per_tensor_0d", "per_head", "per_head_h11", "mixed"],
)
@pytest.mark.parametrize(("storage", "physical"), [("uint8", "BHNC"), ("float8", "BNHC")])
def test_writes_the_float64_reference_codes(host, fmt, scale_kind, storage, physical):
    """Fresh data, poisoned cache, padding slots in the batch and a padded slot mapping whose
    tail points at real slots: exactly the batch's valid tokens land, bit for bit."""
    gen = torch.Generator().manual_seed(sum(map(ord, f"{fmt}{scale_kind}{storage}{physical}")))
    blocks, heads, block_size, head_size, tokens = 5, 3, 16, 80, 23
    packed = random_rows(gen, tokens, heads, 2 * head_size + 16)
    key, value = packed[..., :head_size], packed[..., head_size : 2 * head_size]  # strided views
    slots = torch.randperm(blocks * block_size, generator=gen)
    slots[:tokens:5] = -1  # padding tokens of the batch
    cache = poisoned_cache(
        fmt, blocks, heads, block_size, 2 * head_size, storage=storage, physical=physical
    )
    (k_scale, v_scale), (k_values, v_values) = layer_scales(scale_kind, heads, gen)
    want = expected(cache, key, value, slots, fmt, k_values, v_values)
    writer(host, fmt)(
        key,
        value,
        cache,
        slots,
        kv_cache_dtype=fmt,
        k_scale=k_scale,
        v_scale=v_scale,
        check_values=True,
    )
    assert torch.equal(bits(cache), bits(want))


@pytest.mark.parametrize("head_size", [64, 80, 96, 128, 256, 512])
@pytest.mark.parametrize("fmt", ["float16", "fp8_e5m2"])
def test_every_head_size_of_the_attention_backend(host, head_size, fmt):
    gen = torch.Generator().manual_seed(head_size)
    blocks, heads, block_size, tokens = 2, 2, 16, 9
    key = random_rows(gen, tokens, heads, head_size)
    value = random_rows(gen, tokens, heads, head_size)
    slots = torch.cat([torch.randperm(blocks * block_size, generator=gen)[:tokens], -torch.ones(4)])
    slots = slots.long()
    cache = poisoned_cache(
        fmt, blocks, heads, block_size, 2 * head_size, storage="uint8", physical="BHNC"
    )
    k_scale = torch.exp2(torch.empty(heads).uniform_(-4, 4, generator=gen))
    want = expected(cache, key, value, slots, fmt, k_scale, torch.full((heads,), 0.5))
    write = writer(host, fmt)
    write(
        key, value, cache, slots, kv_cache_dtype=fmt, k_scale=k_scale, v_scale=torch.tensor([0.5])
    )
    assert torch.equal(bits(cache), bits(want))


def test_an_empty_batch_with_a_padded_slot_mapping_writes_nothing(host):
    cache = poisoned_cache("fp8_e5m2", 2, 1, 16, 128, storage="uint8", physical="BHNC")
    before = cache.clone()
    key = torch.randn(0, 1, 64).half()
    writer(host, "fp8_e5m2")(
        key,
        key,
        cache,
        torch.arange(8),
        kv_cache_dtype="fp8_e5m2",
        k_scale=None,
        v_scale=None,
        check_values=True,
    )
    assert torch.equal(cache, before)


class Launches:
    """Stands in for the kernel: records each launch (grid and arguments) instead of running it."""

    def __init__(self) -> None:
        self.grids: list[tuple[int, ...]] = []
        self.args: list[tuple] = []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return lambda *args, **kwargs: self.args.append(args)


@pytest.fixture
def launches(monkeypatch) -> Launches:
    recorder = Launches()
    monkeypatch.setattr(cache_write, "cache_write_kernel", recorder)
    return recorder


def good_write() -> dict:
    key = torch.randn(10, 2, 64).half()
    return {
        "key": key,
        "value": key.clone(),
        "kv_cache": torch.zeros(4, 2, 16, 128, dtype=torch.uint8),
        "slot_mapping": torch.cat([torch.arange(10), torch.full((6,), 5000)]),
        "kv_cache_dtype": "fp8_e5m2",
        "k_scale": torch.tensor([0.5, 2.0]),
        "v_scale": torch.tensor([1.5]),
    }


BAD_INPUT = {
    "fp16 cache for e5m2": (
        {"kv_cache": torch.zeros(4, 2, 16, 128, dtype=torch.float16)},
        r"fp8_e5m2 cache holds uint8 codes or torch.float8_e5m2",
    ),
    "e4m3 storage for e5m2": (
        {"kv_cache": torch.zeros(4, 2, 16, 128, dtype=torch.float8_e4m3fn)},
        "is torch.float8_e4m3fn",
    ),
    "byte cache for float16": ({"kv_cache_dtype": "float16"}, "holds float16 values"),
    "unknown dtype": ({"kv_cache_dtype": "int8"}, "not one this plugin writes"),
    "cache heads": (
        {"kv_cache": torch.zeros(4, 3, 16, 128, dtype=torch.uint8)},
        r"expected \[num_blocks, 2, block_size, 128\]",
    ),
    "cache entry": ({"kv_cache": torch.zeros(4, 2, 16, 64, dtype=torch.uint8)}, "= 128"),
    "cache rank": ({"kv_cache": torch.zeros(4, 2, 2048, dtype=torch.uint8)}, "must be 4-D"),
    "key dtype": ({"key": torch.zeros(10, 2, 64, dtype=torch.int32)}, "key must be float16"),
    "key device": ({"key": torch.zeros(10, 2, 64, dtype=torch.float16, device="meta")}, "meta"),
    "head too large": (
        {"key": torch.zeros(10, 2, 600).half(), "value": torch.zeros(10, 2, 600).half()},
        "above the largest configured head",
    ),
    "slot mapping short": ({"slot_mapping": torch.arange(9)}, "at least one slot per token"),
    "slot mapping dtype": ({"slot_mapping": torch.arange(10.0)}, "int32/int64"),
    "slot mapping strided": ({"slot_mapping": torch.arange(20)[::2]}, "must be contiguous"),
    "scale count": ({"k_scale": torch.ones(3)}, "k_scale has 3 values for 2 KV heads"),
    "scale type": ({"v_scale": "1.0"}, "v_scale must be a tensor, a number or None"),
    "scale number zero": ({"k_scale": 0.0}, "k_scale must be finite and positive"),
    "scale number nan": ({"v_scale": float("nan")}, "v_scale must be finite and positive"),
}


@pytest.mark.parametrize("check_values", [True, False])
@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_refused_before_any_launch_whatever_check_values(
    host, launches, case, check_values
):
    change, message = BAD_INPUT[case]
    args = {**good_write(), **change}
    with pytest.raises(KVCacheInputError, match=message):
        writer(host, "fp8_e5m2")(**args, check_values=check_values)
    assert launches.grids == []


def test_the_good_write_reaches_the_launch(host, launches):
    """The harness itself: the valid input of the cases above is launched."""
    writer(host, "fp8_e5m2")(**good_write(), check_values=True)
    assert launches.grids == [(2, 2)]  # 10 tokens in programs of 8, 2 KV heads


CHECKED_VALUES = {
    "slot past the cache": ({"slot_mapping": torch.tensor([0] * 9 + [64])}, "slot 64, past"),
    "zero scale": ({"k_scale": torch.tensor([0.5, 0.0])}, "k_scale must be finite and positive"),
    "negative scale": ({"v_scale": torch.tensor([-1.0])}, "v_scale must be finite and positive"),
    "nan scale": ({"k_scale": torch.tensor([math.nan, 1.0])}, r"k_scale .* got \[nan, 1.0\]"),
    "inf scale": ({"v_scale": torch.tensor([math.inf])}, "v_scale must be finite and positive"),
}


@pytest.mark.parametrize("case", list(CHECKED_VALUES))
def test_check_values_refuses_bad_slots_and_scale_values(host, launches, case):
    change, message = CHECKED_VALUES[case]
    with pytest.raises(KVCacheInputError, match=message):
        writer(host, "fp8_e5m2")(**{**good_write(), **change}, check_values=True)
    assert launches.grids == []


@pytest.mark.parametrize("case", list(CHECKED_VALUES))
def test_without_check_values_the_same_tensors_are_not_read(host, launches, case):
    change, _ = CHECKED_VALUES[case]
    writer(host, "fp8_e5m2")(**{**good_write(), **change}, check_values=False)
    assert len(launches.grids) == 1


HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def refuse_host_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, any read of a tensor's values back to the host fails the test."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("a tensor was read back to the host")

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_engine_step_reads_nothing_back_to_the_host(host, launches, monkeypatch, fmt):
    args = {**good_write(), "kv_cache_dtype": fmt}
    if fmt == "float16":
        args["kv_cache"] = torch.zeros(4, 2, 16, 128, dtype=torch.float16)
    write = writer(host, fmt)
    refuse_host_reads(monkeypatch)
    write(**args, check_values=False)
    assert len(launches.grids) == 1


def test_the_host_read_detector_catches_the_checked_call(host, launches, monkeypatch):
    """check_values=True reads slots and scales back, which the detector above must see."""
    args = good_write()
    refuse_host_reads(monkeypatch)
    with pytest.raises(AssertionError, match="read back to the host"):
        writer(host, "fp8_e5m2")(**args, check_values=True)


@pytest.mark.parametrize(
    ("fmt", "k_scale", "v_scale"),
    [("float16", None, None), ("fp8_e5m2", None, None), ("fp8_e5m2", 0.25, 2.0)],
)
def test_scales_given_as_numbers_are_made_once_not_per_step(host, launches, fmt, k_scale, v_scale):
    """The kernel gets the same scale tensors at every step: nothing is allocated for them."""
    args = {**good_write(), "kv_cache_dtype": fmt, "k_scale": k_scale, "v_scale": v_scale}
    if fmt == "float16":
        args["kv_cache"] = torch.zeros(4, 2, 16, 128, dtype=torch.float16)
    for _ in range(2):
        writer(host, fmt)(**args, check_values=False)
    (k, v), (k_again, v_again) = (a[4:6] for a in launches.args)
    assert k is k_again
    assert v is v_again
    assert (k.tolist(), v.tolist()) == ([k_scale or 1.0], [v_scale or 1.0])


def test_scales_made_from_numbers_live_as_long_as_the_process():
    """A captured CUDA graph reads them at every replay: more layers' values than any cache
    size must not free the first (an LRU's eviction would hand its memory to other data)."""
    device = torch.device("cpu")
    first = constant_scales(0.5, 0.25, device)
    address = first.k.data_ptr()
    for i in range(200):
        constant_scales(1.0 + i, 2.0 + i, device)
    again = constant_scales(0.5, 0.25, device)
    assert again is first
    assert again.k.data_ptr() == address


@pytest.mark.parametrize("shape", [(2,), (2, 1, 1), (1,), ()])
def test_the_layers_scale_tensors_reach_the_kernel_uncopied(host, launches, shape):
    """Per-head or per-tensor, in the shapes checkpoints give them: the kernel reads the layer's
    own memory (vLLM may update a scale in place between steps)."""
    k_scale = torch.rand(2).add(0.5)[: math.prod(shape)].reshape(shape)
    v_scale = k_scale.clone()
    args = {**good_write(), "k_scale": k_scale, "v_scale": v_scale}
    writer(host, "fp8_e5m2")(**args, check_values=False)
    ((*_, k, v, _num_tokens, _num_slots),) = (a[:8] for a in launches.args)
    assert (k.data_ptr(), v.data_ptr()) == (k_scale.data_ptr(), v_scale.data_ptr())
    assert k.is_contiguous()


def test_a_layers_write_is_kept_only_while_its_scale_tensors_are_the_kernels(host, launches):
    """The write kept on the cache follows the layer's scale tensors: a new tensor makes a new
    write that reads it; scales the kernel cannot read in place (float64 here, copied to
    float32) are made again at every step, so a changed value always reaches the kernel."""
    args = {**good_write(), "v_scale": torch.tensor([1.5, 0.75])}
    cache = args["kv_cache"]
    write = writer(host, "fp8_e5m2")
    write(**args, check_values=False)
    kept = getattr(cache, cache_ops._LAYER)
    write(**args, check_values=False)
    assert getattr(cache, cache_ops._LAYER) is kept
    new_k = args["k_scale"].clone()
    write(**{**args, "k_scale": new_k}, check_values=False)
    assert getattr(cache, cache_ops._LAYER) is not kept
    assert launches.args[-1][4].data_ptr() == new_k.data_ptr()
    copied = {**args, "kv_cache": torch.zeros_like(cache), "k_scale": new_k.double()}
    write(**copied, check_values=False)
    assert not hasattr(copied["kv_cache"], cache_ops._LAYER)
    copied["k_scale"].mul_(2)
    write(**copied, check_values=False)
    assert torch.equal(launches.args[-1][4], 2 * new_k)
