"""One tensor-parallel rank: column, row, merged and QKV layers against the float64 reference.

Run by ``test_vllm_linear.py`` as ``tp_worker.py RANK WORLD INIT_FILE``; checks an asymmetric
group-wise int4 scheme and a channel-wise int8 one (whose scales every row-parallel rank keeps
whole).
Each rank loads the whole checkpoint tensors (vLLM's loaders take its slice) and checks its
own output: column-parallel layers give the rank's rows of every shard, row-parallel layers
the all-reduced whole.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import _vllm_layers as vl
from ct_wna16_checkpoints import library_checkpoint, quantization_config

from volta_ct_wna16.layout import dequantize
from volta_ct_wna16.scheme import WeightScheme
from volta_devkit.testing import rel_error

K = 256
SIZES = {"column": [48], "row": [40], "merged": [48, 48], "qkv": [64, 32, 32]}


def dense(ckpt) -> torch.Tensor:
    return dequantize(ckpt.packed("ref"))


def main() -> None:
    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    with vl.vllm_process(rank, world, init):
        torch.manual_seed(123)  # the same activations on both ranks
        x = torch.randn(3, K).half()
        for scheme in (WeightScheme(4, False, 32), WeightScheme(8, False, None)):
            check(scheme, rank, world, x)
    print("TP-OK", flush=True)


def check(scheme: WeightScheme, rank: int, world: int, x: torch.Tensor) -> None:
    raw = quantization_config(scheme)
    for kind, sizes in SIZES.items():
        layer = vl.build(kind, sizes, K, raw, bias=False)
        shards = [library_checkpoint(n, K, scheme, seed=7 + i) for i, n in enumerate(sizes)]
        vl.load(layer, shards, None)
        if kind == "row":  # input_is_parallel: each rank gets its slice of the features
            out, _ = layer(x[:, rank * K // world : (rank + 1) * K // world])
        else:
            out, _ = layer(x)
        if kind == "row":
            want = x.double() @ dense(shards[0]).t()
        else:
            parts = []
            for ckpt, n in zip(shards, sizes, strict=True):
                part = n // world
                parts.append(dense(ckpt)[rank * part : (rank + 1) * part])
            want = x.double() @ torch.cat(parts).t()
        err = rel_error(out, want)
        print(f"rank {rank} {kind} {scheme.label}: relative error {err:.2e}", flush=True)
        assert err < 2e-3, (kind, err)


if __name__ == "__main__":
    main()
