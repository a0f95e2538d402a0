"""Probe (H100, under ``compute-sanitizer --tool racecheck``): which fp8 decode launches write
one shared-memory address with different values from several threads.

``python race_probe.py N`` runs variant ``N`` of :data:`VARIANTS` once (KV heads per program,
query/KV heads, sequences as (query tokens, context), partitions, scores ahead), each in its own
sanitizer process so a hazard is attributed to one launch. Run from the repository root with
PYTHONPATH=<root>/core/src:<root>/plugins/attn_v100/src:<root>/plugins/attn_v100/tests.
"""

from __future__ import annotations

import sys

import torch
from attn_v100_cases import make_case

from volta_attn_v100 import ops

VARIANTS = (
    (4, (8, 4), [(1, 300), (2, 33)], 1, True),
    (4, (8, 4), [(1, 300), (2, 33)], 3, True),
    (4, (8, 4), [(1, 300), (1, 33)], 1, True),
    (4, (8, 4), [(1, 300), (2, 33)], 1, False),
    (2, (16, 4), [(1, 300), (2, 33)], 1, True),
    (1, (16, 2), [(1, 300), (2, 33)], 1, True),
    (1, (16, 2), [(1, 300), (2, 33)], 3, True),
    (2, (8, 4), [(1, 300), (2, 33)], 1, True),
)


def main(index: int) -> None:
    kv_per_prog, (heads, kv_heads), lens, splits, ahead = VARIANTS[index]
    ops.kv_heads_per_program = lambda *args: kv_per_prog
    ops.scores_ahead = lambda *args: ahead
    case = make_case(
        lens,
        head_size=128,
        num_heads=heads,
        num_kv_heads=kv_heads,
        kv_cache_dtype="fp8_e5m2",
        scales="head",
        sinks=True,
        device="cuda",
    )
    out = torch.full_like(case.query, float("nan"))
    ops.paged_attention(*case.tensors(), out, **case.kwargs(), path="decode", num_splits=splits)
    torch.cuda.synchronize()
    print(f"variant {index} {VARIANTS[index]}: finite {bool(torch.isfinite(out).all())}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
