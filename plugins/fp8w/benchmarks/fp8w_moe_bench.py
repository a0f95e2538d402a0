"""Benchmark of the fused MoE experts' prefill: ``python plugins/fp8w/benchmarks/fp8w_moe_bench.py
--out DIR [--ms 2048,512] [--ptx70]`` (needs CUDA, and ``volta_fp8w`` and the devkit importable:
installed, or on ``PYTHONPATH``).

For the MoE layers of Qwen3-30B-A3B (128 experts, top 8, hidden 2048, intermediate 768) and
Qwen3.5-35B-A3B (256 experts, top 8, hidden 2048, intermediate 512), e4m3fn experts in 128 x 128
blocks with random scales, fp16 activations and a random router (each token's top 8 of softmax
scores), one run times, side by side, the routed blocks (routing, gate/up with the SiLU product,
down with the router-weighted sum) through :func:`volta_fp8w.experts.experts_forward`:

* ``triton``: the Triton routed blocks (``path="blocks"``, the table's tile for this GPU:
  ``tl.dot``, on the tensor cores from SM80, on the FMA units on a V100);
* ``mma``: the CUDA tensor-core GEMM a V100 takes (``path="mma"``, ``mma.m8n8k4``), built as
  this GPU's own cubin (on a Hopper GPU ``mma.m8n8k4`` is legal and slow: its time there says
  little about a V100's); with ``--ptx70`` also its compute_70 PTX JIT-compiled by the driver
  (``mma_ptx70``; needs a CUDA 12 NVRTC).

Each path first runs once into poisoned buffers and is checked against the float64 sum on the
dequantized experts (``max|out - ref| / max|ref|``); the table marks a wrong one. Timing is the
harness's (:func:`volta_devkit.bench.time_cuda_graph`): calls back to back in one captured CUDA
graph, median of several replays; the experts (600 and 800 MB) exceed the L2 cache, so no
copies rotate. Per row also the SM70 estimate of both kernels, dispatch's cost
(:func:`volta_fp8w.dispatch.expert_launch_cost`) at :data:`volta_core.kernel_api.V100_RATES`,
and their ratio (issue 51's target: at most 0.2 at 2048 tokens).

Writes ``DIR/fp8w_moe_bench.json`` and ``DIR/fp8w_moe_bench.md``; prints the table last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

#: name: (experts, top_k, hidden, moe intermediate), the models' config.json.
LAYERS = {"Qwen3-30B-A3B": (128, 8, 2048, 768), "Qwen3.5-35B-A3B": (256, 8, 2048, 512)}
MS = (2048,)
#: The checkpoints' weight block (Qwen's FP8 releases).
BLOCK = (128, 128)
#: Graph replays per timing (the median is reported).
REPLAYS = 7
#: Largest ``max|out - ref| / max|ref|`` a path may have: fp16 gate/up rows, fp32 sums.
TOLERANCE = 1e-2
#: A random e4m3fn code's RMS (every finite code alike): the scales divide it out.
CODE_RMS = 42.0


def random_layer(name: str, seed: int) -> tuple[Any, dict[str, torch.Tensor]]:
    """One layer's experts on CUDA in the kernels' layout (through
    :func:`volta_fp8w.experts.stack_experts`, the loader's path), and the checkpoint tensors
    the reference dequantizes: random finite codes, 128 x 128 block scales making each weight's
    RMS about ``1 / sqrt(inputs)``."""
    from volta_fp8w.experts import ExpertWeights, stack_experts

    experts, _, hidden, inter = LAYERS[name]
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def codes(n: int, k: int) -> torch.Tensor:
        c = torch.randint(0, 256, (experts, n, k), generator=gen, device="cuda", dtype=torch.uint8)
        c[(c & 0x7F) == 0x7F] -= 1  # no NaN codes
        return c

    def scales(n_blocks: int, k: int) -> torch.Tensor:
        shape = (experts, n_blocks, -(-k // BLOCK[1]))
        spread = 2.0 ** (torch.rand(shape, generator=gen, device="cuda") * 2 - 1)
        return spread / (CODE_RMS * math.sqrt(k))

    c13, c2 = codes(2 * inter, hidden), codes(hidden, inter)
    s13 = scales(2 * -(-inter // BLOCK[0]), hidden)
    s2 = scales(-(-hidden // BLOCK[0]), inter)
    w13 = stack_experts(
        f"{name} (w13)", c13, s13, n=2 * inter, k=hidden, strategy="block", block=BLOCK,
        shards=(inter, inter),
    )  # fmt: skip
    w2 = stack_experts(f"{name} (w2)", c2, s2, n=hidden, k=inter, strategy="block", block=BLOCK)
    return ExpertWeights(w13, w2), {"c13": c13, "s13": s13, "c2": c2, "s2": s2}


def _dense(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """One expert's float64 weights: codes times their block's scale."""
    n, k = codes.shape
    full = scales.double().repeat_interleave(BLOCK[0], 0)[:n].repeat_interleave(BLOCK[1], 1)
    return codes.view(torch.float8_e4m3fn).double() * full[:, :k]


def reference(
    tensors: dict[str, torch.Tensor], x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """float64 ``sum_s w * down(SiLU(gate(x)) * up(x))``, one expert at a time."""
    m, top_k = ids.shape
    inter = tensors["c2"].shape[2]
    flat, rw = ids.reshape(-1).long(), w.reshape(-1).double()
    out = torch.zeros(m, tensors["c2"].shape[1], dtype=torch.float64, device=x.device)
    for e in flat.unique().tolist():
        pairs = (flat == e).nonzero().squeeze(1)
        tokens = pairs // top_k
        gate = _dense(tensors["c13"][e, :inter], tensors["s13"][e, : -(-inter // BLOCK[0])])
        up = _dense(tensors["c13"][e, inter:], tensors["s13"][e, -(-inter // BLOCK[0]) :])
        xe = x[tokens].double()
        act = torch.nn.functional.silu(xe @ gate.T) * (xe @ up.T)
        y = act @ _dense(tensors["c2"][e], tensors["s2"][e]).T
        out.index_add_(0, tokens, y * rw[pairs, None])
    return out


def routing(m: int, experts: int, top_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top ``top_k`` of softmax scores, renormalized, and int32 ids."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(m, experts, generator=gen, device="cuda")
    w, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


def sm70_estimates(name: str, m: int) -> dict[str, Any]:
    """Dispatch's SM70 cost of the tensor cores and of the FMA Triton routed blocks for ``m``
    tokens of layer ``name``, in ms, with the tensor cores' ratio and bound."""
    from volta_core.kernel_api import V100_RATES
    from volta_fp8w.dispatch import PRICING_BLOCK, expert_choice, expert_launch_cost

    experts, top_k, hidden, inter = LAYERS[name]
    choice = expert_choice(m, m * top_k, experts, (7, 0), (hidden, inter))
    triton = choice.fallback or choice
    args = (m, hidden, inter, experts, top_k, PRICING_BLOCK)
    mma = expert_launch_cost(choice, *args)
    fma = expert_launch_cost(triton, *args)
    return {
        "v100_kernel": choice.kernel,
        "v100_mma_ms": mma.seconds(V100_RATES) * 1e3,
        "v100_fma_ms": fma.seconds(V100_RATES) * 1e3,
        "v100_ratio": mma.seconds(V100_RATES) / fma.seconds(V100_RATES),
        "v100_bound": mma.bound(V100_RATES),
    }


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max|out - ref| / max|ref|``, infinite where ``out`` is not finite."""
    o = out.double()
    if not bool(torch.isfinite(o).all()):
        return math.inf
    return float((o - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def measure(name: str, m: int, paths: Sequence[str]) -> dict[str, Any]:
    """One layer at ``m`` tokens: each path checked once into poisoned buffers, then timed."""
    from volta_core.kernel_api import time_cuda_graph
    from volta_fp8w import experts as experts_module
    from volta_fp8w.experts import experts_forward

    experts, top_k, hidden, _ = LAYERS[name]
    weights, tensors = random_layer(name, seed=m + experts)
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, hidden, generator=gen, device="cuda").half()
    w, ids = routing(m, experts, top_k, seed=m)
    ref = reference(tensors, x, w, ids)
    row: dict[str, Any] = {"layer": name, "m": m, **sm70_estimates(name, m)}
    options: dict[str, dict[str, Any]] = {
        "triton": {"path": "blocks"},
        "mma": {"path": "mma"},
        "mma_ptx70": {"path": "mma", "ptx_arch": "compute_70"},
    }
    empty = experts_module._empty

    def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Any:
        t = empty(shape, dtype, device)
        return t.fill_(float("nan") if t.is_floating_point() else -1)

    for path in paths:
        kw = options[path]

        def step(kw: dict[str, Any] = kw) -> torch.Tensor:
            return experts_forward(x, weights, w, ids, **kw)

        try:
            experts_module._empty = poisoned
            try:
                err = rel_error(step(), ref)
            finally:
                experts_module._empty = empty
            row[f"{path}_err"] = err
            row[f"{path}_ms"] = time_cuda_graph(step, [()], replays=REPLAYS).median_ms
        except Exception as exc:  # a path that cannot build here (no CUDA 12 NVRTC) is noted
            row[f"{path}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return row


def _ms(row: dict[str, Any], path: str) -> str:
    if f"{path}_error" in row:
        return "err"
    if f"{path}_ms" not in row:
        return "-"
    wrong = "" if row[f"{path}_err"] <= TOLERANCE else " WRONG"
    return f"{row[f'{path}_ms']:.3f}{wrong}"


def columns(paths: Sequence[str]) -> list[tuple[str, Callable[[dict[str, Any]], str]]]:
    """The table's columns: the layer, the tokens, each path's ms (and its speed over the
    Triton routed blocks), and the SM70 estimates."""
    cols: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("layer", lambda r: r["layer"]),
        ("M", lambda r: str(r["m"])),
    ]
    for path in paths:
        cols.append((f"{path} ms", lambda r, p=path: _ms(r, p)))
        if path != "triton":
            cols.append(
                (
                    f"{path} x",
                    lambda r, p=path: (
                        f"{r['triton_ms'] / r[f'{p}_ms']:.2f}x"
                        if "triton_ms" in r and f"{p}_ms" in r
                        else "-"
                    ),
                )
            )
    cols += [
        ("SM70 mma ms", lambda r: f"{r['v100_mma_ms']:.3f}"),
        ("SM70 FMA ms", lambda r: f"{r['v100_fma_ms']:.3f}"),
        ("SM70 ratio", lambda r: f"{r['v100_ratio']:.3f}"),
    ]
    return cols


def table(rows: Sequence[dict[str, Any]], paths: Sequence[str]) -> str:
    """The rows as a markdown table."""
    cols = columns(paths)
    lines = [
        "| " + " | ".join(name for name, _ in cols) + " |",
        "| " + " | ".join("---" for _ in cols) + " |",
    ]
    lines += ["| " + " | ".join(fn(row) for _, fn in cols) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and .md")
    parser.add_argument("--ms", help="token counts, comma-separated (default 2048)")
    parser.add_argument("--ptx70", action="store_true", help="also the compute_70 PTX build")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the MoE benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    ms = tuple(int(v) for v in args.ms.split(",")) if args.ms else MS
    paths = ("triton", "mma", "mma_ptx70") if args.ptx70 else ("triton", "mma")
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    rows = []
    for name in LAYERS:
        for m in ms:
            rows.append(measure(name, m, paths))
            torch.cuda.empty_cache()  # the layer's experts are freed with measure's frame
            print(json.dumps(rows[-1], default=str), flush=True)
    errors = [f"{r['layer']} M={r['m']} {p}: {r[p + '_error']}" for r in rows for p in paths
              if p + "_error" in r]  # fmt: skip
    wrong = [f"{r['layer']} M={r['m']} {p}" for r in rows for p in paths
             if r.get(f"{p}_err", 0.0) > TOLERANCE]  # fmt: skip
    summary = "checks: " + ("WRONG: " + ", ".join(wrong) if wrong else "all paths correct")
    md = "\n".join(
        [
            f"# fp8w MoE prefill benchmark, {device}",
            "",
            f"- torch {torch.__version__}, CUDA {torch.version.cuda}; ms per call (graph replays)",
            "- SM70: dispatch's V100 estimate of the tensor cores (mma) and the FMA Triton kernel",
            *(f"- error: {e}" for e in errors),
            f"- {summary}",
            "",
            table(rows, paths),
            "",
        ]
    )
    (args.out / "fp8w_moe_bench.md").write_text(md)
    record = {"device": device, "tolerance": TOLERANCE, "rows": rows, "summary": summary}
    (args.out / "fp8w_moe_bench.json").write_text(json.dumps(record, indent=1, default=str))
    print(f"fp8w_moe_bench on {device}")
    print(md)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
