"""Fused-MoE prefill benchmark (issue 35 item 2): ``python
plugins/ct_wna16/benchmarks/ct_wna16_moe_prefill_bench.py --out DIR [--ms 256 2048]
[--budget-s 180] [--jobs 8]`` (needs CUDA; imports as :mod:`ct_wna16_moe_bench` does).

For the two MoE layers of :mod:`ct_wna16_moe_bench` (int4, group 128, symmetric) at 256 and
2048 tokens, the routed-blocks path above 16 tokens
(:func:`volta_ct_wna16.kernels.moe.wna16_moe_kernel`), each figure inside one CUDA graph
(:func:`volta_devkit.bench.time_cuda_graph`) over two random routings (each reads every
expert, far more bytes than the L2 holds):

* the tile sweep: ``kernels`` (gate/up and down on blocks routed beforehand, as
  :func:`ct_wna16_moe_bench.kernels_ms` times them) for every tile of :func:`candidates`,
  the table's own two tiles first, run candidate by candidate over all four cases so that a
  sweep stopped by ``--budget-s`` still compares the same tiles everywhere; each checked
  against a float32 dense reference first (wrong ones are marked and never "best");
* the stage split of the table's tile and of each case's fastest: routing, gate/up, the SiLU
  product, down (with its memset of the fp32 rows it adds into), the cast, and the whole step;
  beside down, down storing one fp16 row per pair (no atomic adds) plus the sum over top-k in
  torch (vLLM's order of work), to show what the atomic adds cost;
* the dense reference: fp16 cuBLAS on the same per-expert shapes, ``torch.bmm`` over
  ``[experts, rows, K]`` with each expert's routed rows gathered and zero-padded to the largest
  count (one bmm for gate/up, one for down, the gathering not timed), as a rate over the routed
  FLOPs (the padding's excluded; ``pad TF`` counts it); ``mm``: the same routed FLOPs as two
  products with one expert's weights (no grouping at all); and fp16 cuBLAS's 8192-cube rate.

The sweep's tiles run with ``SLOT_DOTS`` off through this script's launcher
(:func:`moe_gemm`, the library's launch without input splits); tiles marked ``*`` run through
:func:`volta_ct_wna16.ops.moe_linear` as the table's tiles do (``/sd``: its 128-input tiles
take one dot per word slot). ``/swap``: the kernel's transposed tile (``Launch.swap``, the
weights as the dot's first operand); ``/sr``: scales loaded per word row where the groups
would allow one row per tile (the library's rule for swapped tiles,
:func:`volta_ct_wna16.launch.group_tile`; this script's launcher takes it per candidate). The
table's large tile also runs unswapped (its ``*`` twin) for comparison. ``--jobs``
processes compile every tile first (:func:`precompile`) while this one builds the layers and
references; ``--budget-s`` (from the start) stops the sweep starting tiles, so the tables still
print.

Writes ``DIR/ct_wna16_moe_prefill_bench.json`` after every step; prints the tables last.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

# Beside this script: the MoE and linear benchmarks (which put plugins/ct_wna16/tests on the
# path for the checkpoint maker).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ct_wna16_bench import matmul_flops, start, versions
from ct_wna16_moe_bench import MODELS, dense_experts, routings, stack

from volta_ct_wna16 import ops
from volta_ct_wna16.dispatch import moe_blocks_choice
from volta_ct_wna16.experts import ExpertWeights
from volta_ct_wna16.launch import group_tile, moe_constexprs, moe_splits, slot_dots
from volta_ct_wna16.layout import PackedWeights
from volta_ct_wna16.routing import Blocks, route
from volta_ct_wna16.tables import MOE, Launch, table_for
from volta_devkit.bench import time_cuda_graph

MS = (256, 2048)
#: Routings per case: at 256 tokens and above every one routes to nearly every expert, so two
#: already read far more weight bytes per replay than an H100's 50 MB L2 holds.
ROUTINGS = 2
REPLAYS = 5
#: Largest relative error (to the largest reference value) a swept tile may show: the fp16
#: intermediates alone give about 1e-3 against the float32 reference.
TOLERANCE = 1e-2
#: The weights' bit width and group size: the sweep's layers are int4 in groups of 128
#: (:func:`ct_wna16_moe_bench.stack`).
BITS = 4
GROUP = 128


@dataclass(frozen=True)
class Candidate:
    """One routed-blocks tile. ``library``: launched by
    :func:`volta_ct_wna16.ops.moe_linear`, exactly as the table's tiles are (``SLOT_DOTS`` as
    :func:`volta_ct_wna16.launch.slot_dots` derives it, input splits for 16-row tiles, scales
    per tile as :func:`volta_ct_wna16.launch.group_tile` decides); else by :func:`moe_gemm`
    with ``SLOT_DOTS`` off, which takes tiles of more than 16 rows only (they never split the
    input)."""

    launch: Launch
    library: bool = False
    scale_rows: bool = False
    """:func:`moe_gemm` loads the scales per word row (``GROUP_TILE`` off) even where one row
    per tile would serve (the library's rule for a swapped tile; its own tiles follow it)."""

    def __post_init__(self) -> None:
        if self.launch.path != MOE or not self.launch.use_dot:
            raise ValueError(f"a routed-blocks tile is a fused-MoE dot tile: {self.launch}")
        if self.library and self.scale_rows:
            raise ValueError(f"the library's launch decides where scales load per row: {self}")
        if not self.library and moe_splits(self.launch):
            raise ValueError(
                f"tiles of up to 16 rows split the input, run as the library's: {self}"
            )

    @property
    def per_row_scales(self) -> bool:
        """Whether the scales load per word row on the sweep's layers, whose groups would
        allow one row per tile."""
        if self.library:
            return not group_tile(self.launch, GROUP)
        return self.scale_rows

    @property
    def label(self) -> str:
        t = self.launch
        label = f"m{t.block_m}n{t.block_n}k{t.block_k}w{t.num_warps}s{t.num_stages}"
        if self.library:
            label += "*" + ("/sd" if slot_dots(t, BITS) else "")
        return label + ("/swap" if t.swap else "") + ("/sr" if self.per_row_scales else "")


def tile(m: int, n: int, k: int, warps: int, stages: int, swap: bool = False) -> Launch:
    return Launch(
        MOE,
        block_m=m,
        block_n=n,
        block_k=k,
        use_dot=True,
        num_warps=warps,
        num_stages=stages,
        swap=swap,
    )


def candidates(capability: tuple[int, int]) -> list[Candidate]:
    """The table's two tiles (and the large one's unswapped twin, where it swaps), then the
    sweep: 32, 64 and 128 rows (2048 tokens average 64
    rows an expert on the Qwen3.5 layer, 128 on Qwen3-30B; 256 tokens 8 and 16), 64-256
    outputs, 32-128 inputs a step, 4 or 8 warps, 2-4 stages, pruned to one-step variations
    around each row count's likely best plus the larger tiles; then swapped tiles
    (``/swap``, of more than 16 rows: ``Launch.swap``); then a few with the scales loaded per
    word row (``/sr``: :attr:`Candidate.scale_rows`); last, a 128-input tile with
    one dot per word slot (``/sd``), as the library would run it. Every one compiled for
    sm_90 (``volta_devkit.gate`` with ``capability=90``) without spilling, on at most 254
    registers and 145 KB of shared memory (an H100 block may take 227 KB)."""
    tiles = table_for(capability)
    table = [Candidate(tiles.moe, library=True), Candidate(tiles.moe_large, library=True)]
    if tiles.moe_large.swap:
        table.append(Candidate(replace(tiles.moe_large, swap=False), library=True))
    shapes = [
        # 64 rows: the table's 2048-token tile (128x64, 4 warps, 3 stages) varied one way.
        (64, 128, 64, 4, 2), (64, 128, 64, 4, 4), (64, 128, 64, 8, 3), (64, 128, 64, 8, 4),
        (64, 128, 32, 4, 4), (64, 128, 128, 4, 3), (64, 128, 128, 8, 3), (64, 64, 64, 4, 3),
        (64, 256, 64, 4, 3), (64, 256, 64, 8, 3),
        # 128 rows: one block holds most experts' rows at 2048 tokens (dequantized once).
        (128, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 32, 8, 4),
        (128, 128, 128, 8, 3), (128, 256, 64, 8, 3), (128, 64, 64, 4, 3),
        # 32 rows: the 256-token cases' block (8 and 16 rows an expert on average).
        (32, 128, 64, 4, 3), (32, 128, 64, 8, 3), (32, 128, 128, 4, 3), (32, 64, 64, 4, 3),
        (32, 256, 64, 8, 3), (32, 128, 32, 4, 4),
    ]  # fmt: skip
    swapped = [
        (64, 128, 64, 4, 3), (64, 128, 64, 8, 3), (64, 64, 64, 4, 3), (64, 256, 64, 8, 3),
        (64, 128, 128, 4, 3), (128, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 128, 32, 4, 4),
        (32, 128, 64, 4, 3), (32, 128, 128, 4, 3),
    ]  # fmt: skip
    sweep = [Candidate(tile(*shape)) for shape in shapes]
    sweep += [Candidate(tile(*shape, swap=True)) for shape in swapped]
    rows = [(64, 128, 64, 4, 3), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (32, 128, 64, 4, 3)]
    sweep += [Candidate(tile(*shape, swap=True), scale_rows=True) for shape in rows]
    sweep += [Candidate(tile(64, 128, 64, 4, 3), scale_rows=True)]
    labels = {c.label.replace("*", "") for c in table}
    sweep = [c for c in sweep if c.label not in labels]  # the table's tiles run as the library's
    return [*table, *sweep, Candidate(tile(64, 128, 128, 4, 3), library=True)]


def moe_gemm(
    x: torch.Tensor,
    pw: PackedWeights,
    blocks: Blocks,
    cand: Candidate,
    row_div: int,
    router: torch.Tensor | None = None,
    sum_slots: int = 0,
) -> torch.Tensor:
    """One routed-blocks launch as :func:`volta_ct_wna16.ops.moe_linear` makes it (same
    arguments, same outputs), with ``SLOT_DOTS`` off for a tile that is not ``library``'s and
    its scales per tile wherever the groups allow it, unless :attr:`Candidate.scale_rows`."""
    if cand.library:
        return ops.moe_linear(x, pw, blocks, cand.launch, row_div, router, sum_slots)
    from volta_ct_wna16 import kernels

    launch = cand.launch
    if blocks.block_m != launch.block_m:
        raise ValueError(f"blocks of {blocks.block_m} rows for a {launch.block_m}-row tile")
    atomic = sum_slots > 0
    rows = blocks.num_pairs // sum_slots if atomic else blocks.num_pairs
    if atomic:
        out = torch.zeros((rows, pw.n), dtype=torch.float32, device=x.device)
    else:
        out = torch.empty((rows, pw.n), dtype=x.dtype, device=x.device)
    if blocks.blocks == 0:
        return out
    zeros = pw.zeros if pw.zeros is not None else x.new_empty(0)
    rw = router if router is not None else x.new_empty(0, dtype=torch.float32)
    consts = moe_constexprs(
        launch, pw.bits, pw.zeros is not None, router is not None,
        pw.group % launch.block_k == 0 and not cand.scale_rows, atomic,
    )  # fmt: skip
    args = (
        x, pw.qweight, pw.scales, zeros, out, rw, blocks.pairs, blocks.experts,
        blocks.num_pairs, pw.n, pw.k, pw.qweight.shape[1], pw.group, blocks.num_experts,
        row_div, max(sum_slots, 1), x.stride(0), out.stride(0), pw.qweight.stride(0),
        pw.scales.stride(0),
    )  # fmt: skip
    grid = (blocks.blocks, -(-pw.n // launch.block_n), 1)
    config = {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
    kernels.wna16_moe_kernel[grid](*args, pw.k, **{**consts, "SLOT_DOTS": False}, **config)
    return out


def forward(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    ids: torch.Tensor,
    weights: ExpertWeights,
    cand: Candidate,
) -> torch.Tensor:
    """The fused step of :func:`volta_ct_wna16.experts.experts_forward` above 16 tokens (no
    expert map, router weight on the output) on ``cand``'s tile."""
    top_k = ids.shape[1]
    blocks = route(ids, weights.num_experts, cand.launch.block_m)
    h = moe_gemm(x, weights.w13, blocks, cand, top_k)
    act = ops.silu_mul(h, x.dtype)
    router = topk_weights.reshape(-1).float()
    y = moe_gemm(act, weights.w2, blocks, cand, 1, router, sum_slots=top_k)
    return y.to(x.dtype)


def pad_by_expert(ids: torch.Tensor, experts: int) -> torch.Tensor:
    """``[experts, rows]`` int64: each expert's routed pairs (``token * top_k + slot``) in
    pair order, then -1; ``rows`` the largest count (at least 1)."""
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    rows = max(1, int(counts.max()))
    by_expert = flat[order]
    first = torch.cumsum(counts, 0) - counts
    place = by_expert * rows + torch.arange(flat.numel(), device=flat.device) - first[by_expert]
    pair_at = torch.full((experts * rows,), -1, dtype=torch.long, device=flat.device)
    pair_at[place] = order
    return pair_at.view(experts, rows)


def gather_rows(x: torch.Tensor, pair_at: torch.Tensor, row_div: int) -> torch.Tensor:
    """``[experts, rows, x.shape[1]]``: row ``p // row_div`` of ``x`` for every pair ``p`` of
    ``pair_at``, zeros where it is padding."""
    rows = x[pair_at.clamp_min(0) // row_div]
    return rows * (pair_at >= 0).unsqueeze(-1).to(x.dtype)


def dense_stacks(weights: ExpertWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """Every expert's dequantized fp16 weights, stacked for ``torch.bmm``: gate/up
    ``[experts, hidden, 2 * inter]`` and down ``[experts, inter, hidden]``."""
    pairs = dense_experts(weights)
    w13 = torch.stack([a for a, _ in pairs])
    w2 = torch.stack([b for _, b in pairs])
    return w13, w2


def dense_output(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    ids: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
) -> torch.Tensor:
    """``sum_k w_k * down(SiLU(gate(x)) * up(x))`` in float32 from the padded per-expert rows
    and :func:`dense_stacks`' weights: the reference the swept tiles are checked against, and
    a check that the padded layout the bmm reference times computes the layer."""
    top_k, inter = ids.shape[1], w2.shape[1]
    pair_at = pad_by_expert(ids, w13.shape[0])
    h = torch.bmm(gather_rows(x, pair_at, top_k).float(), w13.float())
    act = torch.nn.functional.silu(h[..., :inter]) * h[..., inter:]
    y = torch.bmm(act, w2.float())
    valid = pair_at >= 0
    pairs = pair_at[valid]
    out = torch.zeros((x.shape[0], w2.shape[2]), dtype=torch.float32, device=x.device)
    router = topk_weights.reshape(-1).float()[pairs]
    out.index_add_(0, pairs // top_k, y[valid] * router[:, None])
    return out


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest absolute error over the largest reference magnitude."""
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def row_use(counts: list[int], block_m: int) -> float:
    """Routed rows over the rows ``block_m``-row blocks compute for those per-expert counts."""
    computed = sum(-(-c // block_m) * block_m for c in counts)
    return sum(counts) / computed if computed else 0.0


def us(fn: Callable[..., Any], args: list[tuple[Any, ...]]) -> float:
    return time_cuda_graph(fn, args, replays=REPLAYS).median_ms * 1e3


@dataclass
class Case:
    """One layer at one token count: its weights, routings, input and float32 reference."""

    model: str
    m: int
    weights: ExpertWeights
    top_k: int
    x: torch.Tensor
    sets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ref: torch.Tensor
    act: torch.Tensor
    table: Candidate
    """The tile the table gives this many pairs over these experts."""
    blocks: dict[int, list[Blocks]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.model} {self.m}"

    @property
    def flops(self) -> float:
        """The routed FLOPs: every pair through gate/up and down."""
        w = self.weights
        return 2.0 * self.m * self.top_k * 3 * w.hidden * w.inter

    def routed(self, block_m: int) -> list[Blocks]:
        if block_m not in self.blocks:
            self.blocks[block_m] = [
                route(ids, self.weights.num_experts, block_m) for *_, ids in self.sets
            ]
        return self.blocks[block_m]


def make_case(
    model: str, m: int, weights: ExpertWeights, top_k: int, dense: tuple[torch.Tensor, torch.Tensor]
) -> Case:
    gen = torch.Generator().manual_seed(m)
    device = weights.w13.qweight.device
    x = torch.randn(m, weights.hidden, generator=gen).half().to(device)
    sets = routings(m, weights.num_experts, top_k, ROUTINGS, gen)
    ref = dense_output(x, sets[0][1], sets[0][2], *dense)
    act = torch.randn(m * top_k, weights.inter, device=device, dtype=torch.float16)
    launch = moe_blocks_choice(
        m * top_k, weights.num_experts, torch.cuda.get_device_capability()
    ).launch
    return Case(model, m, weights, top_k, x, sets, ref, act, Candidate(launch, library=True))


def kernels_us(case: Case, cand: Candidate) -> float:
    """Gate/up and down on blocks routed beforehand (routing, SiLU product and cast left out)."""
    w, top_k = case.weights, case.top_k
    blocks = case.routed(cand.launch.block_m)

    def kernels(i: int) -> None:
        moe_gemm(case.x, w.w13, blocks[i], cand, top_k)
        router = case.sets[i][1].reshape(-1)
        moe_gemm(case.act, w.w2, blocks[i], cand, 1, router, sum_slots=top_k)

    return us(kernels, [(i,) for i in range(len(case.sets))])


def stages_us(case: Case, cand: Candidate) -> dict[str, float]:
    """Each launch group of the step alone on its own inputs, then the step whole."""
    w, top_k, x = case.weights, case.top_k, case.x
    bm = cand.launch.block_m
    ids = [s[2] for s in case.sets]
    router = [s[1].reshape(-1) for s in case.sets]
    blocks = case.routed(bm)
    h = [moe_gemm(x, w.w13, b, cand, top_k) for b in blocks]
    act = [ops.silu_mul(hi, x.dtype) for hi in h]
    down_args = list(zip(act, blocks, router, strict=True))
    y = [moe_gemm(a, w.w2, b, cand, 1, r, sum_slots=top_k) for a, b, r in down_args]
    out = {
        "route": us(lambda i: route(i, w.num_experts, bm), [(i,) for i in ids]),
        "gate_up": us(lambda b: moe_gemm(x, w.w13, b, cand, top_k), [(b,) for b in blocks]),
        "silu": us(lambda hi: ops.silu_mul(hi, x.dtype), [(hi,) for hi in h]),
        "down": us(lambda a, b, r: moe_gemm(a, w.w2, b, cand, 1, r, sum_slots=top_k), down_args),
        "cast": us(lambda yi: yi.to(x.dtype), [(yi,) for yi in y]),
    }
    out["sum"] = sum(out.values())
    out["step"] = us(lambda tw, i: forward(x, tw, i, w, cand), [s[1:] for s in case.sets])
    if not moe_splits(cand.launch):
        rows = [moe_gemm(a, w.w2, b, cand, 1, r) for a, b, r in down_args]
        out["down_pairs"] = us(lambda a, b, r: moe_gemm(a, w.w2, b, cand, 1, r), down_args)
        out["topk_sum"] = us(lambda r: r.view(case.m, top_k, -1).sum(1), [(r,) for r in rows])
    return out


#: Hidden and intermediate size of the small layers :func:`precompile` runs: multiples of 16
#: in every size, word count and stride, as the benchmark's layers are, so Triton specializes
#: the kernels the same way.
SMALL = 128


@functools.cache
def _small_case(experts: int, top_k: int) -> tuple[ExpertWeights, torch.Tensor, torch.Tensor]:
    weights = stack(experts, SMALL, SMALL, True)
    _, w, ids = routings(32, experts, top_k, 1, torch.Generator().manual_seed(0))[0]
    return weights, w, ids


def precompile(cand: Candidate) -> str | None:
    """Run ``cand``'s step once on a small layer per model (its experts and top-k), so that
    its builds (and the routing's) land in Triton's on-disk cache; the error, if it fails.
    Run in worker processes before the sweep, which then loads the builds from the cache."""
    try:
        for experts, top_k, _, _ in MODELS.values():
            weights, w, ids = _small_case(experts, top_k)
            x = torch.randn(ids.shape[0], SMALL, device=ids.device).half()
            forward(x, w, ids, weights, cand)
        torch.cuda.synchronize()
    except Exception as exc:  # the sweep meets it again and records it
        return repr(exc)[:300]
    return None


def dense_us(case: Case, w13: torch.Tensor, w2: torch.Tensor) -> dict[str, float]:
    """fp16 cuBLAS on the case's shapes: ``bmm`` (each expert's routed rows gathered and
    padded to the largest count beforehand; two ``torch.bmm``), and ``mm`` (the routed rows
    through one expert's weights, two ``torch.mm``); ``bmm_rows``: the padded rows."""
    experts, inter = w13.shape[0], w2.shape[1]
    padded = []
    for _, _, ids in case.sets:
        pair_at = pad_by_expert(ids, experts)
        xs = gather_rows(case.x, pair_at, case.top_k)
        padded.append((xs, torch.randn(*pair_at.shape, inter, device=xs.device).half()))
    pairs_x = case.x.repeat_interleave(case.top_k, 0)
    return {
        "bmm": us(lambda xs, a: (torch.bmm(xs, w13), torch.bmm(a, w2)), padded),
        "bmm_rows": sum(xs.shape[0] * xs.shape[1] for xs, _ in padded) / len(padded),
        "mm": us(lambda xp, a: (xp @ w13[0], a @ w2[0]), [(pairs_x, case.act)]),
    }


def sweep(
    cases: list[Case], cands: list[Candidate], deadline: float, save: Callable[[], None]
) -> Iterator[dict[str, Any]]:
    """Every candidate over every case (checked, then timed), until ``deadline``
    (``time.monotonic()``): the ones left are rows with ``skipped``."""
    for cand in cands:
        for case in cases:
            row: dict[str, Any] = {"case": case.name, "tile": cand.label}
            if time.monotonic() > deadline:
                row["skipped"] = "budget"
            else:
                try:
                    got = forward(case.x, case.sets[0][1], case.sets[0][2], case.weights, cand)
                    row["rel_error"] = rel_error(got, case.ref)
                    row["kernels_us"] = kernels_us(case, cand)
                except Exception as exc:  # a tile that does not compile or launch here
                    row["skipped"] = repr(exc)[:300]
                torch.cuda.empty_cache()
            yield row
        save()


#: Width of a tile's label in the printed tables (the longest, ``m128n128k64w8s3/swap/sr``,
#: and two spaces).
TILE = 25


def correct(row: dict[str, Any]) -> bool:
    return "kernels_us" in row and row["rel_error"] <= TOLERANCE


def sweep_line(row: dict[str, Any]) -> str:
    if "skipped" in row:
        return f"sweep {row['case']:<22}{row['tile']:<{TILE}} skipped: {row['skipped']}"
    flag = "" if correct(row) else "  WRONG"
    return (
        f"sweep {row['case']:<22}{row['tile']:<{TILE}}{row['kernels_us']:>9.1f} us  "
        f"rel {row['rel_error']:.1e}{flag}"
    )


def matrix(cases: list[Case], rows: list[dict[str, Any]]) -> str:
    """Kernels' microseconds by tile (rows) and case (columns); ``x``: wrong, ``-``: not run."""
    names = [c.name for c in cases]
    at = {(r["case"], r["tile"]): r for r in rows}
    tiles = list(dict.fromkeys(r["tile"] for r in rows))
    lines = [f"{'kernels us':<{TILE}}" + "".join(f"{n:>24}" for n in names)]
    for tile in tiles:
        cells = []
        for name in names:
            r = at.get((name, tile), {})
            mark = "" if correct(r) else " x"
            cells.append(f"{r['kernels_us']:.1f}{mark}" if "kernels_us" in r else "-")
        lines.append(f"{tile:<{TILE}}" + "".join(f"{c:>24}" for c in cells))
    return "\n".join(lines)


STAGES = ("route", "gate_up", "silu", "down", "cast", "sum", "step", "down_pairs", "topk_sum")
STAGE_HEADER = f"{'case':<22}{'tile':<{TILE}}" + "".join(f"{s:>11}" for s in STAGES)


def stage_line(row: dict[str, Any]) -> str:
    cells = "".join(f"{row[s]:>11.1f}" if s in row else f"{'-':>11}" for s in STAGES)
    return f"{row['case']:<22}{row['tile']:<{TILE}}{cells}"


HEADER = (
    f"{'case':<22}{'table tile':>{TILE}}{'us':>8}{'best tile':>{TILE}}{'us':>8}{'TFLOP/s':>8}"
    f"{'xcube':>7}{'bmm us':>8}{'TFLOP/s':>8}{'xcube':>7}{'pad TF':>8}{'mm TF':>8}"
    f"{'xbmm':>6}{'0.5x us':>8}"
)


def line(r: dict[str, Any]) -> str:
    """One case: the table's tile, the sweep's best, the dense references; rates over the
    routed FLOPs (``pad TF``: bmm over its padded FLOPs), ``xcube`` over cuBLAS's 8192-cube
    rate, ``xbmm`` bmm's time over the best tile's, ``0.5x us`` the time issue 35 asks for."""
    flops, cube = r["flops"], r["cube_flops"]

    def tf(t_us: float, f: float = flops) -> float:
        return f / (t_us * 1e-6) / 1e12

    return (
        f"{r['case']:<22}{r['table_tile']:>{TILE}}{r['table_us']:>8.1f}{r['best_tile']:>{TILE}}"
        f"{r['best_us']:>8.1f}{tf(r['best_us']):>8.1f}{tf(r['best_us']) * 1e12 / cube:>7.2f}"
        f"{r['bmm_us']:>8.1f}{tf(r['bmm_us']):>8.1f}{tf(r['bmm_us']) * 1e12 / cube:>7.2f}"
        f"{tf(r['bmm_us'], r['bmm_flops']):>8.1f}{tf(r['mm_us']):>8.1f}"
        f"{r['bmm_us'] / r['best_us']:>6.2f}{flops / (0.5 * cube) * 1e6:>8.1f}"
    )


def summary(
    case: Case, rows: list[dict[str, Any]], dense: dict[str, Any], cube: float
) -> dict[str, Any]:
    """The case's line: its table tile's and best correct tile's times (NaN where none ran)
    beside the dense references."""
    mine = {r["tile"]: r["kernels_us"] for r in rows if r["case"] == case.name and correct(r)}
    best = min(mine, key=mine.__getitem__, default="-")
    w = case.weights
    return {
        "case": case.name, "flops": case.flops, "cube_flops": cube,
        "table_tile": case.table.label, "table_us": mine.get(case.table.label, math.nan),
        "best_tile": best, "best_us": mine.get(best, math.nan),
        "bmm_us": dense["bmm"], "mm_us": dense["mm"],
        "bmm_flops": 2.0 * dense["bmm_rows"] * 3 * w.hidden * w.inter,
    }  # fmt: skip


def build_cases(
    ms: list[int],
) -> tuple[list[Case], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Every model's cases, each with the table tile's error in ``info`` beside how its pairs
    fill blocks of 16-128 rows, and every model's dense stacks (:func:`dense_stacks`)."""
    cases, stacks = [], {}
    for model, (experts, top_k, hidden, inter) in MODELS.items():
        weights = stack(experts, hidden, inter, True)
        stacks[model] = dense_stacks(weights)
        for m in ms:
            case = make_case(model, m, weights, top_k, stacks[model])
            got = forward(case.x, *case.sets[0][1:], weights, case.table)
            counts = torch.bincount(case.sets[0][2].reshape(-1).long(), minlength=experts)
            case.info = {
                "table_rel_error": rel_error(got, case.ref),
                "max_rows": int(counts.max()),
                "row_use": {bm: row_use(counts.tolist(), bm) for bm in (16, 32, 64, 128)},
            }
            cases.append(case)
    return cases, stacks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ms", type=int, nargs="*", default=list(MS))
    parser.add_argument(
        "--budget-s", type=float, default=180.0, help="start no sweep tile after this many s"
    )
    parser.add_argument(
        "--jobs", type=int, default=8, help="processes compiling the tiles first (0: none)"
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    copy_bw = start(args.out)
    if copy_bw is None:
        return 2
    capability = torch.cuda.get_device_capability()
    cube = matmul_flops()
    cands = candidates(capability)
    record: dict[str, Any] = {
        **versions(), "copy_bandwidth_gbps": copy_bw / 1e9, "fp16_matmul_tflops": cube / 1e12,
        "candidates": [{"label": c.label, **asdict(c)} for c in cands],
    }  # fmt: skip
    path = args.out / "ct_wna16_moe_prefill_bench.json"

    def save() -> None:
        path.write_text(json.dumps(record, indent=1))

    # Compiling the tiles (about a second each) in other processes while this one sets up.
    pool = multiprocessing.get_context("spawn").Pool(args.jobs) if args.jobs else None
    compiling = pool.map_async(precompile, cands) if pool else None
    cases, stacks = build_cases(args.ms)
    if pool is not None and compiling is not None:
        try:
            errors = compiling.get(timeout=max(1.0, began + args.budget_s - time.monotonic()))
            record["precompile"] = {c.label: e for c, e in zip(cands, errors, strict=True) if e}
        except Exception as exc:  # the sweep compiles what is missing itself
            record["precompile"] = repr(exc)[:300]
        pool.terminate()
        print(f"precompiled at {time.monotonic() - began:.0f} s: {record['precompile']}")
    # Timed once no other process launches kernels on the device.
    dense = {case.name: {**case.info, **dense_us(case, *stacks[case.model])} for case in cases}
    for name, info in dense.items():
        print(f"{name}: {info}", flush=True)
    del stacks
    torch.cuda.empty_cache()
    record["dense"] = dense
    save()
    rows: list[dict[str, Any]] = []
    record["sweep"] = rows
    for row in sweep(cases, cands, began + args.budget_s, save):
        rows.append(row)
        print(sweep_line(row), flush=True)
    splits: list[dict[str, Any]] = []
    record["stages"] = splits
    summaries = []
    for case in cases:
        summaries.append(summary(case, rows, dense[case.name], cube))
        best = [c for c in cands if c.label == summaries[-1]["best_tile"]]
        for cand in dict.fromkeys((case.table, *best)):
            splits.append({"case": case.name, "tile": cand.label, **stages_us(case, cand)})
            print(stage_line(splits[-1]), flush=True)
    record["summary"] = summaries
    save()
    print(f"{record['device']}, torch {torch.__version__}, triton {record['versions']['triton']}")
    print(f"copy {copy_bw / 1e9:.0f} GB/s, fp16 cuBLAS 8192^3 {cube / 1e12:.0f} TFLOP/s")
    print(matrix(cases, rows))
    print(STAGE_HEADER)
    print("\n".join(stage_line(r) for r in splits))
    print(HEADER)
    print("\n".join(line(r) for r in summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
