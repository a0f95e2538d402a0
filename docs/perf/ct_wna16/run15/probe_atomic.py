"""Run 15 probe: split-K by fp32 atomic adds (the fused-MoE kernel's decode path) against the
dense table's two-level reduction tree, on the benchmark's dense shapes at 1-16 tokens.

The MoE kernel with one expert and every token routed to it is a dense layer whose input
splits add their partials into zeroed fp32 rows (no reduction tree, no tail of round trips).
Timed three ways in one CUDA graph per row, rotating weight copies past the L2:

* ``table``: :func:`volta_ct_wna16.ops.wna16_linear` on the shipped SM90 table;
* ``atomic``: the MoE kernel alone into a pre-allocated fp32 buffer (no zeroing, no cast: the
  time a one-launch atomic path would take if its last arriver cast and re-zeroed for free);
* ``atomic+`` : memset, the kernel, and the fp16 cast: what it costs as three launches;
* ``fp16``: cuBLAS on the dequantized weight.

Each atomic variant is first checked against ``x @ dequant(W).T`` (cuBLAS, fp16).
Run from the repository root with PYTHONPATH=core/src:plugins/ct_wna16/src. Run 15 call 1 ran
it with the timings inline in one ``main`` (same measurements; restructured for ruff after).
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from volta_core.kernels.bench import measure_copy_bandwidth, time_cuda_graph
from volta_ct_wna16 import configs, kernels
from volta_ct_wna16.bench import weights
from volta_ct_wna16.layout import PackedWeights
from volta_ct_wna16.ops import _pair_aligned, dequantize_dense, wna16_linear
from volta_ct_wna16.routing import route

SHAPES = ((5120, 5120), (7168, 5120), (27648, 5120), (5120, 27648))
MS = (1, 4, 16)
REPLAYS = 7
BASE = configs.SM90.moe  # 16 x 128 x 128, 4 warps, 3 stages
VARIANTS = {
    "a128p2": replace(BASE, programs_per_sm=2),
    "a128p4": replace(BASE, programs_per_sm=4),
    "a128p8": replace(BASE, programs_per_sm=8),
    "a256p2": replace(BASE, block_n=256, programs_per_sm=2),
    "a256p4": replace(BASE, block_n=256, programs_per_sm=4),
    "a64p8": replace(BASE, block_n=64, programs_per_sm=8),
}


def one_expert(pw: PackedWeights) -> PackedWeights:
    z = None if pw.zeros is None else pw.zeros.unsqueeze(0)
    return PackedWeights(
        pw.qweight.unsqueeze(0), pw.scales.unsqueeze(0), z, pw.n, pw.k, pw.bits, pw.group
    )


def atomic_launch(x, pw1, blocks, launch, out, sms):
    """The MoE kernel's launch as ops.moe_linear makes it, into ``out`` (fp32, not zeroed)."""
    splits, per_split = configs.split_count(pw1.n * blocks.blocks, pw1.k, launch, sms)
    x = _pair_aligned(x)
    zeros = pw1.zeros if pw1.zeros is not None else out
    grid = (blocks.blocks, -(-pw1.n // launch.block_n), splits)
    kernels.wna16_moe_kernel[grid](
        x, pw1.qweight, pw1.scales, zeros, out, out, blocks.pairs, blocks.experts,
        blocks.num_pairs, pw1.n, pw1.k, pw1.qweight.shape[1], pw1.group, blocks.num_experts,
        1, 1, x.stride(0), out.stride(0), pw1.qweight.stride(0), pw1.scales.stride(0),
        per_split,
        **configs.moe_constexprs(
            launch, pw1.bits, pw1.zeros is not None, False,
            configs.group_tile(launch, pw1.group), True,
        ),
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )  # fmt: skip
    return splits


def time_table(x, pws, outs):
    return (
        time_cuda_graph(
            lambda i: wna16_linear(x, pws[i], out=outs[i % 2]),
            [(i,) for i in range(len(pws))],
            replays=REPLAYS,
        ).median_ms
        * 1e3
    )


def time_atomic(x, pw1s, blocks, ln, sms, outs):
    """The kernel alone, then memset + kernel + fp16 cast."""
    m, n = outs[0].shape
    bufs = [torch.empty(m, n, device="cuda", dtype=torch.float32) for _ in range(2)]
    sets = [(i,) for i in range(len(pw1s))]
    alone = (
        time_cuda_graph(
            lambda i: atomic_launch(x, pw1s[i], blocks, ln, bufs[i % 2], sms), sets, replays=REPLAYS
        ).median_ms
        * 1e3
    )

    def three(i):
        b = bufs[i % 2]
        b.zero_()
        atomic_launch(x, pw1s[i], blocks, ln, b, sms)
        outs[i % 2].copy_(b)

    return alone, time_cuda_graph(three, sets, replays=REPLAYS).median_ms * 1e3


def measure_layer(n, k, sym, copy_bw, sms):
    copies = max(2, min(8, -(-(256 << 20) // (n * k // 2))))
    pws = weights(n, k, sym, copies)
    pw1s = [one_expert(p) for p in pws]
    dense = [dequantize_dense(p, torch.float16).t().contiguous() for p in pws[:2]]
    wbytes = pws[0].nbytes()
    lines = []
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        blocks = route(torch.zeros(m, dtype=torch.int32, device="cuda"), 1, 16)
        ref = x @ dense[0].t()
        scale = ref.abs().max().item()
        outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(2)]
        t_table = time_table(x, pws, outs)
        t_fp16 = (
            time_cuda_graph(
                lambda i, x=x, outs=outs: torch.matmul(x, dense[i].t(), out=outs[i]),
                [(0,), (1,)],
                replays=REPLAYS,
            ).median_ms
            * 1e3
        )
        row = {}
        for name, ln in VARIANTS.items():
            f32 = torch.zeros(m, n, device="cuda", dtype=torch.float32)
            splits = atomic_launch(x, pw1s[0], blocks, ln, f32, sms)
            err = (f32.half() - ref).abs().max().item() / scale
            if not err < 1e-2:
                print(f"  {n}x{k} sym={sym} m={m} {name}: WRONG err {err:.3g}")
                continue
            row[name] = (*time_atomic(x, pw1s, blocks, ln, sms, outs), splits)
        best_t, best = min((v[0], kk) for kk, v in row.items())
        line = (
            f"{n:>6}x{k:<6}{'y' if sym else 'n':>2}{m:>4}  table {t_table:7.1f}"
            f" ({t_fp16 / t_table:4.2f}x)  fp16 {t_fp16:7.1f}  "
            + "  ".join(f"{kk} {a:6.1f}/{b:6.1f}[{sp}]" for kk, (a, b, sp) in row.items())
            + f"  | best {best} {best_t:.1f} ({t_fp16 / best_t:4.2f}x,"
            f" {wbytes / (best_t * 1e-6) / copy_bw * 100:4.1f}% copy)"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def byte_zero_points(n, k):
    pws = weights(n, k, False, max(2, min(8, -(-(256 << 20) // (n * k // 2)))))
    u8 = [replace(p, zeros=p.zeros.to(torch.uint8)) for p in pws]
    x = torch.randn(1, k, device="cuda", dtype=torch.float16)
    outs = [torch.empty(1, n, device="cuda", dtype=torch.float16) for _ in range(2)]
    assert torch.equal(wna16_linear(x, pws[0]), wna16_linear(x, u8[0])), "outputs differ"
    ts = [time_table(x, ws, outs) for ws in (pws, u8, pws, u8)]
    return (
        f"{n:>6}x{k:<6} fp16 zp {ts[0]:6.2f} {ts[2]:6.2f}   uint8 zp {ts[1]:6.2f} {ts[3]:6.2f}"
        f"   bytes {pws[0].nbytes() / 1e6:.1f} / {u8[0].nbytes() / 1e6:.1f} MB"
    )


def main() -> int:
    copy_bw = measure_copy_bandwidth()[0] * 1e9
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}  copy {copy_bw / 1e9:.0f} GB/s  SMs {sms}", flush=True)
    lines = []
    for n, k in SHAPES:
        for sym in (True, False):
            lines += measure_layer(n, k, sym, copy_bw, sms)
            torch.cuda.empty_cache()
    print("\n== 1-token GEMV, asymmetric: zero points fp16 (shipped) against uint8, twice each")
    for n, k in SHAPES:
        lines.append(byte_zero_points(n, k))
        print(lines[-1], flush=True)
        torch.cuda.empty_cache()
    print("\n== table us (x fp16) | atomic kernel alone / with memset+cast [splits]")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
