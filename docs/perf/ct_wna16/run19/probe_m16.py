"""Probe (H100): where does the time of the 16-token split-K launch go on the small layers?

For the M=16 layers 5120x5120 and 7168x5120 (int4, group 128, symmetric and asymmetric) this
times, in one CUDA graph each as the benchmark does (rotating weight copies past L2), best of
two alternating runs, every variant on the shipped launch's grid (row blocks x output tiles x
splits), tile, warps and stages (``configs.choose`` and ``configs.split_count`` for the device):

* ``shipped``: ``wna16_linear`` as the benchmark launches it (the SLOT_DOTS tile of 16 rows,
  256 outputs and 128 inputs per step, splits summed atomically);
* ``read+tail``: :func:`skeleton_kernel` reading what the shipped tile reads in each input step
  (the packed words, the tile's row of scales and, asymmetric, of zero points, through the
  shipped ``_load_words``; the activations as the 32-bit pairs of ``_slot_pair_x``), doing no
  dequantization and no dot (words, scales, zero points and activations are xored into one
  int32 a column and one a row), then the shipped summing (``_accumulate_splits`` itself): fp32
  relaxed atomic adds into zeroed accumulators, barrier, one acq_rel GPU-scope arrival count a
  tile, the last arriver reading the sums by adding zero, zeroing them and storing fp16;
* ``read+dot+tail``: the same reads and tail with the shipped count and shapes of tensor-core
  dots (per step four word-slot pairs, each two ``[16, 16] x [16, 256]`` dots), fed by the
  words reinterpreted, not dequantized: pair ``p`` ANDs each word with ``0x000F000F << p``
  and takes its two 16-bit halves as fp16 subnormals (no shift, no exponent OR, no FMA), and
  the step's sum is scaled once by ``s * 2**24`` as the shipped group tile does (asymmetric:
  the zero points' row is added per step instead of being subtracted per weight);
* ``read+dot``: as ``read+dot+tail``, each program storing its partial to its own row;
* ``read only``: the reads of ``read+tail``, each program storing its partial to its own row
  (no atomics, no counter, no last arriver);
* the read floor of the packed words (``volta_core.kernels.read_floor``);
* the target: fp16 ``torch.matmul`` of x ``[16, K]`` by the dequantized weight (``[K, N]``,
  the transposed view of ``[N, K]`` as vLLM holds it, rotated copies), as ``bench.measure``
  times it, divided by 2.

Every variant is checked first (:func:`check`): the xor variants against torch's xor of the
same words exactly, the dot variants against a float64 torch sum of the same reinterpreted
products, and the shipped launch against ``x @ dequant(W).T``.

Run from the repository root (``<root>``)::

    PYTHONPATH=<root>/core/src:<root>/plugins/ct_wna16/src \
        python3 docs/perf/ct_wna16/run19/probe_m16.py

``--interpret-check``: only the checks, on small layers on CPU in the Triton interpreter (the
script re-runs itself with ``TRITON_INTERPRET=1``), with the SM90 launch (capability (9, 0),
132 SMs); prints OK. ``--sass``: compile the shipped kernel and the skeletons for sm_90 without
a GPU (the compile gate's ``compile_for``) and print registers, spills, shared memory and the
opcodes that tell them apart. ``--symmetric-only``: skip the asymmetric layers.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from volta_core.kernels.bench import time_cuda_graph
from volta_core.kernels.counters import arrival_counters, zeroed_accumulators
from volta_core.kernels.read_floor import read_floor
from volta_ct_wna16 import bench, configs, kernels
from volta_ct_wna16.layout import PackedWeights, dequantize
from volta_ct_wna16.ops import _pair_aligned, dequantize_dense, wna16_linear
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.testing import fresh_checkpoint

M = 16
LAYERS = ((5120, 5120), (7168, 5120))
#: The H100's figures, for the launch the CPU check and ``--sass`` reproduce.
SM90_CAPABILITY = (9, 0)
H100_SMS = 132
#: Small layers for ``--interpret-check``: (n, k, forced split count or None for the table's);
#: the last has a partial output tile, so it runs the masked build (``WHOLE`` off).
INTERPRET_LAYERS = ((512, 1024, None), (512, 1024, 2), (768, 640, 3), (600, 640, 2))
#: fp16 outputs of fp32 sums: the output's rounding (2**-11) with room to spare (as the tests).
FP16_TOLERANCE = 2e-3
#: fp32 partials stored unrounded: tensor-core fp32 accumulation only.
FP32_TOLERANCE = 1e-4


@triton.jit
def _pair_words(x_ptr, rm, m_ok, kk, k_end, stride_xm, WHOLE: tl.constexpr):
    """The 32-bit activation words ``kernels._slot_pair_x`` loads (the same pointers and
    masks), returned as words: the two fp16 halves are not taken apart."""
    x32 = x_ptr.to(tl.pointer_type(tl.uint32))
    ptrs = x32 + rm[:, None] * (stride_xm // 2) + kk[None, :] // 2
    if WHOLE:
        return tl.load(ptrs, mask=m_ok[:, None], other=0)
    return tl.load(ptrs, mask=m_ok[:, None] & (kk[None, :] < k_end), other=0)


@triton.jit
def skeleton_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    b_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    part_ptr,
    M,
    N,
    K,
    KW,
    GROUP,
    stride_xm,
    stride_om,
    K_PER_SPLIT,
    HAS_ZP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    WHOLE: tl.constexpr,
    DOT: tl.constexpr,
    TAIL: tl.constexpr,
):
    """The shipped 4-bit SLOT_DOTS + GROUP_TILE program without its dequantization.

    Same grid, program ids, input range and loop (``tl.range`` ``NUM_STAGES`` deep) as
    ``kernels.wna16_splitk_kernel``; each step loads the tile's words, scales (and zero points)
    with ``kernels._load_words`` and the activations of its four word-slot pairs. ``DOT``: the
    shipped eight dots a step on reinterpreted words, the step scaled by ``s * 2**24``; else
    the loads are xored together. ``TAIL``: the shipped atomic summing
    (``kernels._accumulate_splits``); else the partial tile goes to ``part_ptr[split]``.
    """
    BITS: tl.constexpr = 4
    PACK: tl.constexpr = 8
    BKP: tl.constexpr = BLOCK_K // PACK
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rkp = tl.arange(0, BKP)
    m_ok = rm < M
    n_ok = rn < N
    k_begin = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    zsum = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    wacc = tl.zeros([BKP, BLOCK_N], dtype=tl.uint32)
    sacc = tl.zeros([1, BLOCK_N], dtype=tl.uint32)
    xacc = tl.zeros([BLOCK_M, BKP], dtype=tl.uint32)
    for k0 in tl.range(k_begin, k_end, BLOCK_K, num_stages=NUM_STAGES):
        t, s, z = kernels._load_words(
            w_ptr, s_ptr, z_ptr, k0, rn, n_ok, N, KW, GROUP, BKP, PACK, HAS_ZP, BITS, True,
            WHOLE,
        )  # fmt: skip
        if DOT:
            part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for p in tl.static_range(PACK // 2):
                kk = k0 + rkp * PACK + 2 * p
                x_lo, x_hi = kernels._slot_pair_x(x_ptr, rm, m_ok, kk, k_end, stride_xm, WHOLE)
                f = t & (0x000F000F << p)
                w_lo = f.to(tl.uint16).to(tl.float16, bitcast=True)
                w_hi = (f >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
                part = tl.dot(x_hi, w_hi, tl.dot(x_lo, w_lo, part))
            acc += part * (s.to(tl.float32) * 16777216.0)
            if HAS_ZP:
                zsum += z
        else:
            for p in tl.static_range(PACK // 2):
                kk = k0 + rkp * PACK + 2 * p
                xacc ^= _pair_words(x_ptr, rm, m_ok, kk, k_end, stride_xm, WHOLE)
            wacc ^= t
            sacc ^= s.to(tl.uint16, bitcast=True).to(tl.uint32)
            if HAS_ZP:
                sacc ^= z.to(tl.uint32, bitcast=True)
    if DOT:
        res = acc
        if HAS_ZP:
            res = acc + zsum
    else:
        cols = tl.xor_sum(wacc, 0) ^ tl.xor_sum(sacc, 0)
        rows = tl.xor_sum(xacc, 1)
        res = ((rows[:, None] ^ cols[None, :]) & 0xF).to(tl.float32)
    tile_ok = m_ok[:, None] & n_ok[None, :]
    if TAIL:
        kernels._accumulate_splits(
            res, ws_ptr, cnt_ptr, b_ptr, out_ptr, rm, rn, n_ok, tile_ok, N, stride_om, HAS_BIAS
        )
    else:
        offs = pid_k * M * N + rm[:, None] * N + rn[None, :]
        tl.store(part_ptr + offs, res, mask=tile_ok)


@dataclass(frozen=True)
class Plan:
    """The shipped launch of one layer at ``m`` tokens: tile, split count and build flags."""

    n: int
    k: int
    m: int
    launch: configs.Launch
    splits: int
    per_split: int
    group: int

    @property
    def grid(self) -> tuple[int, int, int]:
        return (-(-self.m // self.launch.block_m), -(-self.n // self.launch.block_n), self.splits)

    @property
    def whole(self) -> bool:
        return configs.whole_tiles(self.n, self.k, self.launch, 4)

    def describe(self) -> str:
        ln = self.launch
        flags = configs.splitk_constexprs(
            ln, 4, False, False, self.splits > 1, configs.group_tile(ln, self.group), ln.atomic,
            self.whole,
        )  # fmt: skip
        on = [name for name in ("SLOT_DOTS", "GROUP_TILE", "ATOMIC", "WHOLE") if flags[name]]
        g = self.grid
        return (
            f"{self.n}x{self.k} M={self.m}: grid {g} = {g[0] * g[1]} tiles x {g[2]} splits "
            f"({g[0] * g[1] * g[2]} programs), BLOCK_M={ln.block_m} BLOCK_N={ln.block_n} "
            f"BLOCK_K={ln.block_k}, {ln.num_warps} warps, {ln.num_stages} stages, "
            f"{self.per_split} inputs ({self.per_split // ln.block_k} steps) a split, "
            f"{'atomic' if flags['ATOMIC'] else 'tree'} sum; on: {', '.join(on)}"
        )


def plan(
    n: int,
    k: int,
    capability: tuple[int, int],
    sms: int,
    group: int = bench.GROUP,
    splits: int | None = None,
) -> Plan:
    """The launch ``wna16_linear`` makes for ``M`` tokens (``splits``: force a split count,
    each split a whole number of input steps, as ``configs.split_count`` cuts them)."""
    launch = configs.choose(M, n, capability, 4, k=k)
    if not (
        launch.path == configs.SPLITK
        and configs.slot_dots(launch, 4)
        and launch.atomic
        and configs.group_tile(launch, group)
    ):
        raise RuntimeError(f"not the atomic SLOT_DOTS group tile this probe mimics: {launch}")
    if splits is None:
        count, per_split = configs.split_count(n, k, launch, sms, M)
    else:
        k_blocks = -(-k // launch.block_k)
        steps = -(-k_blocks // splits)
        per_split = steps * launch.block_k
        count = -(-k // per_split)
    if count < 2:
        raise RuntimeError(f"{n}x{k}: one split, so no summing to probe")
    return Plan(n, k, M, launch, count, per_split, group)


def skeleton(
    x: torch.Tensor,
    pw: PackedWeights,
    p: Plan,
    *,
    dot: bool,
    tail: bool,
    out: torch.Tensor,
    part: torch.Tensor,
) -> None:
    """One skeleton launch: ``out`` (fp16 ``[M, N]``) with ``tail``, else ``part`` (fp32
    ``[splits, M, N]``)."""
    ln = p.launch
    grid = p.grid
    ws = zeroed_accumulators(x.device, p.m * p.n)
    counters = arrival_counters(x.device, grid[0] * grid[1])
    zeros = pw.zeros if pw.zeros is not None else torch.empty(0, dtype=x.dtype, device=x.device)
    skeleton_kernel[grid](
        x, pw.qweight, pw.scales, zeros, out, out, ws, counters, part,
        p.m, p.n, p.k, pw.words_per_column, pw.group, x.stride(0), out.stride(0), p.per_split,
        HAS_ZP=pw.zeros is not None, HAS_BIAS=False, BLOCK_M=ln.block_m, BLOCK_N=ln.block_n,
        BLOCK_K=ln.block_k, NUM_STAGES=ln.num_stages, WHOLE=p.whole, DOT=dot, TAIL=tail,
        num_warps=ln.num_warps, num_stages=ln.num_stages,
    )  # fmt: skip


def xor_fold(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The xor of ``t`` (integers) along ``dim``, folded in halves (works on any device)."""
    t = t.movedim(dim, 0)
    while t.shape[0] > 1:
        if t.shape[0] % 2:
            t = torch.cat([t, torch.zeros_like(t[:1])])
        half = t.shape[0] // 2
        t = t[:half] ^ t[half:]
    return t[0]


