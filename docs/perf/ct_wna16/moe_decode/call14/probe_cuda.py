"""Probe (issue 35): the CUDA one-launch decode step (cuda/moe_decode.cu) against float64 and
against the shipped Triton one launch, on the benchmark's layers, one device call."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

root = Path(__file__).resolve().parents[5]
sys.path[:0] = [str(root / "plugins/ct_wna16/benchmarks"), str(root / "plugins/ct_wna16/tests")]

from ct_wna16_moe_bench import MODELS, routings, stack  # noqa: E402

from volta_core.kernel_api import arrival_counters, load_cuda_kernel, zeroed_accumulators  # noqa: E402
from volta_ct_wna16 import ops  # noqa: E402
from volta_ct_wna16.layout import dequantize  # noqa: E402
from volta_ct_wna16.tables import choose_moe_decode  # noqa: E402
from volta_devkit.bench import measure_copy_bandwidth, time_cuda_graph  # noqa: E402

SRC = (Path(__file__).resolve().parent / "moe_decode_probe.cu").read_text()


def build(zp: bool, bj: int, warps: int, u: int, mul: bool = False, has_map: bool = False):
    opts = (
        f"-DHAS_ZP={int(zp)}", f"-DHAS_MAP={int(has_map)}", f"-DMUL_INPUT={int(mul)}",
        "-DG13=128", "-DG2=128", f"-DBJ={bj}", f"-DWARPS={warps}", f"-DU={u}",
    )  # fmt: skip
    return load_cuda_kernel(SRC, "moe_decode_cuda", options=opts)


def run_cuda(kern, bj, warps, x, wts, w, ids, out, emap=None):
    m, top_k = ids.shape
    w13, w2 = wts.w13, wts.w2
    hidden, inter, experts = w13.k, w2.k, w13.qweight.shape[0]
    acc = zeroed_accumulators(x.device, m * hidden)
    cnt = arrival_counters(x.device, m)
    kern.launch(
        (m * top_k, inter // bj), warps * 32,
        x, w13.qweight, w13.scales, w13.zeros, w2.qweight, w2.scales, w2.zeros, out,
        w, ids, emap, acc, cnt, m * top_k, hidden, inter, experts, top_k, x.stride(0),
        out.stride(0), w13.qweight.stride(0), w13.scales.stride(0), w2.qweight.stride(0),
        w2.scales.stride(0), shared_mem=hidden * 4,
    )  # fmt: skip
    return out


def expert(pw, e):
    return ops._expert(pw, e)


def reference(wts, x, w, ids):
    out = torch.zeros(x.shape[0], wts.hidden, dtype=torch.float64, device=x.device)
    xd = x.double()
    inter = wts.inter
    for t in range(ids.shape[0]):
        for s in range(ids.shape[1]):
            e = int(ids[t, s])
            w13 = dequantize(expert(wts.w13, e))
            w2 = dequantize(expert(wts.w2, e))
            h = w13 @ xd[t]
            a = torch.nn.functional.silu(h[:inter]) * h[inter:]
            out[t] += float(w[t, s]) * (w2 @ a)
    return out


def rel(a, ref):
    return float((a.double() - ref).abs().max() / ref.abs().max())


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    copy_bw = measure_copy_bandwidth()[0] * 1e9
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    gen = torch.Generator().manual_seed(0)
    variants = [(32, 16, 2), (32, 16, 4), (32, 8, 2), (32, 8, 4), (32, 4, 4), (32, 4, 2)]
    for sym in (True, False):
        for name, (experts, top_k, hidden, inter) in MODELS.items():
            if not sym and name != next(iter(MODELS)):
                continue
            wts = stack(experts, hidden, inter, sym)
            per_expert = (wts.w13.nbytes() + wts.w2.nbytes()) / experts
            for m in (1, 4) if sym else (1,):
                count = max(2, min(64, int((400 << 20) // (m * top_k * per_expert))))
                sets = routings(m, experts, top_k, count, gen)
                x = torch.randn(m, hidden, device="cuda", dtype=torch.float16)
                _, w, ids = sets[0]
                ref = reference(wts, x, w, ids)
                fused = choose_moe_decode(m, torch.cuda.get_device_capability())
                tri = ops.moe_decode(x, wts.w13, wts.w2, w, ids, fused)
                distinct = sum(int(i.unique().numel()) for *_, i in sets) / len(sets)
                nbytes = distinct * per_expert
                t_tri = (
                    time_cuda_graph(
                        lambda _l, w, ids, xx=x, ww=wts, f=fused: ops.moe_decode(
                            xx, ww.w13, ww.w2, w, ids, f
                        ),
                        sets,
                        replays=7,
                    ).median_ms
                    * 1e3
                )
                print(
                    f"{name} sym={sym} m={m} triton {fused}: {t_tri:.2f} us "
                    f"{nbytes / (t_tri * 1e-6) / copy_bw * 100:.1f}% err {rel(tri, ref):.2e}",
                    flush=True,
                )
                for bj, warps, u in variants if sym else variants[:1]:
                    try:
                        kern = build(not sym, bj, warps, u)
                    except Exception as exc:
                        print(f"  cuda bj{bj} w{warps} u{u}: build failed {exc!r}"[:400])
                        continue
                    out = torch.full((m, hidden), float("nan"), device="cuda", dtype=torch.float16)
                    run_cuda(kern, bj, warps, x, wts, w, ids, out)
                    out2 = torch.full_like(out, float("nan"))
                    run_cuda(kern, bj, warps, x, wts, w, ids, out2)
                    ob = torch.empty_like(out)
                    t = (
                        time_cuda_graph(
                            lambda _l, w, ids, k=kern, b=bj, n=warps, xx=x, ww=wts, o=ob: run_cuda(
                                k, b, n, xx, ww, w, ids, o
                            ),
                            sets,
                            replays=7,
                        ).median_ms
                        * 1e3
                    )
                    print(
                        f"  cuda bj{bj} w{warps} u{u}: {t:.2f} us "
                        f"{nbytes / (t * 1e-6) / copy_bw * 100:.1f}% x{t_tri / t:.2f} "
                        f"err {rel(out, ref):.2e} rerun-diff {rel(out2, out.double()):.1e}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
