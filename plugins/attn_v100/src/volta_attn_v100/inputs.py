"""Input checks and input types: everything ``paged_attention`` and the vLLM backend refuse.

Every problem with a call's inputs is one :class:`AttentionInputError` naming what is wrong,
raised before any kernel is launched: a bad head size, dtype or stride would otherwise read the
cache at the wrong place, and a block table pointing past the cache would read another layer's
memory. Here: the cache's storage dtypes (:data:`KV_STORAGE`) and its view as the kernels read
it (:func:`cache_view`), the fp8 scales (:class:`KVScales`, :func:`kv_scales`), the checks of
shapes, dtypes, devices, strides and bounds (:func:`check_inputs`, :func:`check_lengths`,
:func:`check_step_tensors`), of masking (:func:`check_masking`), of the kernel a call asks for
(:func:`check_path`, :func:`check_num_splits`, :func:`check_kv_dtype`), and the span of the
cache's addresses (:func:`cache_span`). The launchers (:mod:`volta_attn_v100.ops`) call them;
nothing here launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from volta_attn_v100.dispatch import table_for
from volta_attn_v100.launch import ATTENTION_DIVISIBLE, aligned_strides_required
from volta_attn_v100.limits import HEAD_SIZES, MAX_DECODE_QUERY_LEN, MAX_SPLITS, kv_dtype_refusal
from volta_attn_v100.tables import LaunchTable
from volta_core.kernel_api import device_facts

#: Storage dtype of the cache tensor for each KV dtype (fp8 caches are bytes in vLLM).
KV_STORAGE: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "fp8_e5m2": torch.uint8,
    "fp8_e4m3": torch.uint8,
}

#: The torch fp8 dtype a cache of each fp8 KV dtype may also hold (viewed as its bytes).
_TORCH_FP8: dict[str, torch.dtype] = {
    "fp8_e5m2": torch.float8_e5m2,
    "fp8_e4m3": torch.float8_e4m3fn,
}


class AttentionInputError(ValueError):
    """Input the Volta attention kernels cannot run, found before any launch."""


@dataclass(frozen=True)
class KVScales:
    """Dequantization scales of an fp8 cache: one per tensor or one per KV head (float32)."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def stride(self) -> int:
        """0 for a per-tensor scale, 1 for per-head scales (the kernels' ``scale_stride``)."""
        return 0 if self.k.numel() == 1 else 1


def _fail(message: str) -> None:
    raise AttentionInputError(message)


