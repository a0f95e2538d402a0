"""The calls ``vllm-volta bench`` times for the backend: paged attention at a workload.

Named by :func:`volta_attn_v100.plugin.volta_bench_case` and imported only when the command
times a call on a GPU. Each input set is one step's tensors as the backend's ``forward``
passes them to :func:`volta_attn_v100.ops.paged_attention`: the queries, a paged cache of
random values (fp8 caches hold the codes of random fp16 values) whose blocks are scattered by
a random block table, every sequence at the workload's context, and per-tensor scales of 1.
"""

from __future__ import annotations

import math
from typing import Any

from volta_core import AttentionLayer, QuantConfig, canonical_kv_dtype
from volta_core.kernel_api import BenchCall, Workload


def attention_call(
    layer: AttentionLayer, quant: QuantConfig | None, work: Workload, device: str = "cuda"
) -> BenchCall:
    """``work`` on ``layer``: ``work.sequences`` sequences of ``work.query_len`` new tokens,
    each ``max(work.context, work.query_len)`` tokens long, a decode or a prefill chunk as the
    launcher chooses for it, on ``device`` (the tests run it on CPU under the interpreter)."""
    import torch

    from volta_attn_v100.ops import paged_attention

    heads, kv_heads, head = layer.num_heads, max(1, layer.num_kv_heads), layer.head_size
    seqs, q_len = work.sequences, work.query_len
    seq_len = max(work.context, q_len)
    pages = math.ceil(seq_len / layer.block_size)
    kv_dtype = canonical_kv_dtype(layer.kv_cache_dtype, layer.dtype)
    element = 2 if kv_dtype == "float16" else 1

    def make_inputs() -> tuple[Any, ...]:
        shape = (seqs * pages, kv_heads, layer.block_size, 2 * head)
        cache = torch.randn(shape, dtype=torch.float16, device=device)
        if kv_dtype == "fp8_e5m2":  # e5m2 is fp16's high byte
            cache = (cache.view(torch.int16) >> 8).to(torch.uint8)
        elif kv_dtype == "fp8_e4m3":
            cache = cache.to(torch.float8_e4m3fn).view(torch.uint8)
        table = torch.randperm(seqs * pages, device=device).to(torch.int32).view(seqs, pages)
        seq_lens = torch.full((seqs,), seq_len, dtype=torch.int32, device=device)
        q_start = torch.arange(seqs + 1, dtype=torch.int32, device=device) * q_len
        query = torch.randn(seqs * q_len, heads, head, dtype=torch.float16, device=device)
        scale = torch.ones(1, dtype=torch.float32, device=device)
        return query, cache, table, seq_lens, q_start, torch.empty_like(query), scale

    def run(*inputs: Any) -> None:
        query, cache, table, seq_lens, q_start, out, scale = inputs
        paged_attention(
            query, cache, table, seq_lens, q_start, out,
            max_query_len=q_len, max_seq_len=seq_len, sm_scale=head**-0.5,
            kv_cache_dtype=kv_dtype, k_scale=scale, v_scale=scale,
            sliding_window=layer.sliding_window, check_bounds=False,
        )  # fmt: skip

    cache_bytes = seqs * pages * kv_heads * layer.block_size * 2 * head * element
    query_bytes = 2 * seqs * q_len * heads * head * 2
    # int32 block table, sequence lengths and query starts, and the float32 scale.
    small_bytes = 4 * (seqs * pages + seqs + seqs + 1 + 1)
    return BenchCall(make_inputs, run, cache_bytes + query_bytes + small_bytes)
