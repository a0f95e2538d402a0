"""Probe (H100): the decode kernel at four commits, timed in one call, outputs compared.

The commits, each checked out (``git archive``) into its own directory and run in its own
process with that directory's ``core/src`` and ``plugins/attn_v100/src`` on ``PYTHONPATH``:

* ``v0``: the shipped kernel (98eaba5);
* ``v1``: the masked tiles on one stage in split launches whose partitions hold at most 4096
  keys (``configs.one_stage_tail``);
* ``v2``: v1 with the page size a constexpr;
* ``v3``: v2 with the soft-cap a constexpr.

Each worker times the benchmark's decode shapes (``bench.decode_case``: one CUDA graph,
rotating inputs past L2) and two prefill shapes, and saves the outputs of seeded calls with a
window, a soft-cap, sinks and speculative queries; the driver runs the workers twice in
alternating order, printing after each round each row's best and every output against
v0's.

Run from the repository root: python3 docs/perf/attn_v100/constexpr_tail/probe_versions.py
OUTDIR LABEL=DIR [LABEL=DIR ...] (the first label is the reference).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DECODE = [
    (batch, ctx, heads)
    for heads in ((32, 8), (64, 8))
    for batch, ctx in ((1, 8192), (1, 1024), (1, 32768), (8, 8192), (16, 8192), (32, 16384),
                       (64, 4096))
]  # fmt: skip
PREFILL = (512, 2048)
#: Seeded calls whose outputs are compared across versions: (name, batch, context, q_len,
#: window, soft-cap, sinks, KV dtype).
CHECKS = [
    ("plain_1x8000", 1, 8000, 1, None, 0.0, False, "float16"),
    ("window_1x8000", 1, 8000, 1, 1000, 0.0, False, "float16"),
    ("softcap_4x3000", 4, 3000, 1, None, 30.0, False, "float16"),
    ("spec_window_sinks_3x5000", 3, 5000, 4, 700, 0.0, True, "float16"),
    ("fp8_spec_softcap_2x9000", 2, 9000, 3, None, 50.0, False, "fp8_e5m2"),
    ("fp8_window_32x2000", 32, 2000, 1, 300, 0.0, True, "fp8_e5m2"),
]


def worker(label: str, outdir: Path) -> None:
    import torch

    from volta_attn_v100 import bench
    from volta_attn_v100.ops import paged_attention

    copy_bw = bench.copy_bandwidth()
    rows = []
    for batch, ctx, (heads, kv_heads) in DECODE:
        for kv_dtype in ("float16", "fp8_e5m2"):
            r = bench.decode_case(batch, ctx, heads, kv_heads, kv_dtype, copy_bw)
            rows.append(
                {
                    "case": f"decode {heads}/{kv_heads} {batch}x{ctx} {kv_dtype}",
                    "us": r["ms"] * 1e3,
                    "copy": r["fraction_of_copy"],
                    "splits": r["splits"],
                }
            )
            print(label, json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()
    for seq_len in PREFILL:
        r = bench.prefill_case(seq_len)
        rows.append({"case": f"prefill 16K in {seq_len}", "us": r["ms"] * 1e3})
        print(label, json.dumps(rows[-1]), flush=True)
    (outdir / f"rows_{label}_{os.getpid()}.json").write_text(json.dumps(rows))
    outs = {}
    for name, batch, ctx, q_len, window, softcap, sinks, kv_dtype in CHECKS:
        torch.manual_seed(7)
        q, kv, table, seq_lens, q_start = bench.make_decode_inputs(
            batch, ctx, 32, 8, kv_dtype, q_len=q_len
        )
        out = torch.full_like(q, float("nan"))
        paged_attention(
            q, kv, table, seq_lens, q_start, out,
            max_query_len=q_len, max_seq_len=ctx, sm_scale=128**-0.5, kv_cache_dtype=kv_dtype,
            sliding_window=window, logits_soft_cap=softcap,
            sinks=torch.randn(32, device="cuda") if sinks else None,
            k_scale=0.5 if kv_dtype != "float16" else None,
            v_scale=0.25 if kv_dtype != "float16" else None,
        )  # fmt: skip
        torch.cuda.synchronize()
        outs[name] = out.cpu()
    torch.save(outs, outdir / f"outs_{label}.pt")


def report(outdir: Path, labels: list[str]) -> None:
    """Each row's best time per version so far, and every output against the first's."""
    import torch

    best: dict[str, dict[str, dict]] = {}
    for path in sorted(outdir.glob("rows_*.json")):
        label = path.name.split("_")[1]
        for row in json.loads(path.read_text()):
            cell = best.setdefault(row["case"], {})
            if label not in cell or row["us"] < cell[label]["us"]:
                cell[label] = row
    ref = labels[0]
    print("== outputs against", ref, "(max |diff|; nan counts)")
    want = torch.load(outdir / f"outs_{ref}.pt")
    for label in labels[1:]:
        got = torch.load(outdir / f"outs_{label}.pt")
        for name, w in want.items():
            g = got[name]
            diff = (g.float() - w.float()).abs().max().item()
            print(f"{label} {name}: {diff:.3e} nan {int(g.isnan().sum())}/{int(w.isnan().sum())}")
    print("== us (best run); % of copy for decode; x", ref)
    print("case | " + " | ".join(labels))
    for case, cell in best.items():
        base = cell[ref]["us"]
        parts = []
        for label in labels:
            row = cell.get(label)
            if row is None:
                parts.append("-")
                continue
            pct = f" {100 * row['copy']:.1f}%" if "copy" in row else ""
            parts.append(f"{row['us']:8.2f}{pct} {row['us'] / base:.3f}x")
        print(f"{case} | " + " | ".join(parts), flush=True)


def main() -> int:
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], Path(sys.argv[3]))
        return 0
    outdir = Path(sys.argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    versions = dict(arg.split("=", 1) for arg in sys.argv[2:])
    for round_no in (1, 2):
        for label, root in versions.items():
            env = dict(os.environ)
            env["PYTHONPATH"] = f"{root}/core/src:{root}/plugins/attn_v100/src"
            subprocess.run(
                [sys.executable, __file__, "--worker", label, str(outdir)], env=env, check=True
            )
        print(f"\n==== after round {round_no}")
        report(outdir, list(versions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
