"""Benchmarks: ``python plugins/attn_v100/benchmarks/bench.py --out DIR`` (needs a CUDA GPU).

Decode (head size 128, 32/8 and 64/8 heads, block 16, fp16 and fp8_e5m2 KV): effective
bandwidth (KV bytes read plus Q and output, over time) as a fraction of the device-to-device
copy bandwidth measured in the same run, and the read floor: the time of a kernel that only
reads the same KV bytes (:mod:`volta_devkit.read_floor`), which bounds a short decode's
time from below whatever the kernel does. Prefill (head size 128, 32/8 heads, 16K tokens in
sequences of 512..4096, fp16 KV; fp8_e5m2 KV at 2048): throughput against
``torch.nn.functional.scaled_dot_product_attention`` with the flash backend on the same
sequences laid out contiguously; chunked prefill over an 8K cached prefix is reported too. Each
shape also gets an SM70 estimate: the bytes and FMAs the SM70 configuration executes, and the
time they imply at 900 GB/s and 15.7 TFLOP/s. ``--parts e4m3`` (SM89+) adds fp8_e4m3 beside
fp8_e5m2 in the decode rows and the fp8 prefill rows (an e4m3 row's SM70 estimate is that of
its bytes: no V100 runs e4m3). ``--parts cuda_prefill`` times the tensor-core prefill a V100
takes (the CUDA kernel, built here for this GPU, where ``mma.m8n8k4`` runs emulated) at 8 x 2048,
4 x 4096 and 1 x 16384, with its SM70 estimate (its HMMA steps at 125 TFLOP/s, or its bytes at
900 GB/s) beside the Triton prefill's FMA estimate.

Timing (the core harness, :mod:`volta_devkit.bench`): decode runs back to back inside one
captured CUDA graph (``time_cuda_graph``), as vLLM runs a decode step, rotating among enough
input copies that the set does not fit in L2; each replay is event-timed and divided by the
calls in the graph. Prefill (milliseconds per call) is event-timed eagerly (``time_cuda``).
The copy bandwidth is the harness's ceiling, measured in the same run. Results go to
``DIR/attn_v100_bench.json`` and ``.png``; a table is printed last.

A script beside the package, in no distribution: it needs ``volta_attn_v100`` and
``volta_devkit`` importable (installed, or on ``PYTHONPATH`` as the GPU scripts set it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from volta_attn_v100.dispatch import table_for
from volta_attn_v100.launch import (
    cuda_decode_launch,
    cuda_prefill_launch,
    decode_tiles,
    prefill_tiles,
)
from volta_attn_v100.limits import head_pad, kv_dtype_refusal
from volta_attn_v100.ops import default_num_splits, paged_attention
from volta_attn_v100.tables import (
    SM70,
    SM70_CUDA_PREFILL,
    SM80,
    DecodeTile,
    KVPolicy,
    LaunchTable,
    PrefillTiles,
    SplitPolicy,
    Tiles,
    WideCombine,
)
from volta_devkit.bench import measure_copy_bandwidth, time_cuda, time_cuda_graph
from volta_devkit.read_floor import read_floor

V100_BANDWIDTH = 900e9
V100_FP32_FLOPS = 15.7e12
ROTATE_BYTES = 256 << 20

DECODE_SHAPES = [
    (1, 1024),
    (1, 8192),
    (1, 32768),
    (8, 8192),
    (16, 8192),
    (32, 16384),
    (64, 4096),
    (64, 8192),
    (128, 2048),
    (128, 8192),
]
DECODE_HEADS = [(32, 8), (64, 8)]
#: Gemma-4's 512-dim global layers (heads of the bundled ``gemma-4-dual-head`` example), no
#: speed target: decode shapes and one prefill shape (``--parts d512``). 32 KB of fp16 KV per
#: token: 64 x 4K (8.6 GB) is past what the read floor takes in one source.
D512_HEADS = (32, 16)
D512_DECODE_SHAPES = [(1, 8192), (4, 8192), (16, 8192)]
D512_PREFILL_SEQ_LEN = 2048
PREFILL_SEQ_LENS = [512, 1024, 2048, 4096]
#: What ``--parts`` can name. ``e4m3`` (SM89+, with ``decode``) adds fp8_e4m3 rows to the
#: decode shapes and to the fp8 prefill rows when ``prefill`` runs too. ``cuda_prefill``: the
#: tensor-core prefill (the V100's CUDA kernel) at :data:`CUDA_PREFILL_SEQ_LENS`, fp16 and e5m2,
#: beside the Triton prefill and SDPA at the same shapes. ``cuda_decode``: the tensor-core decode
#: (the V100's CUDA kernel) at groups 4 and 8, head sizes 128 and 256, 1 x 32K and 32 x 16K, fp16
#: and e5m2, and the SM70 estimates of every issue-34 decode target.
PARTS = ("decode", "prefill", "d512", "sweep", "e4m3", "cuda_prefill", "cuda_decode")
#: Largest head size torch SDPA's FlashAttention backend takes (no prefill reference above it).
SDPA_FLASH_MAX_HEAD = 256
PREFILL_TOKENS = 16384


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read plus write), the harness's ceiling."""
    gbps, _ = measure_copy_bandwidth()
    return gbps * 1e9


def random_cache(shape: tuple[int, ...], kv_dtype: str) -> torch.Tensor:
    """A cache of random values of moderate magnitude: fp16 randn, or its fp8 codes (for e5m2
    the high bytes, for e4m3 torch's conversion)."""
    kv = torch.randn(shape, device="cuda", dtype=torch.float16)
    if kv_dtype == "fp8_e5m2":
        return (kv.view(torch.int16) >> 8).to(torch.uint8)
    if kv_dtype == "fp8_e4m3":
        return kv.to(torch.float8_e4m3fn).view(torch.uint8)
    return kv


def make_decode_inputs(batch, ctx, heads, kv_heads, kv_dtype, q_len=1, head_size=128, block=16):
    pages = math.ceil(ctx / block)
    num_blocks = batch * pages
    kv = random_cache((num_blocks, kv_heads, block, 2 * head_size), kv_dtype)
    table = torch.randperm(num_blocks, device="cuda", dtype=torch.int64).to(torch.int32)
    table = table.view(batch, pages)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q_start = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * q_len
    query = torch.randn(batch * q_len, heads, head_size, device="cuda", dtype=torch.float16)
    return query, kv, table, seq_lens, q_start


