"""Fused-MoE benchmark: ``python plugins/ct_wna16/benchmarks/ct_wna16_moe_bench.py --out DIR``
(needs CUDA; imports as :mod:`ct_wna16_bench` does).

For two MoE layer shapes of the models V100 owners serve (Qwen3-30B-A3B: 128 experts, top-8,
hidden 2048, intermediate 768; Qwen3.5-35B-A3B: 256 experts, top-8, hidden 2048, intermediate
512), int4 group 128, symmetric and asymmetric, and M tokens, one run times inside one CUDA
graph (as vLLM captures decode; :func:`volta_devkit.bench.time_cuda_graph`):

* ``step``: :func:`volta_ct_wna16.experts.experts_forward` whole (routing, both fused launches,
  ``SiLU(gate) * up``, the weighted sum), what vLLM's ``apply`` runs;
* ``route``: :func:`volta_ct_wna16.routing.route` alone (its two launches and memset);
* ``kernels``: the two :func:`volta_ct_wna16.ops.moe_linear` calls alone (with their output
  allocation), on blocks routed beforehand, the second summing each token's pairs.

Each call gets its own random routing (distinct experts per token), cycled so the weights read
per replay far exceed the L2. Reported against ceilings of the same run: the weight bytes of
the experts a call routes to (each read once) over the time, as a fraction of the copy
bandwidth, and the routed FLOPs over fp16 cuBLAS's 8192-cube rate; beside them an SM70 estimate
(those bytes at 900 GB/s or the FMAs at 15.7 TFLOP/s, whichever is longer).

Writes ``DIR/ct_wna16_moe_bench.json``; prints the table last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

# Beside this script: the linear benchmark; in plugins/ct_wna16/tests: the checkpoint maker.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from ct_wna16_bench import V100_BANDWIDTH, V100_FMA_FLOPS, matmul_flops, start, versions
from ct_wna16_checkpoints import fresh_checkpoint

from volta_ct_wna16 import ops
from volta_ct_wna16.experts import ExpertWeights, experts_forward
from volta_ct_wna16.routing import route
from volta_ct_wna16.scheme import WeightScheme
from volta_ct_wna16.tables import choose_moe
from volta_devkit.bench import time_cuda_graph

#: name: (experts, top_k, hidden, intermediate)
MODELS = {
    "Qwen3-30B-A3B": (128, 8, 2048, 768),
    "Qwen3.5-35B-A3B": (256, 8, 2048, 512),
}
MS = (1, 4, 16, 64, 256, 1024)
GROUP = 128
#: Distinct experts built; the stack repeats them (same bytes, other addresses).
DISTINCT = 4
#: Routed weight bytes each replay cycles through (well above an H100's 50 MB L2).
ROTATE_BYTES = 400 << 20
MAX_ROUTINGS = 64
REPLAYS = 7


def stack(experts: int, hidden: int, inter: int, symmetric: bool) -> ExpertWeights:
    scheme = WeightScheme(4, symmetric, GROUP)
    w13 = [
        fresh_checkpoint(2 * inter, hidden, scheme, seed=e, device="cuda").packed(f"w13.{e}")
        for e in range(DISTINCT)
    ]
    w2 = [
        fresh_checkpoint(hidden, inter, scheme, seed=100 + e, device="cuda").packed(f"w2.{e}")
        for e in range(DISTINCT)
    ]
    return ExpertWeights.stack(
        (w13[e % DISTINCT] for e in range(experts)),
        (w2[e % DISTINCT] for e in range(experts)),
        experts,
    )


def routings(
    m: int, experts: int, top_k: int, count: int, gen: torch.Generator
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for _ in range(count):
        ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(m)])
        w = torch.rand(m, top_k, generator=gen)
        out.append(((w / w.sum(-1, keepdim=True)).cuda(), ids.to(torch.int32).cuda()))
    return out


def measure(
    name: str, symmetric: bool, copy_bw: float, flops: float, ms: tuple[int, ...] = MS
) -> list[dict[str, Any]]:
    experts, top_k, hidden, inter = MODELS[name]
    weights = stack(experts, hidden, inter, symmetric)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for m in ms:
        rows.append(time_one(name, symmetric, m, weights, top_k, copy_bw, flops, gen))
        print(line(rows[-1]), flush=True)
    return rows


def time_one(
    name: str,
    symmetric: bool,
    m: int,
    weights: ExpertWeights,
    top_k: int,
    copy_bw: float,
    flops: float,
    gen: torch.Generator,
) -> dict[str, Any]:
    """One row: the whole step and the two launches alone at ``m`` tokens."""
    experts, hidden, inter = weights.num_experts, weights.hidden, weights.inter
    expert_bytes = (weights.w13.nbytes() + weights.w2.nbytes()) / experts
    x = torch.randn(m, hidden, device="cuda", dtype=torch.float16)
    per_call = min(experts, m * top_k) * expert_bytes
    count = max(2, min(MAX_ROUTINGS, int(ROTATE_BYTES // per_call)))
    sets = routings(m, experts, top_k, count, gen)
    distinct = sum(int(ids.unique().numel()) for _, ids in sets) / len(sets)
    launch = choose_moe(m * top_k, experts, torch.cuda.get_device_capability())
    step = time_cuda_graph(
        lambda w, ids: experts_forward(x, w, ids, weights), sets, replays=REPLAYS
    ).median_ms
    routing_ms = time_cuda_graph(
        lambda _, ids: route(ids, experts, launch.block_m), sets, replays=REPLAYS
    ).median_ms
    blocks = [route(ids, experts, launch.block_m) for _, ids in sets]
    act = torch.randn(m * top_k, inter, device="cuda", dtype=torch.float16)

    def kernels(i: int) -> None:
        ops.moe_linear(x, weights.w13, blocks[i], launch, top_k)
        router = sets[i][0].reshape(-1)
        ops.moe_linear(act, weights.w2, blocks[i], launch, 1, router, sum_slots=top_k)

    kern = time_cuda_graph(kernels, [(i,) for i in range(len(sets))], replays=REPLAYS).median_ms
    routed_bytes = distinct * expert_bytes
    routed_flops = 2 * m * top_k * 3 * hidden * inter
    sm70 = max(routed_bytes / V100_BANDWIDTH, routed_flops / V100_FMA_FLOPS)
    return {
        "model": name,
        "symmetric": symmetric,
        "m": m,
        "experts": experts,
        "top_k": top_k,
        "hidden": hidden,
        "inter": inter,
        "launch": f"m{launch.block_m}n{launch.block_n}k{launch.block_k}",
        "distinct_experts": distinct,
        "routed_bytes": routed_bytes,
        "step_us": step * 1e3,
        "route_us": routing_ms * 1e3,
        "kernels_us": kern * 1e3,
        "copy_fraction": routed_bytes / (kern * 1e-3) / copy_bw,
        "step_copy_fraction": routed_bytes / (step * 1e-3) / copy_bw,
        "tflops": routed_flops / (kern * 1e-3) / 1e12,
        "cublas_fraction": routed_flops / (kern * 1e-3) / flops,
        "sm70_estimate_us": sm70 * 1e6,
    }


HEADER = (
    f"{'model':<16}{'sym':>4}{'M':>6}{'tile':>14}{'experts':>9}{'MB':>7}{'step us':>9}"
    f"{'route us':>9}"
    f"{'kern us':>9}{'%copy':>7}{'step%':>7}{'TFLOP/s':>9}{'xcuBLAS':>9}{'SM70 us':>9}"
)


def line(r: dict[str, Any]) -> str:
    return (
        f"{r['model']:<16}{'y' if r['symmetric'] else 'n':>4}{r['m']:>6}{r['launch']:>14}"
        f"{r['distinct_experts']:>9.1f}{r['routed_bytes'] / 1e6:>7.1f}{r['step_us']:>9.1f}"
        f"{r['route_us']:>9.1f}"
        f"{r['kernels_us']:>9.1f}{100 * r['copy_fraction']:>7.1f}"
        f"{100 * r['step_copy_fraction']:>7.1f}{r['tflops']:>9.1f}{r['cublas_fraction']:>9.2f}"
        f"{r['sm70_estimate_us']:>9.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    copy_bw = start(args.out)
    if copy_bw is None:
        return 2
    flops = matmul_flops()
    rows: list[dict[str, Any]] = []
    result = {
        **versions(),
        "copy_bandwidth_gbps": copy_bw / 1e9,
        "fp16_matmul_tflops": flops / 1e12,
    }
    for name in MODELS:
        for symmetric in (True, False):
            rows += measure(name, symmetric, copy_bw, flops)
            torch.cuda.empty_cache()
            path = args.out / "ct_wna16_moe_bench.json"
            path.write_text(json.dumps({**result, "rows": rows}, indent=1))
    print(f"{result['device']}, torch {torch.__version__}, triton {result['versions']['triton']}")
    print(f"copy {copy_bw / 1e9:.0f} GB/s, fp16 cuBLAS 8192^3 {flops / 1e12:.0f} TFLOP/s")
    print(HEADER)
    print("\n".join(line(r) for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
