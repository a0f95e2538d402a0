"""Launchers: check the inputs once, pick the tiles for the device, launch the kernels.

Every problem with the inputs is one :class:`AttentionInputError` naming what is wrong, raised
before any kernel is launched: a bad head size, dtype or stride would otherwise read the cache
at the wrong place, and a block table pointing past the cache would read another layer's memory.

``paged_attention`` serves every batch vLLM sends: batches whose sequences all have at most
:data:`~volta_attn_v100.limits.MAX_DECODE_QUERY_LEN` new tokens go to the split-KV decode
kernel (one launch: its partitions combine themselves), anything longer to the prefill
kernel. Both read all keys from the paged cache (vLLM writes the new tokens' K/V there
first), which covers chunked prefill, prefix caching and mixed batches. Which kernel runs a
call and its launch come from :func:`volta_attn_v100.dispatch.choose`, over the device family's
table or over a table the caller passes (benchmark variants, tests that force a kernel form);
the one thing decided here is whether a CUDA choice can run now (its build loaded on this
device, tensors its vector loads can read), else its Triton fallback runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from volta_attn_v100.dispatch import AttentionCall, choose, table_for
from volta_attn_v100.launch import (
    ATTENTION_DIVISIBLE,
    CudaDecodeLaunch,
    CudaPrefillLaunch,
    DecodeLaunch,
    Launch,
    PrefillLaunch,
    aligned_strides_required,
    split_count,
)
from volta_attn_v100.limits import (
    HEAD_SIZES,
    MAX_DECODE_QUERY_LEN,
    MAX_SPLITS,
    head_pad,
    kv_dtype_refusal,
)
from volta_attn_v100.tables import LaunchTable
from volta_core.kernel_api import Choice, arrival_counters, device_facts

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
    devices = {t.device for t in (query, kv_cache, block_table, seq_lens, query_start_loc, out)}
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


def check_masking(sliding_window: int | None, logits_soft_cap: float) -> None:
    """Refuse a sliding window that is not positive and a negative soft cap (0 is none)."""
    if sliding_window is not None and sliding_window <= 0:
        _fail(f"sliding window must be positive, got {sliding_window}")
    if logits_soft_cap < 0:
        _fail(f"logits soft cap must be 0 (none) or positive, got {logits_soft_cap}")


def default_num_splits(
    num_seqs: int,
    num_kv_programs: int,
    max_seq_len: int,
    device: torch.device | str,
    kv_cache_dtype: str = "float16",
    table: LaunchTable | None = None,
) -> int:
    """Decode partitions per sequence on ``device`` under ``table``'s split policy for the KV
    dtype (default: the device family's table, :func:`volta_attn_v100.dispatch.table_for`)."""
    if kv_cache_dtype not in KV_STORAGE:
        _fail(f"KV-cache dtype must be one of {', '.join(KV_STORAGE)}, got {kv_cache_dtype!r}")
    facts = device_facts(torch.device(device))
    table = table if table is not None else table_for(facts.capability)
    fp8 = kv_cache_dtype != "float16"
    return split_count(table, fp8, num_seqs, num_kv_programs, max_seq_len, facts.sm_count)


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    *,
    max_query_len: int,
    max_seq_len: int,
    sm_scale: float,
    kv_cache_dtype: str = "float16",
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
    num_splits: int | None = None,
    table: LaunchTable | None = None,
    path: str | None = None,
    check_bounds: bool = True,
) -> torch.Tensor:
    """Causal attention of ``query`` over the paged KV cache, written into ``out``.

    :param query: ``[num_tokens, num_heads, head_size]`` float16; the tokens of sequence ``i``
        are ``query_start_loc[i]:query_start_loc[i + 1]`` and are its last tokens.
    :param kv_cache: one layer's cache ``[num_blocks, num_kv_heads, block_size, 2 * head_size]``
        (K then V in the last dimension, any strides for the first three), float16 or uint8
        (fp8 e5m2, also accepted as ``torch.float8_e5m2``, or from SM89 fp8 e4m3, also
        accepted as ``torch.float8_e4m3fn``).
    :param seq_lens: int32 total tokens of each sequence (cached prefix plus new tokens).
    :param k_scale: fp8 only: real K = stored K x k_scale (a float, one value, or one per KV
        head); applied to the scores after Q.K. ``v_scale`` likewise, applied to the
        probabilities before P.V. Ignored for a float16 cache.
    :param sliding_window: keys with ``q_pos - k_pos >= sliding_window`` are masked (vLLM's
        convention); None for full attention.
    :param logits_soft_cap: ``cap * tanh(s / cap)`` on the scaled scores; 0 for none.
    :param sinks: float32 per query head: a logit in every row's softmax denominator.
    :param num_splits: decode partitions per sequence (default: the table's split policy).
    :param table: the launch table (default: the device family's; the benchmark sweep and the
        tests pass changed copies).
    :param path: ``"decode"`` or ``"prefill"`` to force a kernel; default picks by query length.
    :param check_bounds: also check the lengths, the block table's entries and the scales'
        values, which reads them back to the host (:func:`check_inputs`).
    """
    facts = device_facts(query.device)
    table = table if table is not None else table_for(facts.capability)
    kv = cache_view(kv_cache, kv_cache_dtype)
    check_inputs(
        query,
        kv,
        block_table,
        seq_lens,
        query_start_loc,
        out,
        sinks,
        check_bounds=check_bounds,
        table=table,
    )
    check_masking(sliding_window, logits_soft_cap)
    if path is None:
        path = "decode" if max_query_len <= MAX_DECODE_QUERY_LEN else "prefill"
    if path == "decode" and max_query_len > MAX_DECODE_QUERY_LEN:
        _fail(
            f"the decode kernel takes at most {MAX_DECODE_QUERY_LEN} query tokens per sequence, "
            f"got {max_query_len}"
        )
    if path not in ("decode", "prefill"):
        _fail(f"path must be 'decode' or 'prefill', got {path!r}")
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or query.shape[0] == 0:
        return out
    if path == "decode" and num_splits is not None and not 1 <= num_splits <= MAX_SPLITS:
        _fail(f"num_splits must be in 1..{MAX_SPLITS}, got {num_splits}")
    num_kv_heads = kv.shape[1]
    scales = kv_scales(k_scale, v_scale, num_kv_heads, query.device, check_values=check_bounds)
    sinks_f32 = sinks.to(torch.float32).contiguous() if sinks is not None else scales.k
    args = _Common(
        query=query,
        kv=kv,
        block_table=block_table,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
        out=out,
        scales=scales,
        sinks=sinks_f32,
        has_sinks=int(sinks is not None),
        sm_scale=float(sm_scale),
        softcap=float(logits_soft_cap),
        window=int(sliding_window or 0),
    )
    num_tokens, num_heads, head_size = query.shape
    call = AttentionCall(
        head_size=head_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        kv_dtype=kv_cache_dtype,
        num_seqs=num_seqs,
        num_tokens=num_tokens,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        cache_span=cache_span(kv),
        page_size=kv.shape[2],
        num_splits=num_splits,
        path=path,
    )
    _run(args, choose(call, facts.capability, facts.sm_count, table))
    return out


