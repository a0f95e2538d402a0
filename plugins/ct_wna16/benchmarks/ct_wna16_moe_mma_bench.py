"""The routed experts on the tensor cores against the Triton routed blocks (issue 51): ``python
plugins/ct_wna16/benchmarks/ct_wna16_moe_mma_bench.py --out DIR [--vllm-fused-moe PATH]
[--ms 512 2048 4096]`` (needs CUDA; imports as :mod:`ct_wna16_moe_bench` does).

For the two MoE layers of :mod:`ct_wna16_moe_bench` (int4, group 128, symmetric) at each token
count, side by side in one run, each the whole step of
:func:`volta_ct_wna16.experts.experts_forward` (routing, gate/up, SiLU product, down, cast)
inside one CUDA graph (:func:`volta_devkit.bench.time_cuda_graph`) over random routings:

* ``triton``: the Triton routed blocks with the device's table tile
  (:func:`volta_ct_wna16.dispatch.moe_blocks_choice`), what the device runs today;
* ``mma``: the CUDA tensor-core GEMM over the same routed blocks (``wna16_moe_mma.cu``) with the
  tile a V100 takes (:func:`volta_ct_wna16.dispatch.moe_mma_launch`), built for the device's
  own architecture (on an H200 ``mma.m8n8k4`` runs, but it is not the device's fast path);
* ``vllm``: vLLM's Triton fused-MoE int4 kernel where ``--vllm-fused-moe`` names its file
  (:func:`ct_wna16_moe_bench.vllm_step`);

each output checked against a float32 step on the dequantized experts first (``err``: largest
absolute error over the largest reference magnitude). Beside them the SM70 estimates of the
plugin's cost model (:func:`volta_ct_wna16.dispatch.expert_launch_cost` at
:data:`volta_core.kernel_api.V100_RATES`): the tensor-core choice and its Triton fallback on
the FMA units. Writes ``DIR/ct_wna16_moe_mma_bench.json``; prints the table last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

# Beside this script: the MoE benchmark (which puts plugins/ct_wna16/tests on the path).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ct_wna16_bench import start, versions
from ct_wna16_moe_bench import (
    GROUP,
    MODELS,
    align_block_size,
    load_vllm_kernel,
    routings,
    stack,
    vllm_block_m,
    vllm_layout,
    vllm_step,
)

from volta_core.kernel_api import V100_RATES, time_cuda_graph
from volta_ct_wna16.dispatch import (
    ExpertShape,
    expert_choice,
    expert_launch_cost,
    moe_blocks_choice,
    moe_mma_launch,
)
from volta_ct_wna16.experts import ExpertWeights, experts_forward
from volta_ct_wna16.layout import PackedWeights, dequantize
from volta_ct_wna16.scheme import WeightScheme

MS = (512, 2048, 4096)
#: Routings per graph (each reads every expert at these sizes, far more bytes than the L2).
ROUTINGS = 2
REPLAYS = 5
#: Worst ``err`` a path may show and still be timed.
TOLERANCE = 1e-2
SCHEME = WeightScheme(4, True, GROUP)


def estimates(model: str, m: int) -> dict[str, float]:
    """The SM70 cost model's microseconds for one layer of ``model`` at ``m`` tokens: the
    choice (the tensor cores) and its fallback (the Triton routed blocks on the FMA units)."""
    experts, top_k, hidden, inter = MODELS[model]
    shape = ExpertShape(hidden, inter, SCHEME)
    chosen = expert_choice(m, top_k, experts, (7, 0), shape)
    if chosen.fallback is None:
        raise ValueError(f"{model} at {m} tokens takes no tensor-core launch on a V100")
    cost = expert_launch_cost(m, shape, experts, top_k, chosen)
    fallback = expert_launch_cost(m, shape, experts, top_k, chosen.fallback)
    return {
        "sm70_mma_us": cost.seconds(V100_RATES) * 1e6,
        "sm70_triton_us": fallback.seconds(V100_RATES) * 1e6,
    }


def _expert(pw: PackedWeights, e: int) -> PackedWeights:
    zeros = None if pw.zeros is None else pw.zeros[e]
    return PackedWeights(pw.qweight[e], pw.scales[e], zeros, pw.n, pw.k, pw.bits, pw.group)


def reference(
    weights: ExpertWeights, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """The step in float32 on the dequantized experts."""
    top_k = ids.shape[1]
    flat, fw = ids.reshape(-1).long(), w.reshape(-1).float()
    out = torch.zeros(x.shape[0], weights.hidden, device=x.device)
    inter = weights.inter
    for e in torch.unique(flat).tolist():
        pairs = (flat == e).nonzero().squeeze(1)
        tokens = pairs // top_k
        h = x[tokens].float() @ dequantize(_expert(weights.w13, e), torch.float32).t()
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = act @ dequantize(_expert(weights.w2, e), torch.float32).t()
        out.index_add_(0, tokens, y * fw[pairs, None])
    return out


def err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def row(
    model: str, m: int, weights: ExpertWeights, peer: Any, gen: torch.Generator
) -> dict[str, Any]:
    experts, top_k, _, _ = MODELS[model]
    x = torch.randn(m, weights.hidden, generator=gen).half().cuda()
    sets = [(w, ids) for _, w, ids in routings(m, experts, top_k, ROUTINGS, gen)]
    capability = torch.cuda.get_device_capability()
    paths = {
        "triton": moe_blocks_choice(m * top_k, experts, capability).launch,
        "mma": moe_mma_launch(m * top_k, experts),
    }
    ref = reference(weights, x, *sets[0])
    result: dict[str, Any] = {"model": model, "m": m, **estimates(model, m)}
    for name, launch in paths.items():

        def step(w: torch.Tensor, ids: torch.Tensor, launch: Any = launch) -> torch.Tensor:
            return experts_forward(x, w, ids, weights, launch=launch)

        result[f"{name}_tile"] = f"{launch.path} m{launch.block_m}n{launch.block_n}"
        result[f"{name}_err"] = err(step(*sets[0]), ref)
        if result[f"{name}_err"] <= TOLERANCE:
            result[f"{name}_us"] = time_cuda_graph(step, sets, replays=REPLAYS).median_ms * 1e3
    if peer is not None:
        kernel, packed = peer
        aligned = [align_block_size(ids, experts, vllm_block_m(m)) for _, ids in sets]
        args = [(w, a) for (w, _), a in zip(sets, aligned, strict=True)]

        def vllm(w: torch.Tensor, a: Any) -> torch.Tensor:
            return vllm_step(kernel, packed, x, w, a, top_k, glue=True)

        result["vllm_err"] = err(vllm(*args[0]), ref)
        if result["vllm_err"] <= TOLERANCE:
            result["vllm_us"] = time_cuda_graph(vllm, args, replays=REPLAYS).median_ms * 1e3
    return result


HEADER = (
    f"{'layer':<17}{'m':>5}{'triton us':>11}{'mma us':>9}{'vllm us':>9}{'mma x':>7}"
    f"{'err t/m/v':>22}{'SM70 mma':>10}{'SM70 tri':>10}"
)


def line(r: dict[str, Any]) -> str:
    def us(key: str) -> str:
        return f"{r[key]:.1f}" if key in r else "-"

    speed = f"{r['triton_us'] / r['mma_us']:.2f}" if "mma_us" in r and "triton_us" in r else "-"
    errs = "/".join(f"{r[k]:.1e}" if k in r else "-" for k in ("triton_err", "mma_err", "vllm_err"))
    return (
        f"{r['model']:<17}{r['m']:>5}{us('triton_us'):>11}{us('mma_us'):>9}{us('vllm_us'):>9}"
        f"{speed:>7}{errs:>22}{r['sm70_mma_us']:>10.0f}{r['sm70_triton_us']:>10.0f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ms", type=int, nargs="+", default=list(MS))
    parser.add_argument("--vllm-fused-moe", type=Path, default=None)
    args = parser.parse_args(argv)
    if start(args.out) is None:
        return 1
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    record: dict[str, Any] = {"versions": versions(), "rows": rows}
    for model, (experts, _, hidden, inter) in MODELS.items():
        weights = stack(experts, hidden, inter, symmetric=True)
        peer = None
        if args.vllm_fused_moe is not None:
            peer = (load_vllm_kernel(args.vllm_fused_moe, args.out), vllm_layout(weights))
        for m in args.ms:
            rows.append(row(model, m, weights, peer, gen))
            print(line(rows[-1]), flush=True)
            (args.out / "ct_wna16_moe_mma_bench.json").write_text(json.dumps(record, indent=1))
        del weights, peer
        torch.cuda.empty_cache()
    print(json.dumps(record["versions"]))
    print(HEADER)
    for r in rows:
        print(line(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
