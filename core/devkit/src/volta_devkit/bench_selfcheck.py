"""The harness checks itself: its copy ceiling against a plain torch copy, and a real kernel.

Run on a GPU with ``python -m volta_devkit.bench_selfcheck --out DIR``. Besides the
ordinary suite (the example RMSNorm kernel against torch's ``rms_norm`` and the copy ceiling),
it times a plain device-to-device ``torch`` copy in the simplest way, apart from the harness
(host clock around many back-to-back copies, synchronized at both ends), and prints the
harness's copy bandwidth, the plain figure and their ratio last. Issue 3 asks for the two to
agree within 15%.

The graph timer (:func:`volta_devkit.bench.time_cuda_graph`) is checked the same way: on
the largest shape, where a launch's latency is negligible beside the kernel, the kernel's time
inside a graph must agree with its eager time within the same 15%; on the smallest shape the
graph time shows how much of the eager figure was launch latency.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from volta_devkit.bench import COPY_BYTES, Case, format_table, run_suite

#: Agreement issue 3 asks for between the harness's copy figure and a plain torch copy.
COPY_AGREEMENT = 0.15

SHAPES = ((4096, 4096), (4096, 8192), (16384, 5120), (32, 8192))
#: Shapes also timed inside a CUDA graph: the largest (graph and eager must agree) and the
#: smallest (launch latency shows).
GRAPHED = ((16384, 5120), (32, 8192))


def _graph_name(rows: int, cols: int) -> str:
    return f"example rms_norm [{rows}x{cols}] in a CUDA graph"


def cases() -> Iterable[Case]:
    """RMSNorm (fp16) of the example kernel and of torch at LLM sizes."""
    import torch

    from volta_devkit.example import rms_norm

    for rows, cols in SHAPES:

        def make_inputs(rows: int = rows, cols: int = cols) -> tuple[Any, ...]:
            x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
            w = torch.rand(cols, device="cuda", dtype=torch.float16) + 0.5
            return x, w

        moved = (2 * rows * cols + cols) * 2  # read x and w, write out (fp16)
        shape = {"rows": rows, "cols": cols, "dtype": "float16"}
        torch_name = f"torch rms_norm [{rows}x{cols}]"
        yield Case(
            torch_name,
            lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[1],), w, 1e-6),
            make_inputs,
            bytes_moved=moved,
            shape=shape,
        )
        yield Case(
            f"example rms_norm [{rows}x{cols}]",
            lambda x, w: rms_norm(x, w, 1e-6),
            make_inputs,
            bytes_moved=moved,
            shape=shape,
            baseline=torch_name,
        )
        if (rows, cols) in GRAPHED:
            yield Case(
                _graph_name(rows, cols),
                lambda x, w: rms_norm(x, w, 1e-6),
                make_inputs,
                bytes_moved=moved,
                shape=shape,
                baseline=f"example rms_norm [{rows}x{cols}]",
                graphed=True,
            )


def plain_torch_copy_gbps(nbytes: int = COPY_BYTES, copies: int = 200) -> float:
    """Device-to-device copy bandwidth with no harness: host clock around ``copies`` copies."""
    import torch

    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(5):
        dst.copy_(src)
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(copies):
        dst.copy_(src)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - begin) / copies
    return 2 * nbytes / seconds / 1e9


def main(out: Path | str) -> dict[str, Any]:
    out = Path(out)
    record = run_suite("volta_devkit.bench_selfcheck", cases(), out)
    harness = record["ceilings"]["copy_gbps"]
    plain = plain_torch_copy_gbps()
    ratio = harness / plain
    by_name = {r["name"]: r for r in record["results"]}
    rows, cols = GRAPHED[0]
    graph_vs_eager = by_name[_graph_name(rows, cols)]["speedup"]
    check = {
        "harness_copy_gbps": harness,
        "plain_torch_copy_gbps": plain,
        "ratio": ratio,
        "within": COPY_AGREEMENT,
        "agrees": abs(ratio - 1.0) <= COPY_AGREEMENT,
        "graph_over_eager_speed_largest": graph_vs_eager,
        "graph_agrees": abs(graph_vs_eager - 1.0) <= COPY_AGREEMENT,
        "environment": record["environment"],
    }
    (out / "copy_selfcheck.json").write_text(json.dumps(check, indent=2) + "\n")
    print(format_table(record))
    print(
        f"copy bandwidth: harness {harness:.1f} GB/s, plain torch copy {plain:.1f} GB/s, "
        f"ratio {ratio:.3f} ({'within' if check['agrees'] else 'NOT within'} "
        f"{COPY_AGREEMENT:.0%})",
        flush=True,
    )
    print(
        f"graph timer on [{rows}x{cols}]: eager time / graph time {graph_vs_eager:.3f} "
        f"({'within' if check['graph_agrees'] else 'NOT within'} {COPY_AGREEMENT:.0%})",
        flush=True,
    )
    return check


def _cli() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    check = main(parser.parse_args().out)
    return 0 if check["agrees"] and check["graph_agrees"] else 1


if __name__ == "__main__":
    raise SystemExit(_cli())