def cache_view(kv_cache: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """The cache as the kernels read it: fp16, or fp8 (e5m2, or e4m3 from SM89) as raw bytes.

    A cache holding ``torch.float8_e5m2`` / ``torch.float8_e4m3fn`` for that KV dtype is viewed
    as ``uint8``; any other mismatch between the declared KV dtype and the tensor is an error
    (reading fp16 as bytes, or the reverse, would produce garbage silently), and so is an e4m3
    cache on a GPU below SM89 (:func:`volta_attn_v100.limits.kv_dtype_refusal`; the
    interpreter on CPU tensors decodes it in integer arithmetic).
    """
    if kv_cache_dtype not in KV_STORAGE:
        _fail(
            f"KV-cache dtype {kv_cache_dtype!r} is not supported by the Volta attention kernels "
            f"(supported: {', '.join(sorted(KV_STORAGE))})"
        )
    if kv_cache.device.type == "cuda":
        refusal = kv_dtype_refusal(kv_cache_dtype, device_facts(kv_cache.device).capability)
        if refusal:
            _fail(refusal)
    if kv_cache.dtype == _TORCH_FP8.get(kv_cache_dtype):
        kv_cache = kv_cache.view(torch.uint8)
    expected = KV_STORAGE[kv_cache_dtype]
    if kv_cache.dtype != expected:
        _fail(
            f"KV cache tensor has dtype {kv_cache.dtype} but the layer's KV-cache dtype is "
            f"{kv_cache_dtype!r}, stored as {expected}"
        )
    return kv_cache


_UNIT_SCALES: dict[torch.device, torch.Tensor] = {}


def _unit_scale(device: torch.device) -> torch.Tensor:
    """A cached 1.0 per device: no host-to-device copy per call (decode runs in microseconds)."""
    if device not in _UNIT_SCALES:
        _UNIT_SCALES[device] = torch.ones(1, dtype=torch.float32, device=device)
    return _UNIT_SCALES[device]


def kv_scales(
    k_scale: torch.Tensor | float | None,
    v_scale: torch.Tensor | float | None,
    num_kv_heads: int,
    device: torch.device,
    *,
    check_values: bool,
) -> KVScales:
    """Scales as float32 vectors; with ``check_values`` also finite and positive (the cache
    stores ``x / scale``, as the fp8kv plugin writes it). Checking the values reads them back
    to the host, so the vLLM backend checks each layer's scales once, when its metadata
    builder is made after the weights are loaded, and never in a step."""
    out = []
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if value is None:
            out.append(_unit_scale(device))
            continue
        t = torch.as_tensor(value, dtype=torch.float32, device=device).reshape(-1).contiguous()
        if t.numel() not in (1, num_kv_heads):
            _fail(
                f"{name} has {t.numel()} elements; expected 1 (per tensor) or "
                f"{num_kv_heads} (per KV head)"
            )
        if check_values and not bool((torch.isfinite(t) & (t > 0)).all()):
            _fail(f"{name} must be finite and positive, got {t.tolist()}")
        out.append(t)
    if out[0].numel() != out[1].numel():
        _fail("k_scale and v_scale must have the same granularity (both per tensor or per head)")
    return KVScales(out[0], out[1])


def check_lengths(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    num_tokens: int,
    block_size: int,
    block_table_columns: int,
) -> None:
    """The bounds a step's lengths decide, from CPU tensors: query offsets that start at 0
    and end within ``num_tokens``, no sequence with more new tokens than tokens in all (or
    fewer than none), and the longest sequence's blocks within the block table's columns.

    ``seq_lens`` may be upper bounds (vLLM 0.32's ``seq_lens_cpu_upper_bound``, or
    ``max_seq_len`` for every sequence): a bound only makes the check looser, never wrong.
    """
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape != (num_seqs + 1,):
        _fail(
            f"{num_seqs} sequences need query_start_loc of {num_seqs + 1} entries, got "
            f"{tuple(query_start_loc.shape)}"
        )
    if num_seqs == 0:
        return
    first, last = int(query_start_loc[0]), int(query_start_loc[-1])
    if first != 0 or last > num_tokens:
        _fail(
            f"query_start_loc must start at 0 and end within {num_tokens} tokens, "
            f"got {query_start_loc.tolist()}"
        )
    longest = int(seq_lens.max())
    pages = -(-longest // block_size)
    if pages > block_table_columns:
        _fail(
            f"a sequence of {longest} tokens needs {pages} blocks but the block "
            f"table has {block_table_columns} columns"
        )
    q_lens = query_start_loc.diff()
    bad = (q_lens < 0) | (q_lens > seq_lens)
    if bool(bad.any()):
        seq = int(bad.nonzero()[0, 0])
        _fail(
            f"sequence {seq} has {int(q_lens[seq])} query tokens but only {int(seq_lens[seq])} "
            "tokens in all"
        )


def check_inputs(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    sinks: torch.Tensor | None,
    *,
    check_bounds: bool,
    table: LaunchTable | None = None,
) -> None:
    """Shapes, dtypes, devices and (when ``check_bounds``) the lengths and the block table's
    targets; the strides a head size needs aligned under ``table`` (default: the device's).

    ``check_bounds`` reads the block table, sequence lengths and query offsets back to the host
    (a synchronisation), so the vLLM backend passes False: its metadata builder checks the
    lengths once a step from vLLM's host copies (:func:`check_lengths`), and the block ids
    behind the block table and slots come from vLLM's block pool, which only holds ids below
    the cache's block count (``BlockPool.__init__`` in ``vllm/v1/core/block_pool.py``).
    """
    if query.dim() != 3:
        _fail(f"query must be [num_tokens, num_heads, head_size], got shape {tuple(query.shape)}")
    num_tokens, num_heads, head_size = query.shape
    if head_size not in HEAD_SIZES:
        _fail(
            f"head size {head_size} is not supported by the Volta attention kernels "
            f"(supported: {', '.join(map(str, HEAD_SIZES))})"
        )
    if query.dtype != torch.float16:
        _fail(f"query dtype {query.dtype} is not supported: the Volta kernels run float16")
    if out.shape != query.shape or out.dtype != torch.float16:
        _fail(
            f"output must be float16 of shape {tuple(query.shape)}, "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    if query.stride(2) != 1 or out.stride(2) != 1:
        _fail("query and output must be contiguous in the head dimension")
    if kv_cache.dim() != 4 or kv_cache.shape[3] != 2 * head_size:
        _fail(
            "KV cache must be [num_blocks, num_kv_heads, block_size, 2 * head_size] = "
            f"[*, *, *, {2 * head_size}], got {tuple(kv_cache.shape)}"
        )
    if kv_cache.stride(3) != 1:
        _fail("KV cache must be contiguous in its last (K|V) dimension")
    num_kv_heads, block_size = kv_cache.shape[1], kv_cache.shape[2]
    if num_heads % num_kv_heads:
        _fail(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if block_size % 16:
        _fail(f"block size {block_size} is not a multiple of 16")
    if table is None:
        table = table_for(device_facts(query.device).capability)
    if aligned_strides_required(table, head_size):
        values = {
            "stride_qt": (query.stride(0), "query token stride"),
            "stride_qh": (query.stride(1), "query head stride"),
            "stride_ot": (out.stride(0), "output token stride"),
            "stride_oh": (out.stride(1), "output head stride"),
            "stride_blk": (kv_cache.stride(0), "KV cache block stride"),
            "stride_kvh": (kv_cache.stride(1), "KV cache head stride"),
            "stride_slot": (kv_cache.stride(2), "KV cache slot stride"),
        }
        odd = [values[arg] for arg in ATTENTION_DIVISIBLE if values[arg][0] % 16]
        if odd:
            _fail(
                f"head size {head_size} on this device needs strides that are multiples of 16 "
                "elements (its tiles are compiled for aligned rows); got "
                + ", ".join(f"{what} {value}" for value, what in odd)
            )
    devices = {t.device for t in (query, kv_cache, out)}
    if len(devices) != 1 or block_table.device not in devices:
        devices |= {t.device for t in (block_table, seq_lens, query_start_loc)}
        _fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    check_step_tensors(block_table, seq_lens, query_start_loc)
    num_seqs = seq_lens.shape[0]
    if sinks is not None and (sinks.shape != (num_heads,) or sinks.device != query.device):
        _fail(f"sinks must have one value per query head ({num_heads}) on {query.device}")
    if not check_bounds or num_seqs == 0:
        return
    lens = seq_lens.cpu()
    check_lengths(query_start_loc.cpu(), lens, num_tokens, block_size, block_table.shape[1])
    pages_needed = (lens.to(torch.int64) + block_size - 1) // block_size
    used = (
        torch.arange(block_table.shape[1], device=block_table.device)[None, :]
        < pages_needed.to(block_table.device)[:, None]
    )
    rows = block_table[:num_seqs]
    bad = used & ((rows < 0) | (rows >= kv_cache.shape[0]))
    if bool(bad.any()):
        seq, col = (int(i) for i in bad.nonzero()[0])
        _fail(
            f"block table entry [{seq}, {col}] = {int(rows[seq, col])} points past the KV cache "
            f"of {kv_cache.shape[0]} blocks"
        )


def check_step_tensors(
    block_table: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor
) -> None:
    """A step's batch tensors, as every layer reads them: int32 on one device, a 2-D block
    table contiguous in its last dimension with a row per sequence, one more query offset than
    sequences. Shapes and dtypes only: nothing is read back (the vLLM backend's metadata
    builder calls this once a step)."""
    devices = {t.device for t in (block_table, seq_lens, query_start_loc)}
    if len(devices) != 1:
        _fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    for name, t in (
        ("block_table", block_table),
        ("seq_lens", seq_lens),
        ("query_start_loc", query_start_loc),
    ):
        if t.dtype != torch.int32:
            _fail(f"{name} must be int32, got {t.dtype}")
    if block_table.dim() != 2 or block_table.stride(1) != 1:
        _fail("block_table must be a 2-D tensor contiguous in its last dimension")
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape != (num_seqs + 1,) or block_table.shape[0] < num_seqs:
        _fail(
            f"{num_seqs} sequences need query_start_loc of {num_seqs + 1} entries and a block "
            f"table of at least {num_seqs} rows; got {tuple(query_start_loc.shape)} and "
            f"{tuple(block_table.shape)}"
        )


def check_masking(sliding_window: int | None, logits_soft_cap: float) -> None:
    """Refuse a sliding window that is not positive and a negative soft cap (0 is none)."""
    if sliding_window is not None and sliding_window <= 0:
        _fail(f"sliding window must be positive, got {sliding_window}")
    if logits_soft_cap < 0:
        _fail(f"logits soft cap must be 0 (none) or positive, got {logits_soft_cap}")


def check_path(path: str | None, max_query_len: int) -> str:
    """The kernel a call runs: ``path`` as given, or by query length (decode up to
    :data:`~volta_attn_v100.limits.MAX_DECODE_QUERY_LEN` new tokens per sequence, else prefill);
    refuses a path that is neither and a decode of longer queries."""
    if path is None:
        path = "decode" if max_query_len <= MAX_DECODE_QUERY_LEN else "prefill"
    if path == "decode" and max_query_len > MAX_DECODE_QUERY_LEN:
        _fail(
            f"the decode kernel takes at most {MAX_DECODE_QUERY_LEN} query tokens per sequence, "
            f"got {max_query_len}"
        )
    if path not in ("decode", "prefill"):
        _fail(f"path must be 'decode' or 'prefill', got {path!r}")
    return path


def check_num_splits(path: str, num_splits: int | None) -> None:
    """Refuse decode partitions per sequence outside 1..:data:`~volta_attn_v100.limits.MAX_SPLITS`
    (None: the table's split policy decides; the prefill has no partitions)."""
    if path == "decode" and num_splits is not None and not 1 <= num_splits <= MAX_SPLITS:
        _fail(f"num_splits must be in 1..{MAX_SPLITS}, got {num_splits}")


def check_kv_dtype(kv_cache_dtype: str) -> None:
    """Refuse a KV-cache dtype name the kernels do not read (no tensor: the split policy's)."""
    if kv_cache_dtype not in KV_STORAGE:
        _fail(f"KV-cache dtype must be one of {', '.join(KV_STORAGE)}, got {kv_cache_dtype!r}")


def cache_span(t: torch.Tensor) -> int:
    """Elements from a tensor's first to its last through its strides, both included (a view
    into a larger buffer spans only what it can address; an empty tensor spans none)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
