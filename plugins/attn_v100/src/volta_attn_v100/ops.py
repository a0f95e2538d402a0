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

The vLLM backend calls the parts separately, so a step's host work is done once where it can
be: :func:`layer_args` once per layer (scales, sinks cast to float32), a :class:`StepLaunches`
once per step (the metadata builder's), and :func:`run_attention` per layer, which chooses the
launch and makes the decode's partial buffers for the first layer of each shape in the step
and reuses them for the others (layers run one after another on the stream).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

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
    path = check_path(path, max_query_len)
    check_num_splits(path, num_splits)
    _, num_heads, head_size = query.shape
    layer = layer_args(
        num_heads,
        kv.shape[1],
        head_size,
        kv_cache_dtype,
        query.device,
        sm_scale=sm_scale,
        k_scale=k_scale,
        v_scale=v_scale,
        sinks=sinks,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        check_values=check_bounds,
    )
    step = StepLaunches(
        block_table,
        seq_lens,
        query_start_loc,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        num_splits=num_splits,
        path=path,
        table=table,
    )
    run_attention(layer, step, query, kv, out)
    return out


@dataclass(frozen=True)
class LayerArgs:
    """What one layer passes every kernel, the same at every step: its shapes and KV dtype
    (canonical), the fp8 scales as float32 vectors, the sinks as float32 (the K scale, unread,
    where it has none) and the masking."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    kv_dtype: str
    scales: KVScales
    sinks: torch.Tensor
    has_sinks: int
    sm_scale: float
    softcap: float
    window: int

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @functools.cached_property
    def kernel_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's tensors as both Triton kernels take them: K and V scales, sinks."""
        return self.scales.k, self.scales.v, self.sinks

    @functools.cached_property
    def kernel_values(self) -> tuple[float, float, int, int, int]:
        """The layer's numbers as both Triton kernels take them after the output (and the
        decode's partial buffers)."""
        return self.sm_scale, self.softcap, self.window, self.has_sinks, self.group

    @functools.cached_property
    def scale_stride(self) -> int:
        """The kernels' ``scale_stride`` (:attr:`KVScales.stride`)."""
        return self.scales.stride


def layer_args(
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    kv_cache_dtype: str,
    device: torch.device,
    *,
    sm_scale: float,
    k_scale: torch.Tensor | float | None,
    v_scale: torch.Tensor | float | None,
    sinks: torch.Tensor | None,
    sliding_window: int | None,
    logits_soft_cap: float,
    check_values: bool,
) -> LayerArgs:
    """One layer's :class:`LayerArgs`, checked (:func:`~volta_attn_v100.inputs.check_masking`,
    :func:`~volta_attn_v100.inputs.kv_scales`; ``check_values`` reads the scales back). The
    sinks are cast here, so a layer made once casts them once; the scales stay views of the
    given float32 tensors, so a scale updated in place is read at the next launch."""
    check_masking(sliding_window, logits_soft_cap)
    scales = kv_scales(k_scale, v_scale, num_kv_heads, device, check_values=check_values)
    return LayerArgs(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        kv_dtype=kv_cache_dtype,
        scales=scales,
        sinks=sinks.to(torch.float32).contiguous() if sinks is not None else scales.k,
        has_sinks=int(sinks is not None),
        sm_scale=float(sm_scale),
        softcap=float(logits_soft_cap),
        window=int(sliding_window or 0),
    )


@dataclass
class _Planned:
    """A layer shape's launch in one step: the choice, the batch's query tokens, whether its
    CUDA build runs on this device (asked once), the Triton launch's arguments that are the
    same for every layer of the shape once made, and the decode's partial buffers."""

    choice: Choice[Launch]
    num_tokens: int
    cuda_ready: bool | None = None
    triton: _TritonLaunch | None = None
    partials: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict
    )


@dataclass
class StepLaunches:
    """One step's batch as every layer reads it (the metadata tensors and lengths, the decode
    partitions or None for the table's policy, the kernel ``path``) and the launches its layers
    take, by layer shape: the first layer of a shape chooses the launch
    (:func:`volta_attn_v100.dispatch.choose`) and makes the decode's partial buffers, the others
    reuse both. A step's layers run one after another on one stream, so they may share the
    buffers; under CUDA-graph capture they are made inside the captured region (the graph's
    memory pool keeps them for its replays)."""

    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    num_splits: int | None
    path: str
    table: LaunchTable | None = None
    planned: dict[tuple[int, ...], _Planned] = field(default_factory=dict)

    @functools.cached_property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


