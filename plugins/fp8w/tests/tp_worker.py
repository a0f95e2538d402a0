"""One tensor-parallel rank: column, row, merged and QKV layers of every scheme against the
float64 reference, and the layers whose rank shards would cut a weight block refused.

Run by ``test_vllm_linear.py`` as ``tp_worker.py RANK WORLD INIT_FILE``. Each rank loads the
whole checkpoint tensors (vLLM's loaders take its slice: weight rows for column-parallel layers,
columns for row-parallel ones, a block scale with its weight's rows or columns, a channel scale
with its rows, a per-tensor scale whole) and checks its own output: column-parallel layers give
the rank's rows of every shard, row-parallel layers the all-reduced whole. Prints one
``relative error`` line per layer and one ``refused`` line per refused layer, then ``TP-OK``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import fp8w_checkpoints as fc
import fp8w_vllm_layers as vl

from volta_devkit.testing import rel_error
from volta_fp8w.layout import WeightFormatError

#: Block schemes: every rank's rows and inputs whole 128 x 128 blocks (K 512: 256 per rank).
BLOCK_K = 512
BLOCK_SIZES = {"column": [256], "row": [136], "merged": [256, 256], "qkv": [512, 256, 256]}
BLOCK_HEAD = 128
#: Channel and tensor schemes: any even split (K 320: 160 per rank).
ANY_K = 320
ANY_SIZES = {"column": [200], "row": [136], "merged": [200, 136], "qkv": [96, 48, 48]}
ANY_HEAD = 24

#: Layers a block scheme cannot shard over two ranks, as (kind, sizes, k): 192 inputs per rank
#: (1.5 blocks), 96 output rows per rank (the second rank's rows start inside a block).
CUT_BLOCKS = [("row", [136], 384), ("column", [192], 512), ("merged", [256, 192], 512)]


def main() -> None:
    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    # The checkpoints first: compressed-tensors' compressor spreads its work over the ranks of
    # an initialized process group, each rank here makes the whole checkpoint itself.
    for scheme in fc.SCHEMES:
        fc.config(scheme)
        for sizes in layer_sizes(scheme)[0].values():
            for i, n in enumerate(sizes):
                fc.checkpoint(scheme, n, layer_sizes(scheme)[1], seed=7 + i)
    with vl.vllm_process(rank, world, init):
        torch.manual_seed(123)  # the same activations on both ranks
        for scheme in fc.SCHEMES:
            check(scheme, rank, world)
        for scheme in ("fp8-block", "ct-block"):
            for kind, sizes, k in CUT_BLOCKS:
                refused(scheme, kind, sizes, k)
    print("TP-OK", flush=True)


def layer_sizes(scheme: str) -> tuple[dict[str, list[int]], int, int]:
    """The sizes of each kind of layer, the input length and the QKV head size."""
    if scheme.endswith("block"):
        return BLOCK_SIZES, BLOCK_K, BLOCK_HEAD
    return ANY_SIZES, ANY_K, ANY_HEAD


def check(scheme: str, rank: int, world: int) -> None:
    sizes_of, k, head = layer_sizes(scheme)
    config = vl.engine_config(fc.config(scheme))
    x = torch.randn(7, k).half()
    for kind, sizes in sizes_of.items():
        bias = kind == "qkv"
        layer = vl.build(kind, sizes, k, config, bias=bias, head=head)
        shards = [fc.checkpoint(scheme, n, k, seed=7 + i) for i, n in enumerate(sizes)]
        biases = [torch.randn(n).half() for n in sizes] if bias else None
        vl.load(layer, shards, biases)
        if kind == "row":  # input_is_parallel: each rank gets its slice of the features
            out, _ = layer(x[:, rank * k // world : (rank + 1) * k // world])
            want = x.double() @ shards[0].dense.t()
        else:
            out, _ = layer(x)
            rows, bias_rows = [], []
            for i, (ckpt, n) in enumerate(zip(shards, sizes, strict=True)):
                part = slice(rank * n // world, (rank + 1) * n // world)
                rows.append(ckpt.dense[part])
                if biases is not None:
                    bias_rows.append(biases[i][part].double())
            want = x.double() @ torch.cat(rows).t()
            if bias_rows:
                want += torch.cat(bias_rows)
        err = rel_error(out, want)
        print(f"rank {rank} {kind} {scheme}: relative error {err:.2e}", flush=True)
        assert err < 2e-3, (kind, scheme, err)


def refused(scheme: str, kind: str, sizes: list[int], k: int) -> None:
    config = vl.engine_config(fc.config(scheme))
    try:
        vl.build(kind, sizes, k, config, head=BLOCK_HEAD)
    except WeightFormatError as exc:
        print(f"refused {scheme} {kind}: {exc}", flush=True)
        return
    raise AssertionError(f"{scheme} {kind} {sizes}x{k} was built over two ranks")


if __name__ == "__main__":
    main()