def decode_call(
    ctx: int, kv_dtype: str, out: torch.Tensor, table: LaunchTable | None = None
) -> Callable[..., Any]:
    """One decode step over an input set of :func:`make_decode_inputs`, written into ``out``,
    launched from ``table`` (None: the device's)."""

    def run(q, kv, block_table, seq_lens, q_start):
        paged_attention(
            q, kv, block_table, seq_lens, q_start, out,
            max_query_len=1, max_seq_len=ctx, sm_scale=q.shape[-1] ** -0.5,
            kv_cache_dtype=kv_dtype, check_bounds=False, table=table,
        )  # fmt: skip

    return run


def decode_case(
    batch, ctx, heads, kv_heads, kv_dtype, copy_bw, table=None, floor=False, head_size=128
):
    """One decode shape timed; with ``floor``, also the read floor of its KV bytes: the same
    bytes read by a kernel that does nothing else, timed the same way
    (:func:`volta_devkit.read_floor.read_floor`)."""
    kv_bytes = batch * ctx * kv_heads * 2 * head_size * (2 if kv_dtype == "float16" else 1)
    sets = max(1, min(64, math.ceil(ROTATE_BYTES / kv_bytes)))
    torch.manual_seed(DECODE_SEED)
    inputs = [
        make_decode_inputs(batch, ctx, heads, kv_heads, kv_dtype, head_size=head_size)
        for _ in range(sets)
    ]
    out = torch.empty_like(inputs[0][0])
    run = decode_call(ctx, kv_dtype, out, table)
    ms = time_cuda_graph(run, inputs).median_ms
    floor_ms = (
        read_floor([kv for _, kv, *_ in inputs], blocks=(1024, 2048), stages=(3,)).median_ms
        if floor
        else None
    )
    qo_bytes = 2 * batch * heads * head_size * 2
    bw = (kv_bytes + qo_bytes) / (ms * 1e-3)
    # SM70: the decode program computes 16 rows (head group padded) x keys x head size, twice.
    rows = decode_tiles(SM70, head_size, 16, kv_fp8=False).block_m
    fmas = 2 * batch * kv_heads * rows * ctx * head_pad(head_size)
    sm70_ms = max((kv_bytes + qo_bytes) / V100_BANDWIDTH, 2 * fmas / V100_FP32_FLOPS) * 1e3
    splits = default_num_splits(batch, kv_heads, ctx, "cuda", kv_dtype, table)
    return {
        "kind": "decode",
        "head_size": head_size,
        "batch": batch,
        "context": ctx,
        "heads": f"{heads}/{kv_heads}",
        "kv_dtype": kv_dtype,
        "splits": splits,
        "ms": ms,
        "bytes": kv_bytes + qo_bytes,
        "bandwidth_GBps": bw / 1e9,
        "fraction_of_copy": bw / copy_bw,
        "read_floor_ms": floor_ms,
        "sm70_fmas": fmas,
        "sm70_estimate_ms": sm70_ms,
    }


def prefill_case(
    seq_len, prefix=0, heads=32, kv_heads=8, head_size=128, kv_dtype="float16", table=None
):
    """16K new tokens in sequences of ``seq_len`` (after ``prefix`` cached tokens each),
    launched from ``table`` (None: the device's)."""
    batch = PREFILL_TOKENS // seq_len
    total = prefix + seq_len
    pages = math.ceil(total / 16)
    kv = random_cache((batch * pages, kv_heads, 16, 2 * head_size), kv_dtype)
    blocks = torch.randperm(batch * pages, device="cuda").to(torch.int32).view(batch, pages)
    seq_lens = torch.full((batch,), total, dtype=torch.int32, device="cuda")
    q_start = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * seq_len
    query = torch.randn(batch * seq_len, heads, head_size, device="cuda", dtype=torch.float16)
    out = torch.empty_like(query)
    scale = head_size**-0.5

    def run():
        paged_attention(
            query, kv, blocks, seq_lens, q_start, out,
            max_query_len=seq_len, max_seq_len=total, sm_scale=scale, check_bounds=False,
            kv_cache_dtype=kv_dtype, table=table,
        )  # fmt: skip

    ms = time_cuda(run, [()], target_ms=100.0, min_reps=10).median_ms
    # Causal FLOPs of the new tokens: each attends to the prefix plus the earlier new tokens.
    pairs = batch * (seq_len * prefix + seq_len * (seq_len + 1) / 2)
    flops = 4 * pairs * heads * head_size
    row = {
        "kind": "prefill" if prefix == 0 else "chunked_prefill",
        "head_size": head_size,
        "seq_len": seq_len,
        "prefix": prefix,
        "batch": batch,
        "kv_dtype": kv_dtype,
        "ms": ms,
        "TFLOPs": flops / (ms * 1e-3) / 1e12,
    }
    fmas = triton_sm70_fmas(batch, seq_len, prefix, heads, kv_heads, head_size)
    row["sm70_fmas"] = fmas
    row["sm70_estimate_ms"] = 2 * fmas / V100_FP32_FLOPS * 1e3
    if prefix == 0 and head_size <= SDPA_FLASH_MAX_HEAD:
        row.update(sdpa_case(batch, seq_len, heads, kv_heads, head_size, flops))
    return row


def triton_sm70_fmas(batch, seq_len, prefix, heads, kv_heads, head_size) -> int:
    """FMAs the Triton prefill's SM70 tiles execute for ``batch`` sequences of ``seq_len`` new
    tokens after ``prefix`` cached ones."""
    tiles = prefill_tiles(SM70.prefill_tiles[head_pad(head_size)], seq_len)
    group = heads // kv_heads
    total = prefix + seq_len
    # SM70 tiles compute block_m rows per KV tile; rows are tokens x the (padded) head group,
    # and the diagonal tiles are partly masked: count whole tiles.
    block_q = tiles.block_m // group
    tiles_per_seq = sum(
        math.ceil(min(prefix + (b + 1) * block_q, total) / tiles.block_n) * tiles.block_n
        for b in range(math.ceil(seq_len / block_q))
    )
    return 2 * batch * kv_heads * tiles.block_m * tiles_per_seq * head_pad(head_size)