@dataclass(frozen=True)
class TensorLayout:
    """What the kernels take of a call's tensors besides their addresses: the query's and the
    output's token and head strides, the cache's block, head and slot strides, its span in
    elements and its page size. The same at every call of a layer whose tensors keep their
    layout (the vLLM backend checks that), so it is read once."""

    query: tuple[int, int]
    out: tuple[int, int]
    kv: tuple[int, int, int]
    span: int
    page_size: int


def tensor_layout(query: torch.Tensor, kv: torch.Tensor, out: torch.Tensor) -> TensorLayout:
    """The :class:`TensorLayout` of ``query`` and ``out`` ``[tokens, heads, head_size]`` and the
    cache ``kv`` as :func:`~volta_attn_v100.inputs.cache_view` gives it."""
    return TensorLayout(
        query=(query.stride(0), query.stride(1)),
        out=(out.stride(0), out.stride(1)),
        kv=(kv.stride(0), kv.stride(1), kv.stride(2)),
        span=cache_span(kv),
        page_size=kv.shape[2],
    )


def run_attention(
    layer: LayerArgs,
    step: StepLaunches,
    query: torch.Tensor,
    kv: torch.Tensor,
    out: torch.Tensor,
    *,
    num_tokens: int | None = None,
    layout: TensorLayout | None = None,
) -> None:
    """Attention of ``query`` over the cache ``kv`` (as :func:`~volta_attn_v100.inputs.cache_view`
    gives it) into ``out``, for inputs already checked (:func:`paged_attention`'s checks, or the
    vLLM backend's: each layer's once, each step's in its metadata builder). ``num_tokens``: the
    query tokens the batch holds, when ``query`` and ``out`` have more rows (vLLM's padded
    buffers; the kernels touch only the batch's rows); ``layout``: the tensors' layout when the
    caller knows it, which lets ``query`` and ``out`` be vLLM's ``[tokens, heads x head_size]``
    tensors themselves (the kernels read their addresses and the layout's strides)."""
    if num_tokens is None:
        num_tokens = query.shape[0]
    num_seqs = step.num_seqs
    if num_seqs == 0 or num_tokens == 0:
        return
    if layout is None:
        layout = tensor_layout(query, kv, out)
    key = (
        layer.num_heads,
        layer.num_kv_heads,
        layer.head_size,
        num_tokens,
        layout.span,
        layout.page_size,
    )
    planned = step.planned.get(key)
    if planned is None:
        facts = device_facts(query.device)
        call = AttentionCall(
            head_size=layer.head_size,
            num_heads=layer.num_heads,
            num_kv_heads=layer.num_kv_heads,
            kv_dtype=layer.kv_dtype,
            num_seqs=num_seqs,
            num_tokens=num_tokens,
            max_query_len=step.max_query_len,
            max_seq_len=step.max_seq_len,
            cache_span=layout.span,
            page_size=layout.page_size,
            num_splits=step.num_splits,
            path=step.path,
        )
        planned = _Planned(choose(call, facts.capability, facts.sm_count, step.table), num_tokens)
        step.planned[key] = planned
    _run(layer, step, query, kv, out, layout, planned)


def _decode_partials(
    planned: _Planned,
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode's partial accumulators ``shape`` (tokens, heads, partitions, width) of
    ``dtype`` and its running max and sum, made by the step's first layer that needs them (the
    CUDA decode's and its Triton fallback's differ in width and dtype)."""
    key = (shape, dtype)
    found = planned.partials.get(key)
    if found is None:
        acc = torch.empty(shape, dtype=dtype, device=device)
        ml = torch.empty((*shape[:3], 2), dtype=torch.float32, device=device)
        found = planned.partials[key] = (acc, ml)
    return found


_NO_BUFFERS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _no_buffer(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor of ``dtype`` on ``device``, made once: the pointer a launch passes for a
    buffer it does not use, typed as the gated build's signature says."""
    key = (device, dtype)
    if key not in _NO_BUFFERS:
        _NO_BUFFERS[key] = torch.empty(0, dtype=dtype, device=device)
    return _NO_BUFFERS[key]


