"""Host wrappers: check every input, then launch the cache-write and gather kernels.

Every problem with the inputs is one :class:`KVCacheInputError` (a ``ValueError``) naming what is
wrong, raised before any kernel launch: nothing is written out of bounds, dropped or garbled.
Checking slot indices and block-table entries against the cache needs one device-to-host read;
``check_indices=False`` skips it for callers that guarantee them (a CUDA-graph-captured step),
and the kernels still mask anything outside the cache so memory stays safe.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch

from volta_core import FP8_E4M3_MIN_CAPABILITY
from volta_core.kernel_api import device_facts, interpreting
from volta_fp8kv import configs
from volta_fp8kv.format import CacheFormat, cache_format
from volta_fp8kv.scales import KVScales

_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class KVCacheInputError(ValueError):
    """An input the cache kernels refuse: wrong shape, dtype, device, index or scale."""


def format_for(kv_cache_dtype: str) -> CacheFormat:
    """The format of a ``--kv-cache-dtype`` spelling, or :class:`KVCacheInputError`."""
    try:
        return cache_format(kv_cache_dtype)
    except ValueError as exc:
        raise KVCacheInputError(str(exc)) from None


def storage_view(fmt: CacheFormat, cache: torch.Tensor) -> torch.Tensor:
    """The cache as the kernels address it: fp16 values, or FP8 codes as ``uint8``.

    vLLM allocates FP8 caches as ``uint8`` or as the torch FP8 dtype of the format; the latter
    is viewed as its bytes. Any other dtype is refused (reading fp16 as codes, or the reverse,
    garbles silently), and so is an e4m3 cache on a GPU below SM89 (the Triton interpreter runs
    the shared integer codec for every format, so CPU tensors take e4m3 too).
    """
    if fmt.torch_fp8_dtype is not None and cache.dtype == fmt.torch_fp8_dtype:
        cache = cache.view(torch.uint8)
    if cache.dtype != fmt.storage_dtype:
        what = (
            f"uint8 codes or {fmt.torch_fp8_dtype}"
            if fmt.storage_dtype == torch.uint8
            else "float16 values"
        )
        raise KVCacheInputError(
            f"a {fmt.value} cache holds {what}, but the cache tensor is {cache.dtype}"
        )
    if fmt.needs_e4m3 and not interpreting():
        capability = device_facts(cache.device).capability
        if capability < FP8_E4M3_MIN_CAPABILITY:
            raise KVCacheInputError(
                "fp8_e4m3 caches need compute capability "
                f"{'.'.join(map(str, FP8_E4M3_MIN_CAPABILITY))} or newer; {cache.device} is "
                f"{capability}: use fp8_e5m2"
            )
    return cache


def _check_rank(cache: torch.Tensor) -> None:
    if cache.dim() != 4:
        raise KVCacheInputError(
            "the cache must be 4-D [num_blocks, num_kv_heads, block_size, head_size_k + "
            f"head_size_v], got shape {tuple(cache.shape)}"
        )


def _check_cache(cache: torch.Tensor, num_kv_heads: int, entry: int) -> None:
    _check_rank(cache)
    if cache.shape[1] != num_kv_heads or cache.shape[3] != entry:
        raise KVCacheInputError(
            f"the cache has shape {tuple(cache.shape)}: expected [num_blocks, {num_kv_heads}, "
            f"block_size, {entry}] for {num_kv_heads} KV heads and head_size_k + head_size_v "
            f"= {entry}"
        )
    if cache.stride(3) != 1:
        raise KVCacheInputError(
            f"the cache's last dim must be contiguous (stride 1), got strides {cache.stride()}"
        )


def _check_head_sizes(head_size_k: int, head_size_v: int) -> None:
    if configs.head_pad(head_size_k, head_size_v) > configs.HEAD_PADS[-1]:
        raise KVCacheInputError(
            f"head sizes {head_size_k}/{head_size_v} are above the largest configured head "
            f"({configs.HEAD_PADS[-1]})"
        )


# Scales made from numbers, kept for the life of the process and never dropped: a captured CUDA
# graph reads a tensor's memory on every replay, so freeing one (as an LRU cache's eviction
# would) could hand memory the graph still reads to other data. The table is bounded by what
# fills it: a model's layers have a fixed set of scale values, at most two per layer.
_constant_scales: dict[tuple[float, float, torch.device], KVScales] = {}
_constant_lock = threading.Lock()


def constant_scales(k: float, v: float, device: torch.device) -> KVScales:
    """Per-tensor scales given as numbers, made once per value and device rather than at every
    write (unscaled writes allocate nothing), and never freed while the process runs."""
    key = (k, v, device)
    scales = _constant_scales.get(key)
    if scales is not None:
        return scales
    if not (math.isfinite(k) and math.isfinite(v)):
        raise KVCacheInputError(f"scales must be finite numbers, got {k} and {v}")
    with _constant_lock:
        return _constant_scales.setdefault(
            key,
            KVScales(
                torch.full((1,), k, dtype=torch.float32, device=device),
                torch.full((1,), v, dtype=torch.float32, device=device),
            ),
        )


def _check_scales(
    scales: KVScales | None, fmt: CacheFormat, num_kv_heads: int, device: torch.device
) -> KVScales:
    if scales is None:
        return constant_scales(1.0, 1.0, device)
    if not isinstance(scales, KVScales):
        raise KVCacheInputError(
            f"scales must be a KVScales (built by volta_fp8kv.scales), got {type(scales).__name__}"
        )
    for name, tensor in (("k_scale", scales.k), ("v_scale", scales.v)):
        if tensor.dtype != torch.float32 or tensor.dim() != 1:
            raise KVCacheInputError(
                f"{name} must be 1-D float32, got {tensor.dtype} {tuple(tensor.shape)}"
            )
        if tensor.numel() not in (1, num_kv_heads):
            raise KVCacheInputError(
                f"{name} has {tensor.numel()} values for {num_kv_heads} KV heads on this rank: "
                "give one value (per-tensor) or one per KV head (shard per-head scales with "
                "volta_fp8kv.scales.shard_per_head)"
            )
        if tensor.device != device:
            raise KVCacheInputError(f"{name} is on {tensor.device}, the cache on {device}")
    if scales.k.numel() != scales.v.numel():
        # One stride serves both: expand a per-tensor side to per-head.
        scales = KVScales(
            scales.k.expand(num_kv_heads).contiguous(), scales.v.expand(num_kv_heads).contiguous()
        )
    return scales


def check_write(
    key: torch.Tensor,
    value: torch.Tensor,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    fmt: CacheFormat,
) -> torch.Tensor:
    """Refuse a write whose tensors do not fit together; return the cache's storage view.

    Reads only shapes, strides, dtypes and devices (no device-to-host copy). ``slot_mapping``
    may be longer than the batch (vLLM pads it): only its first ``num_tokens`` entries are used.
    """
    check_step(key, value, slot_mapping, fmt, cache.device)
    cache = storage_view(fmt, cache)
    _check_cache(cache, key.shape[1], key.shape[2] + value.shape[2])
    return cache


def check_step(
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    fmt: CacheFormat,
    device: torch.device,
) -> None:
    """The checks of :func:`check_write` on what a step passes (the cache's own are the
    layer's, :func:`check_write` makes them): ``device`` is the cache's."""
    if key.dim() != 3 or value.dim() != 3:
        raise KVCacheInputError(
            f"key and value must be 3-D [num_tokens, num_kv_heads, head_size], got "
            f"{tuple(key.shape)} and {tuple(value.shape)}"
        )
    num_tokens, _, head_size_k = key.shape
    if value.shape[:2] != key.shape[:2]:
        raise KVCacheInputError(
            f"key {tuple(key.shape)} and value {tuple(value.shape)} disagree on tokens or heads"
        )
    head_size_v = value.shape[2]
    _check_head_sizes(head_size_k, head_size_v)
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dtype not in _INPUT_DTYPES:
            raise KVCacheInputError(
                f"{name} must be float16, bfloat16 or float32, got {tensor.dtype}"
            )
        if tensor.stride(2) != 1:
            raise KVCacheInputError(
                f"{name}'s last dim must be contiguous, strides {tensor.stride()}"
            )
        if tensor.device != device:
            raise KVCacheInputError(f"{name} is on {tensor.device}, the cache on {device}")
    if fmt is CacheFormat.FLOAT16 and (key.dtype != torch.float16 or value.dtype != torch.float16):
        raise KVCacheInputError(
            f"a float16 cache stores float16 K/V, got {key.dtype}/{value.dtype}"
        )
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] < num_tokens:
        raise KVCacheInputError(
            f"slot_mapping must be 1-D with at least one slot per token ({num_tokens}), got "
            f"shape {tuple(slot_mapping.shape)}"
        )
    if slot_mapping.dtype not in (torch.int32, torch.int64) or slot_mapping.device != device:
        raise KVCacheInputError(
            f"slot_mapping must be int32/int64 on {device}, got {slot_mapping.dtype} on "
            f"{slot_mapping.device}"
        )
    if num_tokens > 1 and slot_mapping.stride(0) != 1:
        raise KVCacheInputError(
            f"slot_mapping must be contiguous, got stride {slot_mapping.stride(0)}"
        )


def check_slots(slot_mapping: torch.Tensor, num_tokens: int, cache: torch.Tensor) -> None:
    """Refuse slots past the cache (reads the batch's slots back to the host)."""
    if num_tokens == 0:
        return
    num_blocks, _, block_size, _ = cache.shape
    top = int(slot_mapping[:num_tokens].max())
    if top >= num_blocks * block_size:
        raise KVCacheInputError(
            f"slot_mapping holds slot {top}, past the cache's {num_blocks * block_size} slots "
            f"({num_blocks} blocks of {block_size})"
        )


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    scales: KVScales | None = None,
    *,
    check_indices: bool = True,
) -> None:
    """Store ``key``/``value`` (``[num_tokens, num_kv_heads, head_size_k|v]``) into ``cache``.

    Token ``i`` goes to slot ``slot_mapping[i]``; negative slots are padding and are skipped.
    FP8 formats store ``fp8(x · (1/scale))`` (scales per tensor or per KV head; None means 1.0);
    float16 stores the values unchanged and ignores scales.
    """
    fmt = format_for(kv_cache_dtype)
    cache = check_write(key, value, cache, slot_mapping, fmt)
    scales = _check_scales(scales, fmt, key.shape[1], cache.device)
    if check_indices:
        check_slots(slot_mapping, key.shape[0], cache)
    launch_cache_write(key, value, cache, slot_mapping, fmt, scales)


def launch_cache_write(
    key: torch.Tensor,
    value: torch.Tensor,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    fmt: CacheFormat,
    scales: KVScales,
) -> None:
    """Launch the cache write on inputs :func:`check_write` has checked (``cache`` its storage
    view): no host reads and no allocation, so a captured CUDA graph can hold it."""
    cache_launch(cache, fmt, scales, key.shape[2], value.shape[2]).run(key, value, slot_mapping)


@dataclass(frozen=True)
class CacheLaunch:
    """A layer's cache write as far as it follows from the layer alone (its checked cache's
    storage view, format, scales and head sizes): made once per layer by a caller that keeps
    it (:func:`volta_fp8kv.cache_ops.write`), launched per step by :meth:`run`."""

    cache: torch.Tensor
    scales: KVScales
    block_size: int
    slots: int
    strides: tuple[int, int, int]
    per_head: int
    num_warps: int
    constexprs: dict[str, int | bool]

    def run(self, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Launch the write of ``key``/``value`` (checked against the layer): no host reads
        and no allocation."""
        num_tokens, num_kv_heads, head_size_k = key.shape
        if num_tokens == 0:
            return
        from volta_fp8kv.kernels.cache_write import cache_write_kernel

        grid = (triton_cdiv(num_tokens, self.constexprs["BLOCK_T"]), num_kv_heads)
        cache_write_kernel[grid](
            key, value, self.cache, slot_mapping, self.scales.k, self.scales.v, num_tokens,
            self.slots, self.block_size, head_size_k, value.shape[2], key.stride(0),
            key.stride(1), value.stride(0), value.stride(1), *self.strides, self.per_head,
            **self.constexprs,
            num_warps=self.num_warps,
            num_stages=1,
        )  # fmt: skip


def cache_launch(
    cache: torch.Tensor, fmt: CacheFormat, scales: KVScales, head_size_k: int, head_size_v: int
) -> CacheLaunch:
    """The :class:`CacheLaunch` of a checked cache (its storage view) and scales."""
    num_blocks, _, block_size, _ = cache.shape
    pad = configs.head_pad(head_size_k, head_size_v)
    block_t, num_warps = configs.tile(device_facts(cache.device).capability, pad)
    return CacheLaunch(
        cache,
        scales,
        block_size,
        num_blocks * block_size,
        (cache.stride(0), cache.stride(1), cache.stride(2)),
        1 if scales.per_head else 0,
        num_warps,
        {
            "FMT": fmt.kernel_code,
            "HEAD_PAD": pad,
            "FULL": head_size_k == head_size_v == pad,
            "BLOCK_T": block_t,
        },
    )


def gather_kv_cache(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_cache_dtype: str,
    head_size_k: int,
    scales: KVScales | None = None,
    *,
    max_seq_len: int | None = None,
    out_dtype: torch.dtype = torch.float16,
    check_indices: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached K and V of each sequence, dequantized, as ``[sum(seq_lens), H, head_size]``.

    Sequence ``i`` has ``seq_lens[i]`` tokens whose blocks are ``block_table[i, :]`` (int32, as
    vLLM's block table); its rows start at ``sum(seq_lens[:i])``. Values are
    ``decode(code) * scale`` rounded once to ``out_dtype``.
    """
    fmt = format_for(kv_cache_dtype)
    cache = storage_view(fmt, cache)
    _check_rank(cache)
    num_blocks, num_kv_heads, block_size, entry = cache.shape
    head_size_v = entry - head_size_k
    if not 0 < head_size_k < entry:
        raise KVCacheInputError(
            f"head_size_k {head_size_k} does not split the cache's last dim of {entry} into K and V"
        )
    _check_cache(cache, num_kv_heads, entry)
    if out_dtype not in (torch.float16, torch.float32):
        raise KVCacheInputError(
            f"out_dtype must be float16 (the workspace) or float32 (verification), got {out_dtype}"
        )
    if block_table.dim() != 2 or block_table.dtype != torch.int32:
        raise KVCacheInputError(
            f"block_table must be 2-D int32 [num_seqs, max_blocks], got {block_table.dtype} "
            f"{tuple(block_table.shape)}"
        )
    if block_table.stride(1) != 1:
        raise KVCacheInputError("block_table rows must be contiguous")
    num_seqs = block_table.shape[0]
    if seq_lens.dim() != 1 or seq_lens.shape[0] != num_seqs or seq_lens.dtype != torch.int32:
        raise KVCacheInputError(
            f"seq_lens must be 1-D int32 with one length per sequence ({num_seqs}), got "
            f"{seq_lens.dtype} {tuple(seq_lens.shape)}"
        )
    for name, tensor in (("block_table", block_table), ("seq_lens", seq_lens)):
        if tensor.device != cache.device:
            raise KVCacheInputError(f"{name} is on {tensor.device}, the cache on {cache.device}")
    scales = _check_scales(scales, fmt, num_kv_heads, cache.device)
    # The output size is a host number: one read of seq_lens is unavoidable.
    lens_host = seq_lens.cpu()
    if num_seqs and int(lens_host.min()) < 0:
        raise KVCacheInputError(f"seq_lens holds a negative length {int(lens_host.min())}")
    longest = int(lens_host.max()) if num_seqs else 0
    if longest > block_table.shape[1] * block_size:
        raise KVCacheInputError(
            f"a sequence of {longest} tokens needs {triton_cdiv(longest, block_size)} blocks, "
            f"but block_table has {block_table.shape[1]} columns"
        )
    if max_seq_len is not None and max_seq_len < longest:
        raise KVCacheInputError(
            f"max_seq_len {max_seq_len} is below the longest sequence {longest}"
        )
    total = int(lens_host.sum())
    key = torch.empty((total, num_kv_heads, head_size_k), dtype=out_dtype, device=cache.device)
    value = torch.empty((total, num_kv_heads, head_size_v), dtype=out_dtype, device=cache.device)
    if total == 0:
        return key, value
    if check_indices:
        used = torch.arange(block_table.shape[1]) < (
            (lens_host[:, None] + block_size - 1) // block_size
        )
        entries = block_table.cpu()[used]
        if entries.numel() and (int(entries.min()) < 0 or int(entries.max()) >= num_blocks):
            bad = int(entries.max()) if int(entries.max()) >= num_blocks else int(entries.min())
            raise KVCacheInputError(
                f"block_table holds block {bad}, outside the cache's {num_blocks} blocks"
            )
    cu_seqlens = torch.zeros(num_seqs, dtype=torch.int32)
    cu_seqlens[1:] = torch.cumsum(lens_host, 0)[:-1]
    launch_gather(
        cache,
        block_table,
        seq_lens,
        cu_seqlens.to(cache.device),
        max_seq_len or longest,
        key,
        value,
        fmt,
        scales,
    )
    return key, value


def launch_gather(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seq_len: int,
    key_out: torch.Tensor,
    value_out: torch.Tensor,
    fmt: CacheFormat,
    scales: KVScales,
) -> None:
    """Launch the gather on inputs :func:`gather_kv_cache` has checked: no host reads, so a
    caller with a preallocated workspace (or a captured CUDA graph) can reuse it per step.
    """
    num_blocks, num_kv_heads, block_size, _ = cache.shape
    head_size_k, head_size_v = key_out.shape[2], value_out.shape[2]
    pad = configs.head_pad(head_size_k, head_size_v)
    block_t, num_warps = configs.tile(device_facts(cache.device).capability, pad)
    from volta_fp8kv.kernels.gather import gather_kernel

    grid = (block_table.shape[0], triton_cdiv(max_seq_len, block_t), num_kv_heads)
    gather_kernel[grid](
        cache,
        key_out,
        value_out,
        block_table,
        seq_lens,
        cu_seqlens,
        scales.k,
        scales.v,
        num_blocks,
        block_size,
        head_size_k,
        head_size_v,
        block_table.stride(0),
        cache.stride(0),
        cache.stride(1),
        cache.stride(2),
        key_out.stride(0),
        key_out.stride(1),
        value_out.stride(0),
        value_out.stride(1),
        1 if scales.per_head else 0,
        FMT=fmt.kernel_code,
        HEAD_PAD=pad,
        FULL=head_size_k == head_size_v == pad,
        BLOCK_T=block_t,
        num_warps=num_warps,
        num_stages=1,
    )


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