def sdpa_case(batch, seq_len, heads, kv_heads, head_size, flops):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(batch, heads, seq_len, head_size, device="cuda", dtype=torch.float16)
    k = torch.randn(batch, kv_heads, seq_len, head_size, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    ms = time_cuda(run, [()], target_ms=100.0, min_reps=10).median_ms
    return {"sdpa_ms": ms, "sdpa_TFLOPs": flops / (ms * 1e-3) / 1e12}


# -- the tensor-core prefill (CUDA, chosen on SM70): its SM70 estimate and its rows here -------

#: The V100's tensor-core rate (NVIDIA Tesla V100 GPU Architecture whitepaper).
V100_TENSOR_FLOPS = 125e12
#: Floating-point operations of one sm_70 ``HMMA.884`` step: an ``mma.m8n8k4`` is four 8x8x4
#: products (2048 operations), issued as four steps.
HMMA_STEP_FLOPS = 512
#: The tensor-core prefill's shapes (16K tokens as batch x query length; head 128, 32/8 heads).
CUDA_PREFILL_SEQ_LENS = (2048, 4096, 16384)


def cuda_prefill_hmma_per_tile(head_size: int) -> int:
    """HMMA steps one warp of the tensor-core prefill runs per key tile: Q.K^T (head_size / 4
    k-steps of block_n / 32 products) and P.V (block_n / 4 k-steps of the value columns / 32),
    four steps a product; the gate test proves each sm_70 build's SASS holds exactly this many."""
    tile = SM70_CUDA_PREFILL[head_size]
    value_cols = -(-head_size // 32) * 32
    return 4 * (head_size // 4 * tile.block_n // 32 + tile.block_n // 4 * value_cols // 32)


def cuda_prefill_estimate(batch, seq_len, prefix, heads, kv_heads, head_size, kv_bytes=2) -> dict:
    """The tensor-core prefill's SM70 estimate: the HMMA steps it executes (every warp of every
    program, each key tile from the first to the causal limit, padding rows included) at the
    tensor-core rate, or its bytes (Q and the output once, the cache once) at 900 GB/s,
    whichever is longer. Softmax arithmetic, shared-memory traffic and latency are not in it:
    it bounds a V100's time from below."""
    tile = SM70_CUDA_PREFILL[head_size]
    group = heads // kv_heads
    heads_per_prog = min(group, tile.block_m)
    block_q = tile.block_m // heads_per_prog
    chunks = math.ceil(group / heads_per_prog)
    total = prefix + seq_len
    tiles = sum(
        math.ceil(min(prefix + (b + 1) * block_q, total) / tile.block_n)
        for b in range(math.ceil(seq_len / block_q))
    )
    steps = batch * kv_heads * chunks * tiles * tile.num_warps
    flops = steps * cuda_prefill_hmma_per_tile(head_size) * HMMA_STEP_FLOPS
    io = batch * (4 * seq_len * heads * head_size + total * kv_heads * 2 * head_size * kv_bytes)
    ms = max(flops / V100_TENSOR_FLOPS, io / V100_BANDWIDTH) * 1e3
    return {"sm70_hmma_flops": flops, "sm70_bytes": io, "sm70_estimate_ms": ms}


def cuda_prefill_case(seq_len, heads=32, kv_heads=8, head_size=128, kv_dtype="float16"):
    """The tensor-core prefill on 16K new tokens in sequences of ``seq_len``, launched directly
    (this GPU's table keeps Triton): built for this GPU, where ``mma.m8n8k4`` runs emulated, so
    its time here says nothing of a V100's; beside it, its SM70 estimate."""
    from volta_attn_v100.cuda import prefill

    batch = PREFILL_TOKENS // seq_len
    pages = math.ceil(seq_len / 16)
    kv = random_cache((batch * pages, kv_heads, 16, 2 * head_size), kv_dtype)
    blocks = torch.randperm(batch * pages, device="cuda").to(torch.int32).view(batch, pages)
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device="cuda")
    q_start = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * seq_len
    query = torch.randn(batch * seq_len, heads, head_size, device="cuda", dtype=torch.float16)
    out = torch.empty_like(query)
    unit = torch.ones(1, dtype=torch.float32, device="cuda")
    if not prefill.ready(query.device, head_size, kv_dtype):
        raise SystemExit("the tensor-core prefill needs NVRTC (pip install vllm-volta-core[cuda])")
    launch = cuda_prefill_launch(
        kv_dtype=kv_dtype, head_size=head_size, num_heads=heads, num_kv_heads=kv_heads,
        num_seqs=batch, num_tokens=batch * seq_len,
    )  # fmt: skip

    def run():
        prefill.launch(
            query, kv, blocks, seq_lens, q_start, out, k_scale=unit, v_scale=unit,
            scale_stride=0, sinks=unit, has_sinks=0, sm_scale=head_size**-0.5, softcap=0.0,
            window=0, launch=launch,
        )  # fmt: skip

    ms = time_cuda(run, [()], target_ms=100.0, min_reps=5).median_ms
    flops = 4 * batch * seq_len * (seq_len + 1) / 2 * heads * head_size
    kv_bytes = 2 if kv_dtype == "float16" else 1
    triton_ms = 2 * triton_sm70_fmas(batch, seq_len, 0, heads, kv_heads, head_size)
    triton_ms = triton_ms / V100_FP32_FLOPS * 1e3
    return {
        "kind": "cuda_prefill",
        "head_size": head_size,
        "heads": f"{heads}/{kv_heads}",
        "seq_len": seq_len,
        "batch": batch,
        "kv_dtype": kv_dtype,
        "ms": ms,
        "TFLOPs": flops / (ms * 1e-3) / 1e12,
        **cuda_prefill_estimate(batch, seq_len, 0, heads, kv_heads, head_size, kv_bytes),
        "triton_sm70_estimate_ms": triton_ms,
    }


def print_cuda_prefill(results: dict) -> None:
    """The tensor-core prefill's rows: this GPU's time (emulated m8n8k4), its SM70 estimate, the
    Triton prefill's SM70 estimate and their ratio (issue 34's target: at most 0.3)."""
    rows = results.get("cuda_prefill", [])
    if not rows:
        return
    print("cuda prefill (V100 build; this GPU's ms measured with m8n8k4 emulated, sm70 estimated)")
    print("  head heads   batch x seq   kv        ms here  sm70 est  triton sm70 est  ratio")
    for r in rows:
        print(
            f"  {r['head_size']:4d} {r['heads']:5s} {r['batch']:5d} x {r['seq_len']:5d}  "
            f"{r['kv_dtype']:8s} {r['ms']:8.3f} {r['sm70_estimate_ms']:9.2f} "
            f"{r['triton_sm70_estimate_ms']:16.2f}  "
            f"{r['sm70_estimate_ms'] / r['triton_sm70_estimate_ms']:5.3f}"
        )


# -- the tensor-core decode (CUDA, chosen on SM70): its SM70 estimate and its rows here ---------

#: A V100 SXM2: 80 SMs at a 1530 MHz boost clock (NVIDIA Tesla V100 GPU Architecture
#: whitepaper), each issuing four warp instructions a cycle (one per scheduler), 64 fp32 FMA a
#: cycle and 16 conversions between fp16 and fp32 (CUDA C++ Programming Guide, "Arithmetic
#: Instructions" throughput table, compute capability 7.x).
V100_SMS = 80
V100_CLOCK_HZ = 1.53e9
V100_ISSUE_PER_CLOCK = 4
V100_FFMA_PER_CLOCK = 64
V100_CONVERT_PER_CLOCK = 16
#: Issue 34's decode targets: batch x context, heads / KV heads (groups 4, 6, 8), head sizes.
CUDA_DECODE_SHAPES = ((1, 32768), (32, 16384))
CUDA_DECODE_HEADS = ((32, 8), (48, 8), (64, 8))
CUDA_DECODE_HEAD_SIZES = (128, 256)
#: SASS instructions in one pass of each sm_70 build's key loop (one warp, one 8-key tile: the
#: body between the loop's label and its backward branch, soft-cap code included), NVRTC 12.9;
#: the gate test proves every build's loop holds at most this many.
CUDA_DECODE_LOOP_INSTRUCTIONS = {
    (128, "float16"): 482,
    (128, "fp8_e5m2"): 482,
    (256, "float16"): 650,
    (256, "fp8_e5m2"): 650,
}


def cuda_decode_hmma_per_tile(head_size: int) -> int:
    """HMMA steps one warp of the tensor-core decode runs per 8-key tile: Q.K^T over its quad
    pair's quarter of the head (head_size / 16 products) and P.V over two key sets of
    head_size / 32 dims a lane (head_size / 16 products), four steps a product; the gate test
    proves each sm_70 build's SASS holds exactly this many."""
    return 4 * (head_size // 16 + 2 * (head_size // 32))


def cuda_decode_estimate(batch, ctx, heads, kv_heads, head_size, kv_dtype, q_len=1) -> dict:
    """The tensor-core decode's SM70 estimate: the longest of its bytes (the cache once, Q and the
    output) at 900 GB/s, its HMMA steps (every tile of every row chunk) at the tensor-core rate,
    and its key loop's SASS instructions at four a cycle per SM. Row chunks past the first read
    the cache again from L2 (they run side by side), which the bytes do not count; latency is
    not in it."""
    group = heads // kv_heads
    chunks = math.ceil(q_len * group / 8)
    kv_bytes = batch * ctx * kv_heads * 2 * head_size * (2 if kv_dtype == "float16" else 1)
    io = kv_bytes + 2 * batch * q_len * heads * head_size * 2
    tiles = batch * kv_heads * chunks * math.ceil(ctx / 8)
    flops = tiles * cuda_decode_hmma_per_tile(head_size) * HMMA_STEP_FLOPS
    issue_s = (
        tiles
        * CUDA_DECODE_LOOP_INSTRUCTIONS[(head_size, kv_dtype)]
        / (V100_SMS * V100_ISSUE_PER_CLOCK * V100_CLOCK_HZ)
    )
    bytes_s = io / V100_BANDWIDTH
    return {
        "sm70_bytes": io,
        "sm70_bytes_ms": bytes_s * 1e3,
        "sm70_hmma_flops": flops,
        "sm70_hmma_ms": flops / V100_TENSOR_FLOPS * 1e3,
        "sm70_issue_ms": issue_s * 1e3,
        "sm70_estimate_ms": max(bytes_s, flops / V100_TENSOR_FLOPS, issue_s) * 1e3,
    }


def triton_decode_sm70_ms(batch, ctx, heads, kv_heads, head_size, kv_dtype) -> float:
    """The Triton decode's SM70 estimate, as :func:`decode_case` computes it: 16 rows (the group
    padded) x keys x head, twice, on the FMA units, or the bytes."""
    kv_bytes = batch * ctx * kv_heads * 2 * head_size * (2 if kv_dtype == "float16" else 1)
    io = kv_bytes + 2 * batch * heads * head_size * 2
    rows = decode_tiles(SM70, head_size, 16, kv_fp8=False).block_m
    fmas = 2 * batch * kv_heads * rows * ctx * head_pad(head_size)
    return max(io / V100_BANDWIDTH, 2 * fmas / V100_FP32_FLOPS) * 1e3


def fma_decode_sm70_ms(batch, ctx, heads, kv_heads, head_size, kv_dtype) -> float:
    """The SM70 estimate of the design issue 34 also allowed and the decode does not take: FMA
    code with the group unpadded (2 x group x head FFMA per key and KV head) that converts each
    K/V element to fp32 once (2 x head conversions per key and KV head, at a quarter of FFMA's
    rate), or the bytes."""
    group = heads // kv_heads
    kv_bytes = batch * ctx * kv_heads * 2 * head_size * (2 if kv_dtype == "float16" else 1)
    io = kv_bytes + 2 * batch * heads * head_size * 2
    keys = batch * ctx * kv_heads
    cycles = keys * (
        2 * group * head_size / V100_FFMA_PER_CLOCK + 2 * head_size / V100_CONVERT_PER_CLOCK
    )
    return max(io / V100_BANDWIDTH, cycles / (V100_SMS * V100_CLOCK_HZ)) * 1e3


def cuda_decode_estimates() -> list[dict]:
    """The SM70 estimates of every issue-34 decode target (no GPU needed): the tensor-core
    decode's, its bytes' time, the Triton decode's and the FMA design's."""
    rows = []
    for head_size, (heads, kv_heads), (batch, ctx), kv_dtype in itertools.product(
        CUDA_DECODE_HEAD_SIZES, CUDA_DECODE_HEADS, CUDA_DECODE_SHAPES, ("float16", "fp8_e5m2")
    ):
        shape = (batch, ctx, heads, kv_heads, head_size, kv_dtype)
        rows.append(
            {
                "head_size": head_size,
                "heads": f"{heads}/{kv_heads}",
                "batch": batch,
                "context": ctx,
                "kv_dtype": kv_dtype,
                **cuda_decode_estimate(*shape),
                "triton_sm70_estimate_ms": triton_decode_sm70_ms(*shape),
                "fma_sm70_estimate_ms": fma_decode_sm70_ms(*shape),
            }
        )
    return rows


def cuda_decode_case(batch, ctx, heads, kv_heads, head_size, kv_dtype, copy_bw) -> dict:
    """The tensor-core decode launched directly (this GPU's table keeps Triton), built for this
    GPU, where ``mma.m8n8k4`` runs emulated: timed as :func:`decode_case` times the Triton
    decode (one captured graph, rotating input sets), with its achieved bandwidth here and its
    SM70 estimate."""
    from volta_attn_v100.cuda import decode

    kv_bytes = batch * ctx * kv_heads * 2 * head_size * (2 if kv_dtype == "float16" else 1)
    sets = max(1, min(64, math.ceil(ROTATE_BYTES / kv_bytes)))
    torch.manual_seed(DECODE_SEED)
    inputs = [
        make_decode_inputs(batch, ctx, heads, kv_heads, kv_dtype, head_size=head_size)
        for _ in range(sets)
    ]
    out = torch.empty_like(inputs[0][0])
    splits = default_num_splits(batch, kv_heads, ctx, "cuda", kv_dtype)
    launch = cuda_decode_launch(
        kv_dtype=kv_dtype, head_size=head_size, num_heads=heads, num_kv_heads=kv_heads,
        num_seqs=batch, max_query_len=1, num_splits=splits,
    )  # fmt: skip
    unit = torch.ones(1, dtype=torch.float32, device="cuda")
    if not decode.ready(out.device, head_size, kv_dtype):
        raise SystemExit("the tensor-core decode needs NVRTC (pip install vllm-volta-core[cuda])")

    def run(q, kv, block_table, seq_lens, q_start):
        decode.launch(
            q, kv, block_table, seq_lens, q_start, out, k_scale=unit, v_scale=unit,
            scale_stride=0, sinks=unit, has_sinks=0, sm_scale=head_size**-0.5, softcap=0.0,
            window=0, launch=launch,
        )  # fmt: skip

    run(*inputs[0])
    ms = time_cuda_graph(run, inputs).median_ms
    estimate = cuda_decode_estimate(batch, ctx, heads, kv_heads, head_size, kv_dtype)
    bw = estimate["sm70_bytes"] / (ms * 1e-3)
    return {
        "kind": "cuda_decode",
        "head_size": head_size,
        "heads": f"{heads}/{kv_heads}",
        "batch": batch,
        "context": ctx,
        "kv_dtype": kv_dtype,
        "splits": splits,
        "ms": ms,
        "bandwidth_GBps": bw / 1e9,
        "fraction_of_copy": bw / copy_bw,
        **estimate,
    }


def print_cuda_decode(results: dict) -> None:
    """The tensor-core decode: the SM70 estimate of every target (e5m2's beside fp16's, issue
    34: within 10% of the bytes, e5m2 at most 0.55x fp16), then the rows timed on this GPU."""
    rows = results.get("cuda_decode_estimates", [])
    if rows:
        print("cuda decode, SM70 estimates (ms; V100 estimated, not measured)")
        print(
            "  head heads batch x ctx   fp16 est  /bytes  e5m2 est  /bytes  e5m2/fp16  "
            "triton fp16/e5m2  fma fp16/e5m2"
        )
        by_key = {
            (r["head_size"], r["heads"], r["batch"], r["context"], r["kv_dtype"]): r for r in rows
        }
        for r in rows:
            if r["kv_dtype"] != "float16":
                continue
            e = by_key[(r["head_size"], r["heads"], r["batch"], r["context"], "fp8_e5m2")]
            print(
                f"  {r['head_size']:4d} {r['heads']:5s} {r['batch']:4d} x {r['context']:5d} "
                f"{r['sm70_estimate_ms']:8.3f} {r['sm70_estimate_ms'] / r['sm70_bytes_ms']:6.2f}  "
                f"{e['sm70_estimate_ms']:8.3f} {e['sm70_estimate_ms'] / e['sm70_bytes_ms']:6.2f}  "
                f"{e['sm70_estimate_ms'] / r['sm70_estimate_ms']:8.3f}  "
                f"{r['triton_sm70_estimate_ms']:7.3f}/{e['triton_sm70_estimate_ms']:7.3f}  "
                f"{r['fma_sm70_estimate_ms']:6.3f}/{e['fma_sm70_estimate_ms']:6.3f}"
            )
    timed = results.get("cuda_decode", [])
    if timed:
        print("cuda decode here (V100 build, m8n8k4 emulated on this GPU: measured, not a V100's)")
        print("  head heads batch x ctx  kv        ms here    GB/s  %copy  splits  sm70 est")
        for r in timed:
            print(
                f"  {r['head_size']:4d} {r['heads']:5s} {r['batch']:4d} x {r['context']:5d} "
                f"{r['kv_dtype']:8s} {r['ms']:8.3f} {r['bandwidth_GBps']:7.0f} "
                f"{100 * r['fraction_of_copy']:5.1f}% {r['splits']:6d} {r['sm70_estimate_ms']:9.3f}"
            )


#: Seed of the first input set of every decode measurement, so each sweep variant's output on
#: that set can be compared with the shipped configuration's on the same set.
DECODE_SEED = 1234

#: The sweep's sections, in the order they run (``--sweep-sections`` picks some).
SWEEP_SECTIONS = (
    "split policy",
    "combine",
    "fp8 tiles",
    "batch-1 tiles",
    "64/8 tiles",
    "prefill tiles",
)

#: Sweep, split policy (32/8 heads, fp16 and fp8): first None, the shipped policy of each KV
#: dtype (the device table's), then fixed ones for both.
SWEEP_SPLIT_POLICIES: list[SplitPolicy | None] = [
    None,
    *(
        SplitPolicy(p, k, n)
        for p, k, n in ((2, 64, 32), (3, 64, 32), (4, 64, 32), (2, 128, 64), (1, 64, 32))
    ),
]
SWEEP_SPLIT_SHAPES = [(1, 8192), (1, 1024), (8, 8192), (16, 8192)]
#: Sweep, fp8 decode tiles on SM80+ (16 rows; keys, warps, stages), 32/8 heads: shipped first.
SWEEP_FP8_TILES = [
    Tiles(16, n, w, st) for n, w, st in ((128, 4, 2), (128, 4, 3), (256, 4, 2), (64, 4, 3))
]
SWEEP_FP8_SHAPES = [(64, 8192), (32, 16384)]
#: Sweep, 64/8 heads (8 query heads per KV head: 8 of 16 rows used, 8 of 32 with 32 rows) at
#: 128 x 2K fp16: rows, keys and warps; shipped first.
SWEEP_WIDE_GROUP_TILES = [
    Tiles(m, n, w, 2) for m, n, w in itertools.product((16, 32), (64, 32), (4, 8))
]
SWEEP_WIDE_GROUP_SHAPE = (128, 2048)
#: Sweep, fp16 decode tiles at batch 1 (1 x 8K and 1 x 32K, 32/8): more stages or wider tiles
#: put more of a short partition's keys in flight at once; shipped first.
SWEEP_BATCH1_TILES = [
    Tiles(16, n, w, st)
    for n, w, st in ((64, 4, 2), (64, 8, 2), (64, 8, 3), (64, 4, 3), (128, 8, 2))
]
SWEEP_BATCH1_SHAPES = [(1, 8192), (1, 32768)]
#: Sweep, the partitions' combine: partial floats per L2 round trip in every launch (4 rows x
#: 128 per partition at 32/8 heads: 2048 -> 4 partitions, 4096 -> 8, 16384 -> 32); first None,
#: the shipped choice (narrow or wide, as the table picks), then the table's two step sizes.
SWEEP_COMBINE_FLOATS: list[int | None] = [
    None,
    SM80.combine.floats,
    WideCombine().floats,
    8192,
]
SWEEP_COMBINE_SHAPES = [(1, 8192), (1, 32768), (32, 16384)]
#: Sweep, prefill: both SM80+ tiles (64 and 128 keys) against the shipped choice, at a query
#: length below the table's ``long_query`` and one above it.
SWEEP_PREFILL_TILES = [Tiles(128, 64, 8, 2), Tiles(128, 128, 8, 2)]
SWEEP_PREFILL_LENS = (512, 2048)
#: Head size of every sweep shape (the variants' tiles are this head size's).
SWEEP_HEAD_SIZE = 128


def _with_wide_floats(policy: KVPolicy, floats: int) -> KVPolicy:
    if policy.wide_combine is None:
        return policy
    return replace(policy, wide_combine=replace(policy.wide_combine, floats=floats))


def sweep_table(
    base: LaunchTable,
    *,
    split: SplitPolicy | None = None,
    combine_floats: int | None = None,
    decode: Tiles | None = None,
    prefill: Tiles | None = None,
) -> LaunchTable:
    """``base`` with one sweep variant: ``split`` for both KV dtypes; ``combine_floats`` partial
    floats per step in every split launch, wide or not; ``decode`` as the one decode tile of
    :data:`SWEEP_HEAD_SIZE` (its rows whatever the head group, its stages with scores ahead
    too) or ``prefill`` as its one prefill tile."""
    table = base
    pad = head_pad(SWEEP_HEAD_SIZE)
    if split is not None:
        table = replace(
            table, fp16=replace(table.fp16, split=split), fp8=replace(table.fp8, split=split)
        )
    if combine_floats is not None:
        table = replace(
            table,
            combine=replace(table.combine, floats=combine_floats),
            fp16=_with_wide_floats(table.fp16, combine_floats),
            fp8=_with_wide_floats(table.fp8, combine_floats),
        )
    if decode is not None:
        tile = DecodeTile(decode.block_n, decode.block_n, decode.num_warps, decode.num_stages)
        table = replace(table, decode_tiles={(pad, decode.block_m): tile}, ahead_stages={})
    if prefill is not None:
        table = replace(table, prefill_tiles={pad: PrefillTiles(prefill)})
    return table


def _decode_output(batch, ctx, heads, kv_heads, kv_dtype, table) -> torch.Tensor:
    """The output on the first (seeded) input set of :func:`decode_case`, launched from
    ``table``."""
    torch.manual_seed(DECODE_SEED)
    inputs = make_decode_inputs(batch, ctx, heads, kv_heads, kv_dtype)
    out = torch.full_like(inputs[0], float("nan"))
    decode_call(ctx, kv_dtype, out, table)(*inputs)
    return out


def _prefill_output(seq_len: int, table: LaunchTable | None = None) -> torch.Tensor:
    torch.manual_seed(1234)
    batch, heads, kv_heads, head_size = 2, 32, 8, SWEEP_HEAD_SIZE
    pages = math.ceil(seq_len / 16)
    kv = torch.randn((batch * pages, kv_heads, 16, 2 * head_size), device="cuda").half()
    blocks = torch.randperm(batch * pages, device="cuda").to(torch.int32).view(batch, pages)
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device="cuda")
    q_start = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * seq_len
    query = torch.randn(batch * seq_len, heads, head_size, device="cuda").half()
    out = torch.full_like(query, float("nan"))
    paged_attention(
        query, kv, blocks, seq_lens, q_start, out,
        max_query_len=seq_len, max_seq_len=seq_len, sm_scale=head_size**-0.5, table=table,
    )  # fmt: skip
    return out


def _max_abs_diff(out: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest difference to the shipped output; NaN (a row left unwritten) reads as inf."""
    diff = (out.float() - reference.float()).abs()
    return float(torch.nan_to_num(diff, nan=float("inf")).max())


def sweep(copy_bw: float, sections: set[str] | None = None) -> list[dict]:
    """Leads for tuning, not the shipped configuration (``--parts sweep``).

    Sections: decode split policies (1 x 8K and 1 x 1K, 32/8, fp16 and fp8), the combine's
    partitions per step (1 x 8K, 1 x 32K and 32 x 16K, fp16 and fp8), fp8 decode tiles
    (64 x 8K and 32 x 16K, 32/8), fp16 decode tiles at batch 1 (1 x 8K and 1 x 32K, 32/8),
    64/8 decode tiles (128 x 2K fp16) and the prefill tiles (32 x 512 and 8 x 2048). Each row
    is timed like the main table, launched from the device's table changed by the variant
    (:func:`sweep_table`). The first variant of each
    decode section is the shipped configuration, and every variant's output on the shape's
    first input set is compared with the shipped output on the same set (``max_abs_diff``,
    inf if a row was left unwritten). One progress line per row.
    """
    rows: list[dict] = []
    shipped_out: dict[tuple, torch.Tensor] = {}
    base = table_for(torch.cuda.get_device_capability())

    def wanted(section: str) -> bool:
        return sections is None or section in sections

    def decode_row(section, variant, batch, ctx, heads, kv_heads, kv_dtype, table):
        if not wanted(section):
            return
        key = (batch, ctx, heads, kv_heads, kv_dtype)
        out = _decode_output(*key, table)
        row = decode_case(*key, copy_bw, table=table)
        reference = shipped_out.setdefault(key, out)
        row.update(section=section, variant=variant, max_abs_diff=_max_abs_diff(out, reference))
        rows.append(row)
        progress(row)

    for policy in SWEEP_SPLIT_POLICIES:
        name = (
            "shipped"
            if policy is None
            else f"{policy.programs_per_sm}/SM, >={policy.min_keys_per_split} keys, "
            f"<={policy.max_splits}"
        )
        table = sweep_table(base, split=policy)
        for (batch, ctx), kv_dtype in itertools.product(
            SWEEP_SPLIT_SHAPES, ("float16", "fp8_e5m2")
        ):
            decode_row("split policy", name, batch, ctx, 32, 8, kv_dtype, table)
    for floats in SWEEP_COMBINE_FLOATS:
        name = "shipped" if floats is None else f"{floats} floats per step"
        table = sweep_table(base, combine_floats=floats)
        for (batch, ctx), kv_dtype in itertools.product(
            SWEEP_COMBINE_SHAPES, ("float16", "fp8_e5m2")
        ):
            decode_row("combine", name, batch, ctx, 32, 8, kv_dtype, table)
    for tiles in SWEEP_FP8_TILES:
        name = f"{tiles.block_n} keys, {tiles.num_warps} warps, {tiles.num_stages} stages"
        for batch, ctx in SWEEP_FP8_SHAPES:
            decode_row(
                "fp8 tiles", name, batch, ctx, 32, 8, "fp8_e5m2", sweep_table(base, decode=tiles)
            )
    for tiles in SWEEP_BATCH1_TILES:
        name = f"{tiles.block_n} keys, {tiles.num_warps} warps, {tiles.num_stages} stages"
        for batch, ctx in SWEEP_BATCH1_SHAPES:
            table = sweep_table(base, decode=tiles)
            decode_row("batch-1 tiles", name, batch, ctx, 32, 8, "float16", table)
    for tiles in SWEEP_WIDE_GROUP_TILES:
        name = f"{tiles.block_m} rows, {tiles.block_n} keys, {tiles.num_warps} warps"
        batch, ctx = SWEEP_WIDE_GROUP_SHAPE
        table = sweep_table(base, decode=tiles)
        decode_row("64/8 tiles", name, batch, ctx, 64, 8, "float16", table)
    if not wanted("prefill tiles"):
        return rows
    prefill_ref = _prefill_output(2048)
    for seq_len in SWEEP_PREFILL_LENS:
        for tiles in (None, *SWEEP_PREFILL_TILES):
            table = sweep_table(base, prefill=tiles)
            error = _max_abs_diff(_prefill_output(2048, table), prefill_ref)
            row = prefill_case(seq_len, table=table)
            name = "shipped" if tiles is None else f"{tiles.block_m} x {tiles.block_n}, "
            if tiles is not None:
                name += f"{tiles.num_warps} warps, {tiles.num_stages} stages"
            row.update(section="prefill tiles", variant=name, max_abs_diff=error)
            rows.append(row)
            progress(row)
    return rows


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5))
    dec = [r for r in results["decode"] if r["head_size"] == 128]
    labels = sorted({(r["batch"], r["context"]) for r in dec})
    width = 0.2
    for i, (heads, kv) in enumerate(
        [(h, k) for h in ("32/8", "64/8") for k in ("float16", "fp8_e5m2")]
    ):
        vals = [
            next(
                r["fraction_of_copy"]
                for r in dec
                if (r["batch"], r["context"]) == lab and r["heads"] == heads and r["kv_dtype"] == kv
            )
            for lab in labels
        ]
        ax1.bar([j + i * width for j in range(len(labels))], vals, width, label=f"{heads} {kv}")
    ax1.axhline(0.85, color="k", ls="--", lw=0.8)
    ax1.set_xticks([j + 1.5 * width for j in range(len(labels))])
    ax1.set_xticklabels([f"{b}x{c // 1024}K" for b, c in labels], rotation=45)
    ax1.set_ylabel("effective bandwidth / copy bandwidth")
    ax1.set_title(f"decode, head 128, block 16 ({results['device']})")
    ax1.legend(fontsize=8)
    pre = [
        r
        for r in results["prefill"]
        if (r["kind"], r["kv_dtype"], r["head_size"]) == ("prefill", "float16", 128)
    ]
    xs = range(len(pre))
    ax2.bar([x - 0.2 for x in xs], [r["TFLOPs"] for r in pre], 0.4, label="volta_attn_v100")
    ax2.bar([x + 0.2 for x in xs], [r["sdpa_TFLOPs"] for r in pre], 0.4, label="SDPA flash")
    ax2.set_xticks(list(xs))
    ax2.set_xticklabels([f"{r['batch']}x{r['seq_len']}" for r in pre])
    ax2.set_ylabel("TFLOP/s (causal)")
    ax2.set_title("prefill 16K tokens, 32/8 heads, head 128, fp16")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument(
        "--parts",
        default="decode,prefill,sweep",
        help=f"comma-separated parts to run: {', '.join(PARTS)}",
    )
    parser.add_argument(
        "--sweep-sections",
        default=None,
        help="comma-separated sweep sections to run (default all), e.g. 'combine,fp8 tiles'",
    )
    args = parser.parse_args(argv)
    sections = set(args.sweep_sections.split(",")) if args.sweep_sections else None
    unknown = sorted((sections or set()) - set(SWEEP_SECTIONS))
    if unknown:
        parser.error(f"unknown sweep sections {unknown}; known: {', '.join(SWEEP_SECTIONS)}")
    parts = set(args.parts.split(","))
    unknown = sorted(parts - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
    if "e4m3" in parts and "decode" not in parts:
        parser.error("--parts e4m3 adds rows beside the decode part's: name decode too")
    if not torch.cuda.is_available():
        raise SystemExit("the benchmarks need a CUDA GPU")
    fp8_dtypes: tuple[str, ...] = ("fp8_e5m2",)
    if "e4m3" in parts:
        refusal = kv_dtype_refusal("fp8_e4m3", torch.cuda.get_device_capability())
        if refusal:
            raise SystemExit(refusal)
        fp8_dtypes += ("fp8_e4m3",)
    import triton

    args.out.mkdir(parents=True, exist_ok=True)
    copy_bw = copy_bandwidth()
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "copy_bandwidth_GBps": copy_bw / 1e9,
        "decode": [],
        "prefill": [],
    }
    shapes = DECODE_SHAPES[:3] if args.quick else DECODE_SHAPES
    for heads, kv_heads in DECODE_HEADS if "decode" in parts else []:
        for batch, ctx in shapes:
            for kv_dtype in ("float16", *fp8_dtypes):
                results["decode"].append(
                    decode_case(batch, ctx, heads, kv_heads, kv_dtype, copy_bw, floor=True)
                )
                progress(results["decode"][-1])
    for seq_len in PREFILL_SEQ_LENS if "prefill" in parts else []:
        results["prefill"].append(prefill_case(seq_len))
        progress(results["prefill"][-1])
    if "prefill" in parts:
        results["prefill"].append(prefill_case(2048, prefix=8192))
        progress(results["prefill"][-1])
        for prefix, kv_dtype in itertools.product((0, 8192), fp8_dtypes):
            results["prefill"].append(prefill_case(2048, prefix=prefix, kv_dtype=kv_dtype))
            progress(results["prefill"][-1])
    if "d512" in parts:
        heads, kv_heads = D512_HEADS
        for batch, ctx in D512_DECODE_SHAPES:
            for kv_dtype in ("float16", "fp8_e5m2"):
                row = decode_case(
                    batch, ctx, heads, kv_heads, kv_dtype, copy_bw, floor=True, head_size=512
                )
                results["decode"].append(row)
                progress(row)
        for kv_dtype in ("float16", "fp8_e5m2"):
            row = prefill_case(
                D512_PREFILL_SEQ_LEN, heads=heads, kv_heads=kv_heads, head_size=512,
                kv_dtype=kv_dtype,
            )  # fmt: skip
            results["prefill"].append(row)
            progress(row)
    if "cuda_prefill" in parts:
        results["cuda_prefill"] = []
        for seq_len in CUDA_PREFILL_SEQ_LENS:
            if "prefill" not in parts or seq_len not in PREFILL_SEQ_LENS:
                results["prefill"].append(prefill_case(seq_len))
                progress(results["prefill"][-1])
            for kv_dtype in ("float16", "fp8_e5m2"):
                results["cuda_prefill"].append(cuda_prefill_case(seq_len, kv_dtype=kv_dtype))
                progress(results["cuda_prefill"][-1])
    if "cuda_decode" in parts:
        results["cuda_decode_estimates"] = cuda_decode_estimates()
        results["cuda_decode"] = []
        for head_size, (heads, kv_heads), (batch, ctx), kv_dtype in itertools.product(
            CUDA_DECODE_HEAD_SIZES,
            CUDA_DECODE_HEADS[::2],
            CUDA_DECODE_SHAPES,
            ("float16", "fp8_e5m2"),
        ):
            row = cuda_decode_case(batch, ctx, heads, kv_heads, head_size, kv_dtype, copy_bw)
            results["cuda_decode"].append(row)
            progress(row)
    if not args.quick and "sweep" in parts:
        results["sweep"] = sweep(copy_bw, sections)
    (args.out / "attn_v100_bench.json").write_text(json.dumps(results, indent=1))
    print_table(results)
    print_sweep(results)
    print_cuda_prefill(results)
    print_cuda_decode(results)
    chart(results, args.out / "attn_v100_bench.png")


def progress(row: dict) -> None:
    """One line per measured case as it completes (a run cut short still shows its figures)."""
    keys = (
        "section", "variant", "head_size", "heads", "batch", "context", "kv_dtype", "seq_len",
        "prefix",
    )  # fmt: skip
    shown = {k: row[k] for k in keys if k in row}
    shown["ms"] = round(row["ms"], 4)
    for k in ("splits", "fraction_of_copy", "TFLOPs", "sdpa_TFLOPs", "max_abs_diff"):
        if k in row:
            shown[k] = round(row[k], 4) if isinstance(row[k], float) else row[k]
    print("case", json.dumps(shown), flush=True)


def _sweep_shape(row: dict) -> str:
    if row["kind"] == "decode":
        return f"{row['heads']} {row['batch']}x{row['context']} {row['kv_dtype']}"
    return f"prefill {row['batch']}x{row['seq_len']}"


def _sweep_figure(row: dict) -> str:
    if row["kind"] == "decode":
        return f"{100 * row['fraction_of_copy']:5.1f}% copy, {row['splits']:2d} splits"
    return f"{row['TFLOPs']:.1f} TFLOP/s ({row['TFLOPs'] / row['sdpa_TFLOPs']:.2f}x SDPA)"


def print_sweep(results: dict) -> None:
    """Every sweep row, then per section and shape the fastest variant against the shipped one
    (the section's first row of that shape)."""
    rows = results.get("sweep", [])
    if not rows:
        return
    print("sweep (tuning leads, not shipped; first variant of each section = shipped)")
    for r in rows:
        print(
            f"  {r['section']:13s} {r['variant']:32s} {_sweep_shape(r):30s} {r['ms']:8.4f} ms  "
            f"{_sweep_figure(r)}  max|diff| {r['max_abs_diff']:.1e}"
        )
    print("sweep: best per shape")
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["section"], _sweep_shape(r)), []).append(r)
    for (section, shape), group in groups.items():
        best = min(group, key=lambda r: r["ms"])
        shipped = group[0]
        print(
            f"  {section:13s} {shape:30s} best {best['variant']:32s} {best['ms']:8.4f} ms "
            f"({best['ms'] / shipped['ms']:.3f}x shipped {shipped['ms']:.4f} ms)  "
            f"{_sweep_figure(best)}"
        )


def print_table(results: dict) -> None:
    print(
        f"\n{results['device']} torch {results['torch']} triton {results['triton']} "
        f"copy {results['copy_bandwidth_GBps']:.0f} GB/s"
    )
    print(
        "decode  head heads batch x ctx  kv        ms      GB/s  %copy  fp8/fp16  splits  sm70_ms"
        "  floor_ms  floor/ms"
    )
    by_key = {
        (r["head_size"], r["heads"], r["batch"], r["context"], r["kv_dtype"]): r
        for r in results["decode"]
    }
    for r in results["decode"]:
        fp16 = by_key[(r["head_size"], r["heads"], r["batch"], r["context"], "float16")]
        print(
            f"        {r['head_size']:4d} {r['heads']:5s} {r['batch']:4d} x {r['context']:5d} "
            f"{r['kv_dtype']:8s} "
            f"{r['ms']:7.3f} {r['bandwidth_GBps']:8.0f} {100 * r['fraction_of_copy']:5.1f}% "
            f"{r['ms'] / fp16['ms']:7.2f}x {r['splits']:6d} {r['sm70_estimate_ms']:8.3f}"
            f"  {r['read_floor_ms']:8.4f}  {r['read_floor_ms'] / r['ms']:7.2f}"
        )
    print("prefill head seq   prefix batch kv         ms     TFLOP/s  sdpa TFLOP/s  ratio  sm70_ms")
    for r in results["prefill"]:
        sdpa = r.get("sdpa_TFLOPs")
        ratio = f"{r['TFLOPs'] / sdpa:5.2f}" if sdpa else "  -  "
        sdpa_s = f"{sdpa:8.1f}" if sdpa else "       -"
        print(
            f"        {r['head_size']:4d} {r['seq_len']:5d} {r['prefix']:6d} {r['batch']:4d} "
            f"{r['kv_dtype']:8s} "
            f"{r['ms']:7.3f} "
            f"{r['TFLOPs']:8.1f} {sdpa_s}     {ratio} {r['sm70_estimate_ms']:8.2f}"
        )


if __name__ == "__main__":
    main()