@dataclass(frozen=True)
class _TritonLaunch:
    """What a Triton launch passes every layer of a step's shape: the kernel, its grid, the
    step's tensors (block table, lengths, query starts), the tensors after the output (the
    decode's partial buffers and arrival counters; none for the prefill), the launch's numbers
    after the layer's, the block table's stride and the compile-time arguments."""

    launch: Launch
    kernel: Any
    grid: tuple[int, ...]
    step_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    tensors: tuple[torch.Tensor, ...]
    values: tuple[int, ...]
    block_table_stride: int
    options: dict[str, object]


def _triton_launch(
    layer: LayerArgs,
    step: StepLaunches,
    planned: _Planned,
    launch: DecodeLaunch | PrefillLaunch,
    device: torch.device,
) -> _TritonLaunch:
    """The step's :class:`_TritonLaunch` of ``launch``, made by its first layer of the shape."""
    if planned.triton is not None and planned.triton.launch is launch:
        return planned.triton
    build = launch.build
    num_seqs = step.seq_lens.shape[0]
    tensors: tuple[torch.Tensor, ...] = ()
    if isinstance(launch, DecodeLaunch):
        from volta_attn_v100.kernels import paged_decode_kernel as kernel

        grid: tuple[int, ...] = (num_seqs, launch.kv_programs, launch.num_splits)
        partials_dtype = torch.float16 if build.partials_f16 else torch.float32
        if launch.num_splits > 1:
            shape = (planned.num_tokens, layer.num_heads, launch.num_splits)
            acc, ml = _decode_partials(
                planned, (*shape, head_pad(build.head_size)), partials_dtype, device
            )
            tensors = (acc, ml, arrival_counters(device, num_seqs * launch.kv_programs))
        else:
            # One partition writes the output itself: nothing to combine, nothing to count.
            tensors = (
                _no_buffer(device, partials_dtype),
                _no_buffer(device, torch.float32),
                _no_buffer(device, torch.int32),
            )
        values = (launch.heads_per_prog, launch.head_chunks, layer.num_heads, launch.num_splits)
    else:
        from volta_attn_v100.kernels import paged_prefill_kernel as kernel

        grid = launch.grid
        values = (launch.heads_per_prog, launch.head_chunks, num_seqs)
    planned.triton = _TritonLaunch(
        launch=launch,
        kernel=kernel,
        grid=grid,
        step_tensors=(step.block_table, step.seq_lens, step.query_start_loc),
        tensors=tensors,
        values=values,
        block_table_stride=step.block_table.stride(0),
        options={
            **build.constexprs(),
            "num_warps": build.tiles.num_warps,
            "num_stages": build.tiles.num_stages,
        },
    )
    return planned.triton


def _launch_triton(
    layer: LayerArgs,
    query: torch.Tensor,
    kv: torch.Tensor,
    out: torch.Tensor,
    layout: TensorLayout,
    run: _TritonLaunch,
) -> None:
    """Launch the decode or prefill kernel: both take the same arguments in the same order,
    the decode's partial buffers and partition count among them."""
    run.kernel[run.grid](
        query,
        kv,
        *run.step_tensors,
        *layer.kernel_tensors,
        out,
        *run.tensors,
        *layer.kernel_values,
        *run.values,
        layer.scale_stride,
        *layout.query,
        *layout.kv,
        run.block_table_stride,
        *layout.out,
        **run.options,
    )


def _run(
    layer: LayerArgs,
    step: StepLaunches,
    query: torch.Tensor,
    kv: torch.Tensor,
    out: torch.Tensor,
    layout: TensorLayout,
    planned: _Planned,
) -> None:
    """Run the planned choice's launch: a CUDA one where it can run now (:func:`_cuda_decode`,
    :func:`_cuda_prefill`), else its Triton fallback; a Triton one as it is."""
    choice = planned.choice
    launch = choice.launch
    if isinstance(launch, CudaDecodeLaunch) and _cuda_decode(
        layer, step, query, kv, out, planned, launch, layout
    ):
        return
    if isinstance(launch, CudaPrefillLaunch) and _cuda_prefill(
        layer, step, query, kv, out, planned, launch, layout
    ):
        return
    if choice.fallback is not None:
        launch = choice.fallback.launch
    if not isinstance(launch, DecodeLaunch | PrefillLaunch):
        raise TypeError(f"a CUDA choice needs a Triton fallback, got {choice!r}")
    run = _triton_launch(layer, step, planned, launch, query.device)
    _launch_triton(layer, query, kv, out, layout, run)