def xor_partials(x: torch.Tensor, pw: PackedWeights, p: Plan) -> torch.Tensor:
    """``[splits, M, N]`` float32: what each program of the xor skeleton computes, in torch.

    Per split: the low 4 bits of (the xor of the row's activation words over the split's
    inputs) xor (the xor of the column's words, of its scale bits zero-extended and,
    asymmetric, of its fp32 zero points' bits, over the split's steps).
    """
    bk = p.launch.block_k
    words = pw.qweight.to(torch.int64) & 0xFFFFFFFF
    xw = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sbits = pw.scales.view(torch.int16).to(torch.int64) & 0xFFFF
    zbits = None
    if pw.zeros is not None:
        zbits = pw.zeros.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    parts = []
    for s in range(p.splits):
        k0, k1 = s * p.per_split, min((s + 1) * p.per_split, p.k)
        cols = xor_fold(words[k0 // 8 : -(-k1 // 8)], 0)
        for step in range(k0, k1, bk):
            cols = cols ^ sbits[step // pw.group]
            if zbits is not None:
                cols = cols ^ zbits[step // pw.group]
        rows = xor_fold(xw[:, k0 // 2 : k1 // 2], 1)
        parts.append(((rows[:, None] ^ cols[None, :]) & 0xF).to(torch.float32))
    return torch.stack(parts)


def dot_reference(x: torch.Tensor, pw: PackedWeights, p: Plan) -> torch.Tensor:
    """``[M, N]`` float64: what the dot skeleton's splits sum to.

    Slot pair ``q`` of word row ``r``: ``x[:, 8r + 2q]`` times the low half of
    ``word & (0x000F000F << q)`` read as fp16, ``x[:, 8r + 2q + 1]`` times the high half, each
    step's sum times its scale row and ``2**24``; asymmetric, plus the zero points' row of every
    step (summed over all steps of all splits).
    """
    words = pw.qweight.to(torch.int64)
    xd = x.double()
    rows = torch.arange(pw.words_per_column, device=x.device)
    scale = pw.scales.double()[(rows * 8) // pw.group] * float(1 << 24)
    want = torch.zeros(p.m, p.n, dtype=torch.float64, device=x.device)
    for q in range(4):
        f = words & (0x000F000F << q)
        lo = (f & 0xFFFF).to(torch.int16).view(torch.float16).double()
        hi = (f >> 16).to(torch.int16).view(torch.float16).double()
        want += xd[:, 2 * q :: 8] @ (lo * scale) + xd[:, 2 * q + 1 :: 8] @ (hi * scale)
    if pw.zeros is not None:
        steps = torch.arange(0, p.k, p.launch.block_k, device=x.device) // pw.group
        want += pw.zeros.double()[steps].sum(0)[None, :]
    return want


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|, in float64 (inf where ``got`` is not finite)."""
    g, w = got.double(), want.double()
    if not bool(torch.isfinite(g).all()):
        return float("inf")
    return float((g - w).abs().max() / w.abs().max().clamp_min(1e-300))


def check(x: torch.Tensor, pw: PackedWeights, p: Plan, shipped_launch: bool = False) -> None:
    """Every variant against torch on ``x``'s device (CUDA, or CPU under the interpreter).

    The xor variants exactly, per split (``read only``) and summed through the tail
    (``read+tail``, sums of 4-bit values, exact in fp16); the dot variants against
    :func:`dot_reference`; the shipped launch against ``x @ dequant(W).T`` in float64
    (``shipped_launch``: with ``p.launch`` passed explicitly, for the interpreter, whose device
    facts are a V100's).
    """
    dev = x.device
    label = f"{p.n}x{p.k} {'sym' if pw.zeros is None else 'asym'} {p.splits} splits"
    out = torch.full((p.m, p.n), float("nan"), dtype=torch.float16, device=dev)
    part = torch.full((p.splits, p.m, p.n), float("nan"), dtype=torch.float32, device=dev)
    want = xor_partials(x, pw, p)
    skeleton(x, pw, p, dot=False, tail=False, out=out, part=part)
    torch.testing.assert_close(part, want, rtol=0, atol=0, msg=lambda s: f"read only {label}: {s}")
    skeleton(x, pw, p, dot=False, tail=True, out=out, part=part)
    torch.testing.assert_close(
        out.float(), want.sum(0).half().float(), rtol=0, atol=0,
        msg=lambda s: f"read+tail {label}: {s}",
    )  # fmt: skip
    ref = dot_reference(x, pw, p)
    part.fill_(float("nan"))
    skeleton(x, pw, p, dot=True, tail=False, out=out, part=part)
    err = rel_error(part.double().sum(0), ref)
    if err > FP32_TOLERANCE:
        raise AssertionError(f"read+dot {label}: relative error {err:.2e}")
    out.fill_(float("nan"))
    skeleton(x, pw, p, dot=True, tail=True, out=out, part=part)
    err = rel_error(out, ref)
    if err > FP16_TOLERANCE:
        raise AssertionError(f"read+dot+tail {label}: relative error {err:.2e}")
    out.fill_(float("nan"))
    wna16_linear(x, pw, launch=p.launch if shipped_launch else None, out=out)
    err = rel_error(out, x.double() @ dequantize(pw).t())
    if err > FP16_TOLERANCE:
        raise AssertionError(f"shipped {label}: relative error {err:.2e}")
    # The accumulators and counters are back at zero for the next launch.
    ws = zeroed_accumulators(dev, p.m * p.n)
    counters = arrival_counters(dev, p.grid[0] * p.grid[1])
    if bool(ws.any()) or bool(counters.any()):
        raise AssertionError(f"{label}: accumulators or counters left non-zero")


def cpu_weights(n: int, k: int, symmetric: bool, seed: int) -> PackedWeights:
    """One layer as ``bench.weights`` makes it, on the CPU."""
    ckpt = fresh_checkpoint(n, k, WeightScheme(4, symmetric, bench.GROUP), seed=seed, device="cpu")
    return ckpt.packed(f"probe.{n}x{k}")


def layer_weights(n: int, k: int, symmetric: bool, copies: int, device: str) -> list[PackedWeights]:
    """``copies`` of one layer: ``bench.weights`` on CUDA, :func:`cpu_weights` elsewhere."""
    if device == "cuda":
        return bench.weights(n, k, symmetric, copies)
    return [cpu_weights(n, k, symmetric, seed=i) for i in range(copies)]


def interpret_check() -> int:
    """The checks on small layers in the Triton interpreter, with the SM90 launch."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        env = dict(os.environ, TRITON_INTERPRET="1")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    print(f"interpreter: torch {torch.__version__}, triton {triton.__version__}", flush=True)
    # The masked build's last arriver reads its sums with a masked atomic add, whose masked-off
    # lanes the interpreter fills with whatever the buffer holds past the layer; their fp16
    # conversion may overflow (numpy warns), and the masked store drops them.
    warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
    for n, k, splits in INTERPRET_LAYERS:
        p = plan(n, k, SM90_CAPABILITY, H100_SMS, splits=splits)
        print(p.describe(), flush=True)
        for symmetric in (True, False):
            pw = cpu_weights(n, k, symmetric, seed=n + k)
            gen = torch.Generator().manual_seed(k)
            x = _pair_aligned(torch.randn(M, k, generator=gen).to(torch.float16))
            check(x, pw, p, shipped_launch=True)
            print(f"  {'sym ' if symmetric else 'asym'} OK", flush=True)
    for n, k in LAYERS:
        print("H100 launch:", plan(n, k, SM90_CAPABILITY, H100_SMS).describe())
    print("OK")
    return 0


#: SASS opcodes ``--sass`` prints: tensor-core MMAs, async copies, loads, the tail's reductions
#: (REDG), returning atomics (ATOMG) and fence, and the integer / half ops of the dequantization.
SASS_OPCODES = ("HMMA", "LDGSTS", "LDG", "LDS", "LDSM", "REDG", "ATOMG", "MEMBAR", "LOP3", "PRMT",
                "SHF", "HFMA2", "HADD2", "FFMA", "BAR")  # fmt: skip


def sass_report() -> int:
    """Compile the shipped 16-token launch and the skeletons for sm_90 (no GPU needed)."""
    from volta_core.kernels.gate import compile_for

    sig = {**configs._SPLITK_SIG}
    divisible = configs._SPLITK_DIVISIBLE
    sk_sig = {**sig, "part_ptr": "*fp32"}
    for n, k in LAYERS:
        p = plan(n, k, SM90_CAPABILITY, H100_SMS)
        print(p.describe())
        ln = p.launch
        for zp in (False, True):
            builds: list[tuple[str, object, dict[str, str], dict[str, object]]] = [
                (
                    "shipped",
                    kernels.wna16_splitk_kernel,
                    sig,
                    configs.splitk_constexprs(ln, 4, zp, False, True, True, True, p.whole),
                )
            ]
            for name, dot, tail in (
                ("read+tail", False, True),
                ("read+dot+tail", True, True),
                ("read+dot", True, False),
                ("read only", False, False),
            ):
                const = {
                    "HAS_ZP": zp, "HAS_BIAS": False, "BLOCK_M": ln.block_m,
                    "BLOCK_N": ln.block_n, "BLOCK_K": ln.block_k, "NUM_STAGES": ln.num_stages,
                    "WHOLE": p.whole, "DOT": dot, "TAIL": tail,
                }  # fmt: skip
                builds.append((name, skeleton_kernel, sk_sig, const))
            for name, kernel, signature, const in builds:
                rep = compile_for(
                    kernel, signature, const, num_warps=ln.num_warps, num_stages=ln.num_stages,
                    capability=90, name=name, divisible_by_16=divisible,
                )  # fmt: skip
                hist = rep.sass_histogram
                ops = " ".join(f"{op} {hist.get(op, 0)}" for op in SASS_OPCODES)
                print(
                    f"  {'sym ' if not zp else 'asym'} {name:<14} regs {rep.n_regs} spills "
                    f"{rep.n_spills} shared {rep.shared_bytes} SASS {sum(hist.values())} | {ops}"
                    + "".join(f"\n    problem: {pr}" for pr in rep.problems),
                    flush=True,
                )
    return 0


@dataclass
class Row:
    layer: str
    sym: str
    grid: str
    times: dict[str, float]
    floor: float
    target: float


VARIANTS = ("shipped", "read+tail", "read+dot+tail", "read+dot", "read only")


def time_layer(
    n: int,
    k: int,
    symmetric: bool,
    cap: tuple[int, int],
    sms: int,
    fp16_us: float | None,
    device: str = "cuda",
) -> tuple[Row, float]:
    """Time the variants on one layer (best of two alternating runs); the fp16 product too
    (symmetric pass, ``fp16_us`` None) and the read floor of the words. Returns the row and
    the fp16 time."""
    copies = max(2, min(bench.MAX_COPIES, -(-bench.ROTATE_BYTES // (n * k // 2))))
    pws = layer_weights(n, k, symmetric, copies, device)
    p = plan(n, k, cap, sms)
    tag = f"{n}x{k} {'sym' if symmetric else 'asym'}"
    print(f"{tag}: {p.describe()}", flush=True)
    x = torch.randn(M, k, device=device, dtype=torch.float16)
    check(x, pws[0], p, shipped_launch=device != "cuda")
    print(f"{tag}: checks OK", flush=True)
    outs = [torch.empty(M, n, device=device, dtype=torch.float16) for _ in range(2)]
    part = torch.empty((p.splits, M, n), device=device)

    def variant(dot: bool, tail: bool) -> Callable[[int], None]:
        def fn(i: int) -> None:
            skeleton(x, pws[i], p, dot=dot, tail=tail, out=outs[i % 2], part=part)

        return fn

    def shipped(i: int) -> None:
        wna16_linear(x, pws[i], out=outs[i % 2])

    fns: dict[str, tuple[Callable[[int], None], int]] = {
        "shipped": (shipped, len(pws)),
        "read+tail": (variant(False, True), len(pws)),
        "read+dot+tail": (variant(True, True), len(pws)),
        "read+dot": (variant(True, False), len(pws)),
        "read only": (variant(False, False), len(pws)),
    }
    dense: list[torch.Tensor] = []
    if fp16_us is None:
        fp16_copies = max(1, min(bench.MAX_COPIES, -(-bench.ROTATE_BYTES // (n * k * 2))))
        dense = [dequantize_dense(pw, torch.float16).t().contiguous() for pw in pws[:fp16_copies]]

        def fp16(i: int) -> None:
            torch.matmul(x, dense[i].t(), out=outs[i % 2])

        fns["fp16"] = (fp16, len(dense))
    best: dict[str, float] = {}
    for _ in range(2):
        for name, (fn, sets) in fns.items():
            us = time_cuda_graph(fn, [(i,) for i in range(sets)], replays=bench.REPLAYS)
            best[name] = min(best.get(name, float("inf")), us.median_ms * 1e3)
            print(f"{tag} {name}: {us.median_ms * 1e3:.2f} us", flush=True)
    fp16_time = best.pop("fp16", fp16_us if fp16_us is not None else float("nan"))
    floor = read_floor([pw.qweight for pw in pws]).median_ms * 1e3
    print(f"{tag} read floor: {floor:.2f} us", flush=True)
    g = p.grid
    row = Row(
        f"{n}x{k}", "sym" if symmetric else "asym", f"{g[0] * g[1]} x {g[2]}", best, floor,
        fp16_time / 2.0,
    )  # fmt: skip
    return row, fp16_time


def table(rows: list[Row]) -> str:
    head = ["layer", "sym", "grid (tiles x splits)", *VARIANTS, "read floor", "target (fp16/2)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r.layer, r.sym, r.grid, *(f"{r.times[v]:.2f}" for v in VARIANTS)]
        cells += [f"{r.floor:.2f}", f"{r.target:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--interpret-check", action="store_true", help="CPU interpreter checks only")
    mode.add_argument("--sass", action="store_true", help="sm_90 compile report only (no GPU)")
    parser.add_argument("--symmetric-only", action="store_true", help="skip asymmetric layers")
    args = parser.parse_args(argv)
    if args.interpret_check:
        return interpret_check()
    if args.sass:
        return sass_report()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    cap = torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"capability {cap}, {sms} SMs", flush=True)
    rows = []
    for n, k in LAYERS:
        row, fp16_us = time_layer(n, k, True, cap, sms, None)
        rows.append(row)
        torch.cuda.empty_cache()
        if not args.symmetric_only:
            rows.append(time_layer(n, k, False, cap, sms, fp16_us)[0])
            torch.cuda.empty_cache()
    print(f"\n== M={M}, int4 g128, us (best of two alternating runs; fp16 from the sym pass)")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
