"""A few eager decode launches of one shape (32/8 heads, head size 128), for Nsight Compute.

``ncu -k regex:paged_decode --launch-skip 3 --launch-count 1 ... python3 ncu_decode.py BATCH
CONTEXT KV_DTYPE`` with ``PYTHONPATH=core/src:plugins/attn_v100/src`` (not shipped code).
"""

import sys

import torch

from volta_attn_v100 import bench


def main(batch: int, ctx: int, kv: str) -> None:
    torch.manual_seed(0)
    inputs = bench.make_decode_inputs(batch, ctx, 32, 8, kv)
    out = torch.empty_like(inputs[0])
    run = bench.decode_call(ctx, kv, out)
    for _ in range(4):
        run(*inputs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