def _heads(layer: LayerArgs, t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[tokens, heads, head_size]``, the shape the CUDA launchers read their sizes and
    strides from where no layout gives them (a view of vLLM's ``[tokens, heads x head_size]``
    tensor)."""
    return t if t.dim() == 3 else t.view(-1, layer.num_heads, layer.head_size)


def _cuda_layout(
    layer: LayerArgs, query: torch.Tensor, out: torch.Tensor, layout: TensorLayout | None
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int, int] | None]:
    """``query`` and ``out`` as the CUDA launchers take them: as they come with the layout's
    strides (no view per call), or viewed as ``[tokens, heads, head_size]`` without one."""
    if layout is not None:
        return query, out, (*layout.query, *layout.out)
    return _heads(layer, query), _heads(layer, out), None


def _cuda_decode(
    layer: LayerArgs,
    step: StepLaunches,
    query: torch.Tensor,
    kv: torch.Tensor,
    out: torch.Tensor,
    planned: _Planned,
    launch: CudaDecodeLaunch,
    layout: TensorLayout | None = None,
) -> bool:
    """Run the decode on the SM70 tensor cores (:mod:`volta_attn_v100.cuda.decode`) as
    ``launch`` says where the tensors are on a CUDA device, the build loads there (asked once a
    step) and the tensors allow its vector loads; False leaves it to the Triton fallback.
    ``layout``: the tensors' (:func:`run_attention`'s), else read from views of them."""
    if not query.is_cuda:
        return False
    from volta_attn_v100.cuda import decode

    query, out, strides = _cuda_layout(layer, query, out, layout)
    if planned.cuda_ready is None:
        planned.cuda_ready = decode.ready(query.device, launch.head_size, launch.kv_dtype)
    if not planned.cuda_ready:
        return False
    if strides is None:
        aligned = decode.vector_aligned(query, kv)
    else:
        aligned = decode.vector_aligned(query, kv, strides[:2])
    if not aligned:
        return False
    partials = None
    if launch.num_splits > 1:
        shape = (planned.num_tokens, layer.num_heads, launch.num_splits, layer.head_size)
        partials = _decode_partials(planned, shape, torch.float32, query.device)
    scales = layer.scales
    decode.launch(
        query, kv, step.block_table, step.seq_lens, step.query_start_loc, out,
        k_scale=scales.k, v_scale=scales.v, scale_stride=scales.stride, sinks=layer.sinks,
        has_sinks=layer.has_sinks, sm_scale=layer.sm_scale, softcap=layer.softcap,
        window=layer.window, launch=launch, partials=partials, layout=strides,
    )  # fmt: skip
    return True


def _cuda_prefill(
    layer: LayerArgs,
    step: StepLaunches,
    query: torch.Tensor,
    kv: torch.Tensor,
    out: torch.Tensor,
    planned: _Planned,
    launch: CudaPrefillLaunch,
    layout: TensorLayout | None = None,
) -> bool:
    """Run the prefill on the SM70 tensor cores (:mod:`volta_attn_v100.cuda.prefill`) as
    ``launch`` says where the tensors are on a CUDA device, the build loads there (asked once a
    step) and the cache allows its vector loads; False leaves it to the Triton fallback.
    ``layout``: the tensors' (:func:`run_attention`'s), else read from views of them."""
    if not query.is_cuda:
        return False
    from volta_attn_v100.cuda import prefill

    query, out, strides = _cuda_layout(layer, query, out, layout)
    if planned.cuda_ready is None:
        planned.cuda_ready = prefill.ready(query.device, launch.head_size, launch.kv_dtype)
    if not planned.cuda_ready or not prefill.vector_aligned(kv):
        return False
    scales = layer.scales
    prefill.launch(
        query, kv, step.block_table, step.seq_lens, step.query_start_loc, out,
        k_scale=scales.k, v_scale=scales.v, scale_stride=scales.stride, sinks=layer.sinks,
        has_sinks=layer.has_sinks, sm_scale=layer.sm_scale, softcap=layer.softcap,
        window=layer.window, launch=launch, layout=strides,
    )  # fmt: skip
    return True
