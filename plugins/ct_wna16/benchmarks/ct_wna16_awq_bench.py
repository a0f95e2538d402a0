"""AWQ checkpoints through ct_wna16 against vLLM's own Triton AWQ kernels, side by side:
``python plugins/ct_wna16/benchmarks/ct_wna16_awq_bench.py --out DIR --peer AWQ_TRITON_PY``.

``AWQ_TRITON_PY`` is ``vllm/model_executor/layers/quantization/awq_triton.py`` from a vLLM
wheel (it imports only ``vllm.triton_utils``, which is stood in by Triton itself here, so no
vLLM install is needed on the GPU machine). For each shape (N, K), int4 group 128 with zero
points (AWQ's only scheme), fresh random AWQ tensors (``qweight`` ``[K, N / 8]`` in AutoAWQ's
interleaved order, packed ``qzeros``, fp16 scales) are made, and:

* correctness first: the plugin's output (repack by :func:`volta_ct_wna16.repack.awq_weights`,
  then :func:`volta_ct_wna16.ops.wna16_linear`, poisoned output) against ``x @ W`` in float64
  where ``W`` is dequantized by vLLM's own ``awq_dequantize_triton`` from the checkpoint
  tensors, at every M timed;
* then times, each in one captured CUDA graph with rotating weight copies (more bytes than the
  L2): ours; vLLM's AWQ path as its ``AWQLinearMethod`` runs it with Triton (``awq_gemm_triton``,
  split-K 8, below 256 tokens; ``awq_dequantize_triton`` then ``torch.matmul`` from 256 on,
  vLLM's heuristic); fp16 cuBLAS on the dequantized weight.

Writes ``DIR/ct_wna16_awq_bench.json``; prints the table last.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import types
from pathlib import Path
from typing import Any

import torch

from volta_ct_wna16 import __version__
from volta_ct_wna16.ops import wna16_linear
from volta_ct_wna16.repack import awq_weights
from volta_ct_wna16.weight_scheme import Packing, WeightScheme
from volta_devkit.bench import measure_copy_bandwidth, time_cuda_graph
from volta_devkit.testing import poison_

SHAPES = ((5120, 5120), (27648, 5120), (5120, 27648), (7168, 5120))
MS = (1, 4, 16, 64, 256, 2048)
SCHEME = WeightScheme(4, False, 128, Packing.AWQ)
ROTATE_BYTES = 256 << 20
MAX_COPIES = 8
REPLAYS = 7
#: vLLM's AWQ method dequantizes and calls cuBLAS from this many tokens on (``awq.py``).
PEER_DEQUANT_FROM = 256
#: fp16 outputs of fp32-accumulated sums against the float64 product.
TOLERANCE = 2e-3


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


def awq_tensors(n: int, k: int, seed: int) -> dict[str, torch.Tensor]:
    """Fresh random AWQ tensors of one layer (any int32 words are valid packed nibbles)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    groups = k // SCHEME.group_for(k)

    def words(rows: int) -> torch.Tensor:
        return torch.randint(
            -(2**31), 2**31 - 1, (rows, n // 8), generator=gen, device="cuda", dtype=torch.int32
        )

    scales = (torch.rand(groups, n, generator=gen, device="cuda") * 2e-3 + 1e-3).half()
    return {"qweight": words(k), "qzeros": words(groups), "scales": scales}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).abs().max() / ref.abs().max())


def measure(n: int, k: int, peer: Any) -> list[dict[str, Any]]:
    copies = max(2, min(MAX_COPIES, -(-ROTATE_BYTES // (n * k // 2))))
    ckpts = [awq_tensors(n, k, seed) for seed in range(copies)]
    ours = [
        awq_weights("bench", SCHEME, n=n, k=k, act_dtype=torch.float16, **t).weights for t in ckpts
    ]
    fp16_copies = max(1, min(MAX_COPIES, -(-ROTATE_BYTES // (n * k * 2))))
    dense = [
        peer.awq_dequantize_triton(t["qweight"], t["scales"], t["qzeros"])
        for t in ckpts[:fp16_copies]
    ]
    rows = [row(m, ckpts, ours, dense, peer) for m in MS]
    torch.cuda.empty_cache()
    return rows


def _timed(fn: Any, count: int) -> float:
    """Microseconds per call inside one captured CUDA graph, cycling ``count`` weight copies."""
    return time_cuda_graph(fn, [(i,) for i in range(count)], replays=REPLAYS).median_ms * 1e3


def row(
    m: int,
    ckpts: list[dict[str, torch.Tensor]],
    ours: list[Any],
    dense: list[torch.Tensor],
    peer: Any,
) -> dict[str, Any]:
    """One token count: correctness against vLLM's dequantization, then the three times."""
    k, n = dense[0].shape
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    ref = x.double() @ dense[0].double()
    out = poison_(torch.empty(m, n, device="cuda", dtype=torch.float16))
    wna16_linear(x, ours[0], out=out)
    error = rel_error(out, ref)
    outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(2)]

    def vllm(i: int) -> torch.Tensor:
        t = ckpts[i]
        if m < PEER_DEQUANT_FROM:
            return peer.awq_gemm_triton(x, t["qweight"], t["scales"], t["qzeros"], 8)
        w = peer.awq_dequantize_triton(t["qweight"], t["scales"], t["qzeros"])
        return torch.matmul(x, w, out=outs[i % 2])

    peer_error = rel_error(vllm(0), ref)
    ours_us = _timed(lambda i: wna16_linear(x, ours[i], out=outs[i % 2]), len(ours))
    peer_us = _timed(vllm, len(ckpts))
    fp16_us = _timed(lambda i: torch.matmul(x, dense[i], out=outs[i % 2]), len(dense))
    return {
        "n": n,
        "k": k,
        "m": m,
        "ours_us": ours_us,
        "vllm_awq_us": peer_us,
        "fp16_us": fp16_us,
        "vs_vllm": peer_us / ours_us,
        "vs_fp16": fp16_us / ours_us,
        "ours_rel_error": error,
        "vllm_rel_error": peer_error,
        "correct": error < TOLERANCE,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'N x K':>13} {'M':>5} {'ours us':>9} {'vLLM AWQ us':>12} {'fp16 us':>9} "
        f"{'x vLLM':>7} {'x fp16':>7} {'err':>8} ok"
    ]
    for r in rows:
        lines.append(
            f"{r['n']:>6}x{r['k']:<6} {r['m']:>5} {r['ours_us']:>9.1f} {r['vllm_awq_us']:>12.1f} "
            f"{r['fp16_us']:>9.1f} {r['vs_vllm']:>7.2f} {r['vs_fp16']:>7.2f} "
            f"{r['ours_rel_error']:>8.1e} {'yes' if r['correct'] else 'NO'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--peer", type=Path, required=True, help="vLLM's awq_triton.py")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    peer = load_peer(args.peer)
    import triton

    rows: list[dict[str, Any]] = []
    for n, k in SHAPES:
        rows += measure(n, k, peer)
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
        },
        "copy_bandwidth_gbps": measure_copy_bandwidth()[0],
        "rows": rows,
    }
    (args.out / "ct_wna16_awq_bench.json").write_text(json.dumps(result, indent=1))
    print(f"{result['device']}, torch {torch.__version__}, Triton {triton.__version__}")
    print(table(rows))
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