@dataclass(frozen=True)
class _Common:
    """The tensors and runtime values both kernels take."""

    query: torch.Tensor
    kv: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    out: torch.Tensor
    scales: KVScales
    sinks: torch.Tensor
    has_sinks: int
    sm_scale: float
    softcap: float
    window: int

    @property
    def group(self) -> int:
        return self.query.shape[1] // self.kv.shape[1]


def cache_span(t: torch.Tensor) -> int:
    """Elements from a tensor's first to its last through its strides, both included (a view
    into a larger buffer spans only what it can address; an empty tensor spans none)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _launch_decode(a: _Common, launch: DecodeLaunch) -> None:
    from volta_attn_v100.kernels import paged_decode_kernel

    num_tokens, num_heads, _ = a.query.shape
    num_seqs = a.seq_lens.shape[0]
    device = a.query.device
    build = launch.build
    num_splits = launch.num_splits
    partials_dtype = torch.float16 if build.partials_f16 else torch.float32
    if num_splits > 1:
        part_acc = torch.empty(
            (num_tokens, num_heads, num_splits, head_pad(build.head_size)),
            dtype=partials_dtype,
            device=device,
        )
        part_ml = torch.empty(
            (num_tokens, num_heads, num_splits, 2), dtype=torch.float32, device=device
        )
        counters = arrival_counters(device, num_seqs * launch.kv_programs)
    else:
        # One partition writes the output itself: nothing to combine, nothing to count.
        part_ml = torch.empty(0, dtype=torch.float32, device=device)
        part_acc = torch.empty(0, dtype=partials_dtype, device=device)
        counters = torch.empty(0, dtype=torch.int32, device=device)
    paged_decode_kernel[(num_seqs, launch.kv_programs, num_splits)](
        a.query,
        a.kv,
        a.block_table,
        a.seq_lens,
        a.query_start_loc,
        a.scales.k,
        a.scales.v,
        a.sinks,
        a.out,
        part_acc,
        part_ml,
        counters,
        a.sm_scale,
        a.softcap,
        a.window,
        a.has_sinks,
        a.group,
        launch.heads_per_prog,
        launch.head_chunks,
        num_heads,
        num_splits,
        a.scales.stride,
        a.query.stride(0),
        a.query.stride(1),
        a.kv.stride(0),
        a.kv.stride(1),
        a.kv.stride(2),
        a.block_table.stride(0),
        a.out.stride(0),
        a.out.stride(1),
        **build.constexprs(),
        num_warps=build.tiles.num_warps,
        num_stages=build.tiles.num_stages,
    )


def _run(a: _Common, choice: Choice[Launch]) -> None:
    """Run ``choice``'s launch: a CUDA one where it can run now (:func:`_cuda_decode`,
    :func:`_cuda_prefill`), else its Triton fallback; a Triton one as it is."""
    launch = choice.launch
    if isinstance(launch, CudaDecodeLaunch) and _cuda_decode(a, launch):
        return
    if isinstance(launch, CudaPrefillLaunch) and _cuda_prefill(a, launch):
        return
    if choice.fallback is not None:
        launch = choice.fallback.launch
    if isinstance(launch, DecodeLaunch):
        _launch_decode(a, launch)
    elif isinstance(launch, PrefillLaunch):
        _launch_prefill(a, launch)
    else:
        raise TypeError(f"a CUDA choice needs a Triton fallback, got {choice!r}")


def _cuda_decode(a: _Common, launch: CudaDecodeLaunch) -> bool:
    """Run the decode on the SM70 tensor cores (:mod:`volta_attn_v100.cuda.decode`) as
    ``launch`` says where the tensors are on a CUDA device, the build loads there and the
    tensors allow its vector loads; False leaves it to the Triton fallback."""
    if not a.query.is_cuda:
        return False
    from volta_attn_v100.cuda import decode

    if not decode.ready(a.query.device, launch.head_size, launch.kv_dtype):
        return False
    if not decode.vector_aligned(a.query, a.kv):
        return False
    decode.launch(
        a.query, a.kv, a.block_table, a.seq_lens, a.query_start_loc, a.out,
        k_scale=a.scales.k, v_scale=a.scales.v, scale_stride=a.scales.stride, sinks=a.sinks,
        has_sinks=a.has_sinks, sm_scale=a.sm_scale, softcap=a.softcap, window=a.window,
        launch=launch,
    )  # fmt: skip
    return True


def _cuda_prefill(a: _Common, launch: CudaPrefillLaunch) -> bool:
    """Run the prefill on the SM70 tensor cores (:mod:`volta_attn_v100.cuda.prefill`) as
    ``launch`` says where the tensors are on a CUDA device, the build loads there and the cache
    allows its vector loads; False leaves it to the Triton fallback."""
    if not a.query.is_cuda:
        return False
    from volta_attn_v100.cuda import prefill

    if not prefill.ready(a.query.device, launch.head_size, launch.kv_dtype):
        return False
    if not prefill.vector_aligned(a.kv):
        return False
    prefill.launch(
        a.query, a.kv, a.block_table, a.seq_lens, a.query_start_loc, a.out,
        k_scale=a.scales.k, v_scale=a.scales.v, scale_stride=a.scales.stride, sinks=a.sinks,
        has_sinks=a.has_sinks, sm_scale=a.sm_scale, softcap=a.softcap, window=a.window,
        launch=launch,
    )  # fmt: skip
    return True


def _launch_prefill(a: _Common, launch: PrefillLaunch) -> None:
    from volta_attn_v100.kernels import paged_prefill_kernel

    build = launch.build
    paged_prefill_kernel[launch.grid](
        a.query,
        a.kv,
        a.block_table,
        a.seq_lens,
        a.query_start_loc,
        a.scales.k,
        a.scales.v,
        a.sinks,
        a.out,
        a.sm_scale,
        a.softcap,
        a.window,
        a.has_sinks,
        a.group,
        launch.heads_per_prog,
        launch.head_chunks,
        a.seq_lens.shape[0],
        a.scales.stride,
        a.query.stride(0),
        a.query.stride(1),
        a.kv.stride(0),
        a.kv.stride(1),
        a.kv.stride(2),
        a.block_table.stride(0),
        a.out.stride(0),
        a.out.stride(1),
        **build.constexprs(),
        num_warps=build.tiles.num_warps,
        num_stages=build.tiles.num_stages,
    )
