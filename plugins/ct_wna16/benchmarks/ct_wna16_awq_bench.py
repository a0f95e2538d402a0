"""AWQ and GPTQ checkpoints through ct_wna16 against vLLM's own Triton AWQ kernels, side by side:
``python plugins/ct_wna16/benchmarks/ct_wna16_awq_bench.py --out DIR --peer AWQ_TRITON_PY``.

``AWQ_TRITON_PY`` is ``vllm/model_executor/layers/quantization/awq_triton.py`` from a vLLM
wheel (it imports only ``vllm.triton_utils``, which is stood in by Triton itself here, so no
vLLM install is needed on the GPU machine). For each shape (N, K), int4 group 128, fresh random
checkpoint tensors are made (``copies`` of each, rotated so that together they exceed the L2),
and seven variants are run on them:

* ``awq``: AWQ tensors (``qweight`` ``[K, N / 8]`` in AutoAWQ's interleaved order, packed
  ``qzeros``, fp16 scales) repacked by :func:`volta_ct_wna16.repack.awq_weights`;
* ``ct``: the same weights (the AWQ tensors' values, zero points and scales) written as a
  compressed-tensors ``pack-quantized`` checkpoint and loaded by
  :func:`volta_ct_wna16.layout.prepare`, the plugin's compressed-tensors path (the same
  kernels after the load: ``awq`` against ``ct`` is the issue's "same speed");
* ``gptq_sym``, ``gptq_asym``: GPTQ tensors (``qweight`` ``[K / 8, N]``, ``qzeros`` holding
  each zero point minus one, the midpoint for symmetric) repacked by
  :func:`volta_ct_wna16.repack.gptq_weights`;
* ``gptq_act``: symmetric GPTQ with act-order (``desc_act``: ``g_idx`` spreads each group over
  the input in a random order), whose rows the repack sorts by group, so each call gathers its
  input by that permutation first;
* ``vllm_awq``: vLLM's AWQ path as its ``AWQLinearMethod`` runs it with Triton on the AWQ
  tensors (``awq_gemm_triton``, split-K 8, below 256 tokens; ``awq_dequantize_triton`` then
  ``torch.matmul`` from 256 on, vLLM's heuristic);
* ``fp16``: fp16 cuBLAS (``torch.matmul``) on the AWQ weights dequantized by vLLM's
  ``awq_dequantize_triton``.

The plugin's variants are timed as their layers' ``apply`` runs them
(:func:`volta_ct_wna16.linear.apply_packed`: the act-order gather, then the plugin's operator),
mirrored by :func:`layer_apply` so that vLLM need not be installed.

For each shape, correctness first, at every token count and for every variant, before any
timing: the output (poisoned first where the call takes an output buffer; the plugin's kernels
also write a poisoned buffer through :func:`volta_ct_wna16.ops.wna16_linear`) against ``x @ W``
in float64, ``W`` the checkpoint's weights dequantized by a reference independent of the
plugin's repack (vLLM's ``awq_dequantize_triton`` for AWQ, :func:`gptq_dense` for GPTQ).

Then the times, in ``--rounds`` rounds per token count: each round times every variant once,
in an order rotated by one each round (:func:`rotated`), each time the median of replays of
one captured CUDA graph cycling the weight copies (``volta_devkit.bench.time_cuda_graph``). The
SM clock, temperature and power draw are read before and after each round (:func:`clock_reader`:
NVML through torch, else ``nvidia-smi``). Reported per variant: the median over rounds and the
spread (min-max); each ratio is the median over rounds of the ratio of the two variants' times
in the same round (:func:`round_ratio`), so a clock that drifts between rounds moves both.

Writes ``DIR/ct_wna16_awq_bench.json``; prints a line per round as it goes, the tables last.
Default shapes on an H200: about 3 minutes (most of it the 840 timings of 0.05-0.25 s each).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from volta_ct_wna16 import __version__
from volta_ct_wna16.layout import PackedWeights, pack_int32, prepare
from volta_ct_wna16.ops import linear_op, warm_up, wna16_linear
from volta_ct_wna16.repack import Repacked, awq_weights, gptq_weights, unpack_awq
from volta_ct_wna16.weight_scheme import Packing, WeightScheme
from volta_devkit.bench import measure_copy_bandwidth, time_cuda_graph
from volta_devkit.testing import poison_

SHAPES = ((5120, 5120), (27648, 5120), (5120, 27648), (7168, 5120))
MS = (1, 4, 16, 64, 256, 2048)
GROUP = 128
#: The plugin's variants and the scheme each checkpoint is read with.
SCHEMES = {
    "awq": WeightScheme(4, False, GROUP, Packing.AWQ),
    "ct": WeightScheme(4, False, GROUP),
    "gptq_sym": WeightScheme(4, True, GROUP, Packing.GPTQ),
    "gptq_asym": WeightScheme(4, False, GROUP, Packing.GPTQ),
    "gptq_act": WeightScheme(4, True, GROUP, Packing.GPTQ, act_order=True),
}
PLUGIN = tuple(SCHEMES)
#: The baselines, both on the AWQ weights.
BASELINES = ("vllm_awq", "fp16")
VARIANTS = (*PLUGIN, *BASELINES)
LABELS = {
    "awq": "AWQ",
    "ct": "CT",
    "gptq_sym": "GPTQ sym",
    "gptq_asym": "GPTQ asym",
    "gptq_act": "GPTQ act",
    "vllm_awq": "vLLM AWQ",
    "fp16": "fp16",
}
#: The checkpoint each variant runs (and is checked against): the AWQ tensors' weights or a
#: GPTQ checkpoint of its own.
SOURCE = {"ct": "awq", "vllm_awq": "awq", "fp16": "awq"}
ROTATE_BYTES = 256 << 20
MAX_COPIES = 8
REPLAYS = 7
ROUNDS = 5
#: vLLM's AWQ method dequantizes and calls cuBLAS from this many tokens on (``awq.py``).
PEER_DEQUANT_FROM = 256
#: fp16 outputs of fp32-accumulated sums against the float64 product (the plugin's variants
#: must meet it; the baselines' errors are reported).
TOLERANCE = 2e-3
CLOCK_KEYS = ("sm_mhz", "temp_c", "power_w")


def source(variant: str) -> str:
    """The checkpoint ``variant`` runs: ``awq`` or its own GPTQ one."""
    return SOURCE.get(variant, variant)


def load_peer(path: Path) -> Any:
    """vLLM's ``awq_triton`` module, its one vLLM import (``vllm.triton_utils``) stood in by
    Triton while it loads (and put back after: a process with vLLM keeps its own)."""
    import triton
    import triton.language as tl

    utils = types.ModuleType("vllm.triton_utils")
    utils.triton, utils.tl = triton, tl  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("vllm", "vllm.triton_utils")}
    sys.modules["vllm"] = saved["vllm"] or types.ModuleType("vllm")
    sys.modules["vllm.triton_utils"] = utils
    try:
        spec = importlib.util.spec_from_file_location("peer_awq_triton", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, value in saved.items():
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value
    return module


def _words(gen: torch.Generator, rows: int, cols: int, device: str) -> torch.Tensor:
    """Random int32 words (any are valid packed nibbles)."""
    return torch.randint(
        -(2**31), 2**31 - 1, (rows, cols), generator=gen, device=device, dtype=torch.int32
    )


def _scales(gen: torch.Generator, groups: int, n: int, device: str) -> torch.Tensor:
    return (torch.rand(groups, n, generator=gen, device=device) * 2e-3 + 1e-3).half()


def awq_tensors(n: int, k: int, seed: int, device: str = "cuda") -> dict[str, torch.Tensor]:
    """Fresh random AWQ tensors of one layer."""
    gen = torch.Generator(device=device).manual_seed(seed)
    groups = k // GROUP
    return {
        "qweight": _words(gen, k, n // 8, device),
        "qzeros": _words(gen, groups, n // 8, device),
        "scales": _scales(gen, groups, n, device),
    }


def gptq_tensors(
    n: int, k: int, scheme: WeightScheme, seed: int, device: str = "cuda"
) -> dict[str, torch.Tensor]:
    """Fresh random GPTQ tensors of one layer: random words; a symmetric layer's ``qzeros``
    hold the midpoint minus one (7) as GPTQ writes them; ``g_idx`` is ``k // group``, or with
    act-order each group's rows at random places (``g_idx[order[i]] = i // group``, as GPTQ
    assigns groups in its quantization order)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    groups = k // GROUP
    qweight = _words(gen, k // 8, n, device)
    if scheme.symmetric:
        qzeros = torch.full((groups, n // 8), 0x77777777, dtype=torch.int32, device=device)
    else:
        qzeros = _words(gen, groups, n // 8, device)
    groups_in_order = torch.arange(k, dtype=torch.int32) // GROUP
    g_idx = groups_in_order
    if scheme.act_order:
        order = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
        g_idx = torch.empty_like(groups_in_order)
        g_idx[order] = groups_in_order
    return {
        "qweight": qweight,
        "qzeros": qzeros,
        "scales": _scales(gen, groups, n, device),
        "g_idx": g_idx.to(device),
    }


def _nibbles(words: torch.Tensor, dim: int) -> torch.Tensor:
    """Eight 4-bit values per int32 word, the value at bits ``4 * i`` the ``i``-th along
    ``dim`` (GPTQ's packing of ``qweight`` along K and of ``qzeros`` along N)."""
    shifts = torch.arange(0, 32, 4, device=words.device, dtype=torch.int64)
    values = (words.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF
    if dim == 1:
        return values.reshape(words.shape[0], -1)
    return values.permute(0, 2, 1).reshape(-1, words.shape[1])


def gptq_dense(t: Mapping[str, torch.Tensor], symmetric: bool) -> torch.Tensor:
    """The float64 ``[K, N]`` weights of 4-bit GPTQ tensors, from their definition (written here,
    not the plugin's repack): ``W[k, n] = (q[k, n] - z[g, n]) * s[g, n]`` with ``g = g_idx[k]``,
    ``z`` the stored zero point plus one (the original GPTQ format), or 8 when symmetric."""
    q = _nibbles(t["qweight"], dim=0).double()
    g = t["g_idx"].long()
    scales = t["scales"].double()[g]
    zeros = 8.0 if symmetric else (_nibbles(t["qzeros"], dim=1).double() + 1)[g]
    return (q - zeros) * scales


def ct_weights(t: Mapping[str, torch.Tensor], n: int, k: int) -> PackedWeights:
    """The AWQ tensors' weights as a compressed-tensors checkpoint (``weight_packed``
    ``[N, K / 8]`` and ``weight_zero_point`` ``[N / 8, groups]`` offset-binary, ``weight_scale``
    ``[N, groups]``), loaded by the plugin's compressed-tensors path."""
    values = unpack_awq(t["qweight"], 4, n).to(torch.int64) - 8
    zeros = unpack_awq(t["qzeros"], 4, n).to(torch.int64) - 8
    return prepare(
        "bench",
        SCHEMES["ct"],
        n=n,
        k=k,
        weight_packed=pack_int32(values.t(), 4, dim=1),
        weight_scale=t["scales"].t(),
        weight_zero_point=pack_int32(zeros.t(), 4, dim=0),
        act_dtype=torch.float16,
    )


def layer_apply(x: torch.Tensor, repacked: Repacked) -> torch.Tensor:
    """What a claimed layer's ``apply`` runs (:func:`volta_ct_wna16.linear.apply_packed`,
    which imports vLLM): the act-order input gather, then the plugin's operator."""
    pw, perm = repacked.weights, repacked.perm
    if perm is not None:
        x = x.index_select(-1, perm)
    return linear_op(x, pw.qweight, pw.scales, pw.zeros, pw.zeros8, None, pw.k, pw.bits, pw.group)


@dataclass
class Layer:
    """One shape's weights: ``copies`` rotating copies of every variant's, and the first copy
    of each checkpoint (what the float64 references are made from)."""

    n: int
    k: int
    awq: list[dict[str, torch.Tensor]]
    packed: dict[str, list[Repacked]]
    dense: list[torch.Tensor]
    checkpoints: dict[str, Mapping[str, torch.Tensor]] = field(default_factory=dict)

    @property
    def copies(self) -> int:
        return len(self.awq)


def copies_for(n: int, k: int) -> int:
    """Weight copies rotated per timing: int4 copies past ``ROTATE_BYTES`` (every variant,
    fp16 included, cycles as many)."""
    return max(2, min(MAX_COPIES, -(-ROTATE_BYTES // (n * k // 2))))


def build_layer(n: int, k: int, copies: int, peer: Any, device: str = "cuda") -> Layer:
    """Every variant's weights for one shape (the GPTQ checkpoints' own tensors are released
    after the repack, but for the first copy's)."""
    awq = [awq_tensors(n, k, seed, device) for seed in range(copies)]
    packed = {
        "awq": [
            awq_weights("bench", SCHEMES["awq"], n=n, k=k, act_dtype=torch.float16, **t)
            for t in awq
        ],
        "ct": [Repacked(ct_weights(t, n, k)) for t in awq],
    }
    checkpoints: dict[str, Mapping[str, torch.Tensor]] = {"awq": awq[0]}
    for offset, name in enumerate(("gptq_sym", "gptq_asym", "gptq_act"), start=1):
        scheme, repacked = SCHEMES[name], []
        for copy in range(copies):
            t = gptq_tensors(n, k, scheme, seed=1000 * offset + copy, device=device)
            repacked.append(gptq_weights("bench", scheme, n=n, k=k, act_dtype=torch.float16, **t))
            if copy == 0:
                checkpoints[name] = t
        packed[name] = repacked
    for repacked in packed.values():
        for r in repacked:
            warm_up(r.weights)  # as install_packed does: a V100's tensor-core builds, now
    dense = [peer.awq_dequantize_triton(t["qweight"], t["scales"], t["qzeros"]) for t in awq]
    return Layer(n, k, awq, packed, dense, checkpoints)


def reference_weight(layer: Layer, name: str, peer: Any) -> torch.Tensor:
    """The float64 ``[K, N]`` weights of checkpoint ``name``'s first copy."""
    t = layer.checkpoints[name]
    if name == "awq":
        return peer.awq_dequantize_triton(t["qweight"], t["scales"], t["qzeros"]).double()
    return gptq_dense(t, SCHEMES[name].symmetric)


def calls(
    layer: Layer, x: torch.Tensor, peer: Any, outs: Sequence[torch.Tensor]
) -> dict[str, Callable[[int], torch.Tensor]]:
    """Each variant's call on weight copy ``i`` (``outs``: two ``[M, N]`` fp16 buffers the
    baselines alternate, as consecutive layers would)."""
    m = x.shape[0]

    def plugin(name: str) -> Callable[[int], torch.Tensor]:
        repacked = layer.packed[name]
        return lambda i: layer_apply(x, repacked[i])

    def vllm(i: int) -> torch.Tensor:
        t = layer.awq[i]
        if m < PEER_DEQUANT_FROM:
            return peer.awq_gemm_triton(x, t["qweight"], t["scales"], t["qzeros"], 8)
        w = peer.awq_dequantize_triton(t["qweight"], t["scales"], t["qzeros"])
        return torch.matmul(x, w, out=outs[i % 2])

    def fp16(i: int) -> torch.Tensor:
        return torch.matmul(x, layer.dense[i], out=outs[i % 2])

    return {**{name: plugin(name) for name in PLUGIN}, "vllm_awq": vllm, "fp16": fp16}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).abs().max() / ref.abs().max())


def check(layer: Layer, xs: Mapping[int, torch.Tensor], peer: Any) -> dict[int, dict[str, float]]:
    """Each variant's relative error at each token count against ``x @ W`` in float64: the
    plugin's variants both as timed and through a poisoned ``out``, the worse of the two."""
    errors: dict[int, dict[str, float]] = {m: {} for m in xs}
    for name in dict.fromkeys(source(v) for v in VARIANTS):
        w64 = reference_weight(layer, name, peer)
        for m, x in xs.items():
            ref = x.double() @ w64
            outs = [torch.empty(m, layer.n, device=x.device, dtype=torch.float16) for _ in range(2)]
            run = calls(layer, x, peer, outs)
            for variant in (v for v in VARIANTS if source(v) == name):
                for out in outs:
                    poison_(out)
                error = rel_error(run[variant](0), ref)
                if variant in SCHEMES:
                    repacked = layer.packed[variant][0]
                    xp = x if repacked.perm is None else x.index_select(-1, repacked.perm)
                    wna16_linear(xp, repacked.weights, out=poison_(outs[0]))
                    error = max(error, rel_error(outs[0], ref))
                errors[m][variant] = error
            del ref
        del w64
    return errors


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """``names`` rotated left by ``round_index``: over ``len(names)`` rounds each variant runs
    once in each place, so none is always first (after the checks) or last."""
    s = round_index % len(names)
    return [*names[s:], *names[:s]]


def spread(values: Sequence[float]) -> dict[str, Any]:
    """A variant's times over the rounds: their median, minimum and maximum, and all of them."""
    return {
        "us": statistics.median(values),
        "min_us": min(values),
        "max_us": max(values),
        "rounds_us": list(values),
    }


def round_ratio(times: Mapping[str, Sequence[float]], baseline: str, subject: str) -> float:
    """How many times faster ``subject`` is than ``baseline``: the median over rounds of the two
    times' ratio in the same round (``baseline / subject``)."""
    pairs = zip(times[baseline], times[subject], strict=True)
    return statistics.median(b / s for b, s in pairs)


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def clock_reader() -> tuple[str, Callable[[], dict[str, float | None]]]:
    """The first way of reading the current GPU's SM clock (MHz), temperature (C) and power
    draw (W) that works here, and its name: NVML through torch (``torch.cuda.clock_rate``,
    needs ``pynvml``), else ``nvidia-smi``, else none (every value None)."""
    index = torch.cuda.current_device()

    def nvml() -> dict[str, float | None]:
        return {
            "sm_mhz": float(torch.cuda.clock_rate(index)),
            "temp_c": float(torch.cuda.temperature(index)),
            "power_w": torch.cuda.power_draw(index) / 1e3,
        }

    def smi() -> dict[str, float | None]:
        query = ["nvidia-smi", f"--id={index}", "--format=csv,noheader,nounits"]
        query.append("--query-gpu=clocks.sm,temperature.gpu,power.draw")
        text = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True)
        values = [_number(v) for v in text.stdout.strip().split(",")]
        if len(values) != len(CLOCK_KEYS) or values[0] is None:
            raise ValueError(f"nvidia-smi answered {text.stdout!r}")
        return dict(zip(CLOCK_KEYS, values, strict=True))

    for name, reader in (("nvml", nvml), ("nvidia-smi", smi)):
        try:
            reader()
        except Exception:  # any failure: try the next way
            continue
        return name, reader
    return "none", lambda: dict.fromkeys(CLOCK_KEYS)


def _timed(fn: Callable[[int], Any], count: int) -> float:
    """Microseconds per call inside one captured CUDA graph, cycling ``count`` weight copies."""
    return time_cuda_graph(fn, [(i,) for i in range(count)], replays=REPLAYS).median_ms * 1e3


def clock_text(state: Mapping[str, float | None]) -> str:
    def fmt(key: str, unit: str, spec: str = ".0f") -> str:
        value = state.get(key)
        return "?" if value is None else f"{value:{spec}}{unit}"

    return f"{fmt('sm_mhz', ' MHz')} {fmt('temp_c', 'C')} {fmt('power_w', 'W')}"


def time_rounds(
    label: str,
    run: Mapping[str, Callable[[int], Any]],
    copies: int,
    rounds: int,
    clock: Callable[[], dict[str, float | None]],
    timer: Callable[[Callable[[int], Any], int], float] = _timed,
) -> tuple[dict[str, list[float]], list[dict[str, Any]]]:
    """Every variant's time in each of ``rounds`` rounds, the order rotated each round, and
    each round's order and clock readings before and after it (printed as it goes)."""
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    log: list[dict[str, Any]] = []
    for r in range(rounds):
        order = rotated(VARIANTS, r)
        before = clock()
        for variant in order:
            times[variant].append(timer(run[variant], copies))
        after = clock()
        log.append({"order": order, "before": before, "after": after})
        done = " ".join(f"{LABELS[v]} {times[v][-1]:.1f}" for v in order)
        print(
            f"{label} round {r + 1}/{rounds} [{clock_text(before)} -> {clock_text(after)}] {done}",
            flush=True,
        )
    return times, log


def summarize(
    n: int,
    k: int,
    m: int,
    times: Mapping[str, Sequence[float]],
    errors: Mapping[str, float],
    rounds: list[dict[str, Any]],
) -> dict[str, Any]:
    """One token count's row: the earlier keys (``ours_*`` are the AWQ variant's; times the
    medians over rounds, ratios the medians of per-round ratios) and each variant's spread,
    speed-ups, error and the rounds' clocks."""
    speedups = {v: {b: round_ratio(times, b, v) for b in BASELINES} for v in PLUGIN}
    return {
        "n": n,
        "k": k,
        "m": m,
        "ours_us": statistics.median(times["awq"]),
        "vllm_awq_us": statistics.median(times["vllm_awq"]),
        "fp16_us": statistics.median(times["fp16"]),
        "vs_vllm": speedups["awq"]["vllm_awq"],
        "vs_fp16": speedups["awq"]["fp16"],
        "ours_rel_error": errors["awq"],
        "vllm_rel_error": errors["vllm_awq"],
        "correct": all(errors[v] < TOLERANCE for v in PLUGIN),
        "times": {v: spread(times[v]) for v in VARIANTS},
        "speedups": speedups,
        "awq_vs_ct": round_ratio(times, "ct", "awq"),
        "act_order_vs_sym": round_ratio(times, "gptq_sym", "gptq_act"),
        "rel_errors": {v: errors[v] for v in VARIANTS},
        "rounds": rounds,
    }


def measure(
    n: int,
    k: int,
    peer: Any,
    rounds: int,
    clock: Callable[[], dict[str, float | None]],
    ms: Sequence[int] = MS,
    device: str = "cuda",
    timer: Callable[[Callable[[int], Any], int], float] = _timed,
) -> list[dict[str, Any]]:
    """One shape: every check at every token count first, then the timed rounds (``device``
    and ``timer``: the CPU test's interpreter and stand-in timer)."""
    layer = build_layer(n, k, copies_for(n, k), peer, device)
    gen = torch.Generator(device=device).manual_seed(n + k)
    xs = {m: torch.randn(m, k, generator=gen, device=device, dtype=torch.float16) for m in ms}
    errors = check(layer, xs, peer)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    rows = []
    for m, x in xs.items():
        outs = [torch.empty(m, n, device=device, dtype=torch.float16) for _ in range(2)]
        run = calls(layer, x, peer, outs)
        times, log = time_rounds(f"{n}x{k} M={m}", run, layer.copies, rounds, clock, timer)
        rows.append(summarize(n, k, m, times, errors[m], log))
    del layer
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def _spread_pct(t: Mapping[str, float]) -> float:
    return 100 * (t["max_us"] - t["min_us"]) / t["us"]


def _clock_range(row: Mapping[str, Any], key: str) -> str:
    values = [
        s[key] for r in row["rounds"] for s in (r["before"], r["after"]) if s.get(key) is not None
    ]
    return f"{min(values):.0f}-{max(values):.0f}" if values else "?"


def table(rows: list[dict[str, Any]]) -> str:
    """Two tables: each variant's median time over the rounds with its spread ((max - min) /
    median) and the SM clock and temperature ranges read; then the speed-ups (medians of
    per-round ratios) and the worst error of the plugin's variants."""
    head = f"{'N x K':>13} {'M':>5}"
    lines = [
        "times: median over rounds, us / spread (max-min)/median",
        head + "".join(f" {LABELS[v]:>13}" for v in VARIANTS) + f" {'SM MHz':>10} {'temp C':>7}",
    ]
    for r in rows:
        cells = "".join(
            f" {t['us']:>8.1f}/{_spread_pct(t):>3.0f}%" for t in (r["times"][v] for v in VARIANTS)
        )
        lines.append(
            f"{r['n']:>6}x{r['k']:<6} {r['m']:>5}{cells} {_clock_range(r, 'sm_mhz'):>10} "
            f"{_clock_range(r, 'temp_c'):>7}"
        )
    short = {"awq": "AWQ", "ct": "CT", "gptq_sym": "Gsym", "gptq_asym": "Gasym", "gptq_act": "Gact"}
    lines += [
        "",
        "x faster (median of per-round ratios): than vLLM's AWQ Triton | than fp16 cuBLAS | "
        "AWQ than CT, GPTQ act-order than sym",
        head
        + "".join(f" {short[v]:>6}" for v in PLUGIN)
        + " |"
        + "".join(f" {short[v]:>6}" for v in PLUGIN)
        + f" | {'AWQ/CT':>6} {'act/sym':>7} {'err':>8} ok",
    ]
    for r in rows:
        s = r["speedups"]
        worst = max(r["rel_errors"][v] for v in PLUGIN)
        lines.append(
            f"{r['n']:>6}x{r['k']:<6} {r['m']:>5}"
            + "".join(f" {s[v]['vllm_awq']:>6.2f}" for v in PLUGIN)
            + " |"
            + "".join(f" {s[v]['fp16']:>6.2f}" for v in PLUGIN)
            + f" | {r['awq_vs_ct']:>6.2f} {r['act_order_vs_sym']:>7.2f} {worst:>8.1e} "
            + ("yes" if r["correct"] else "NO")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--peer", type=Path, required=True, help="vLLM's awq_triton.py")
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"timed rounds per token count ({ROUNDS})"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not torch.cuda.is_available():
        print("the benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    begin = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    peer = load_peer(args.peer)
    import triton

    clock_source, clock = clock_reader()
    print(f"clock readings: {clock_source}; now {clock_text(clock())}", flush=True)
    rows: list[dict[str, Any]] = []
    for n, k in SHAPES:
        rows += measure(n, k, peer, args.rounds, clock)
    result = {
        "device": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "versions": {
            "volta_ct_wna16": __version__,
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "peer": str(args.peer),
            "peer_sha256": hashlib.sha256(args.peer.read_bytes()).hexdigest(),
        },
        "copy_bandwidth_gbps": measure_copy_bandwidth()[0],
        "rounds": args.rounds,
        "replays": REPLAYS,
        "variants": LABELS,
        "clock_source": clock_source,
        "elapsed_s": time.perf_counter() - begin,
        "rows": rows,
    }
    (args.out / "ct_wna16_awq_bench.json").write_text(json.dumps(result, indent=1))
    print(
        f"{result['device']}, torch {torch.__version__}, Triton {triton.__version__}, "
        f"{args.rounds} rounds, {result['elapsed_s']:.0f} s"
    )
    print(table(rows))
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
