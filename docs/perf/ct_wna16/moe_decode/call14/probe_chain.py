"""Probe (issue 35): where the one-launch decode step's time goes. The CUDA step
(cuda/moe_decode.cu) and skeletons made from its source by text substitution (nothing here
ships): the same launches with the per-weight arithmetic removed, then the down phase, then
everything but the weight reads; one token, the benchmark's layers, inside CUDA graphs."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

root = Path(__file__).resolve().parents[5]
sys.path[:0] = [str(root / "plugins/ct_wna16/benchmarks"), str(root / "plugins/ct_wna16/tests")]

from ct_wna16_moe_bench import MODELS, floor_us, routings, stack  # noqa: E402
from probe_cuda import reference, rel, run_cuda  # noqa: E402

from volta_core.kernel_api import load_cuda_kernel  # noqa: E402
from volta_devkit.bench import measure_copy_bandwidth, time_cuda_graph  # noqa: E402

SRC = (Path(__file__).resolve().parent / "moe_decode_probe.cu").read_text()

WORD_DOT = SRC[SRC.index("__device__ __forceinline__ float word_dot") :]
WORD_DOT = WORD_DOT[: WORD_DOT.index("\n}\n") + 3]
CHEAP_DOT = (
    "__device__ __forceinline__ float word_dot(u32 w, const float (&x)[8], const Exps& ex) {\n"
    "  return __uint_as_float(w & 0x3F0F0F0Fu) * x[0];\n}\n"
)
DOWN_START = "    // Down: 4 outputs a thread"
DOWN_END = "  // Arrival: the token's last block takes the sums."


def variant(name: str) -> str:
    src = SRC
    if name in ("no-math", "no-down", "reads-only"):
        src = src.replace(WORD_DOT, CHEAP_DOT)
    if name in ("no-down", "reads-only"):
        a, b = src.index(DOWN_START), src.index(DOWN_END)
        src = (
            src[:a]
            + "    if (act[0] == 12345.0f) acc_row[tid] = act[1] + d0[0].w.x + d0[0].s.x;\n  }\n\n"
            + src[b:]
        )
    if name == "reads-only":
        # No arrival either: each block only reads its weights.
        a = src.index(DOWN_END)
        src = src[:a] + "}\n"
    if name == "empty":
        body = src.index("  extern __shared__ float4 xs4[];")
        src = src[:body] + "  if (pairs < 0) out[0] = 0;\n}\n"
    return src


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    copy_bw = measure_copy_bandwidth()[0] * 1e9
    print(f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    gen = torch.Generator().manual_seed(1)
    opts = ("-DHAS_ZP=0", "-DHAS_MAP=0", "-DMUL_INPUT=0", "-DG13=128", "-DG2=128", "-DBJ=32")
    for name_m, (experts, top_k, hidden, inter) in MODELS.items():
        wts = stack(experts, hidden, inter, True)
        per_expert = (wts.w13.nbytes() + wts.w2.nbytes()) / experts
        count = max(2, min(64, int((400 << 20) // (top_k * per_expert))))
        sets = routings(1, experts, top_k, count, gen)
        x = torch.randn(1, hidden, device="cuda", dtype=torch.float16)
        nbytes = per_expert * top_k
        ref = reference(wts, x, sets[0][1], sets[0][2])
        distinct = sum(int(ids.unique().numel()) for *_, ids in sets) / len(sets)
        up = round(distinct * wts.w13.nbytes() / experts)
        down = round(distinct * wts.w2.nbytes() / experts)
        f1, f2 = floor_us(up + down), floor_us(up) + floor_us(down)
        print(
            f"{name_m} read floor: one launch {f1:.2f} us "
            f"({nbytes / (f1 * 1e-6) / copy_bw * 100:.1f}% of copy), two launches {f2:.2f} us "
            f"({nbytes / (f2 * 1e-6) / copy_bw * 100:.1f}%)",
            flush=True,
        )
        for warps, u in ((16, 2), (8, 4), (16, 4)):
            for v in ("full", "no-math", "no-down", "reads-only", "empty"):
                kern = load_cuda_kernel(
                    variant(v), "moe_decode_cuda", options=(*opts, f"-DWARPS={warps}", f"-DU={u}")
                )
                ob = torch.zeros(1, hidden, device="cuda", dtype=torch.float16)
                run_cuda(kern, 32, warps, x, wts, sets[0][1], sets[0][2], ob)
                err = rel(ob, ref) if v == "full" else float("nan")
                t = (
                    time_cuda_graph(
                        lambda _l, w, ids, k=kern, n=warps, xx=x, ww=wts, o=ob: run_cuda(
                            k, 32, n, xx, ww, w, ids, o
                        ),
                        sets,
                        replays=7,
                    ).median_ms
                    * 1e3
                )
                print(
                    f"{name_m} w{warps} u{u} {v:<11} {t:6.2f} us "
                    f"{nbytes / (t * 1e-6) / copy_bw * 100:5.1f}% of copy err {err:.1e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
