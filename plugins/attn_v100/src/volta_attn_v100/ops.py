"""Launchers: check the inputs once, pick the launch for the device, launch the kernels.

The checks are :mod:`volta_attn_v100.inputs`'s: every problem with a call's inputs is one
:class:`~volta_attn_v100.inputs.AttentionInputError` naming what is wrong, raised there before
any kernel is launched here.

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
from volta_attn_v100.inputs import (
    KVScales,
    cache_span,
    cache_view,
    check_inputs,
    check_kv_dtype,
    check_masking,
    check_num_splits,
    check_path,
    kv_scales,
)
from volta_attn_v100.launch import (
    CudaDecodeLaunch,
    CudaPrefillLaunch,
    DecodeLaunch,
    Launch,
    PrefillLaunch,
    split_count,
)
from volta_attn_v100.limits import head_pad
from volta_attn_v100.tables import LaunchTable
from volta_core.kernel_api import Choice, arrival_counters, device_facts


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
    check_kv_dtype(kv_cache_dtype)
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
        values, which reads them back to the host
        (:func:`~volta_attn_v100.inputs.check_inputs`).
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
    path = check_path(path, max_query_len)
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or query.shape[0] == 0:
        return out
    check_num_splits(path, num_splits)
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
