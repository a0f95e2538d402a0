"""Run 16 call 2: the split count itself, on the table's launches (atomic split sums).

Call 1 (``probe_splits.py``) moved the split count through ``programs_per_sm``, which moves
it in coarse steps. Here the count is set directly: ``configs.split_count`` is replaced, for
one timing at a time, by one that returns ``splits`` (the input steps of each split rounded
up, as the real one does). For every benchmark shape, int4 group 128, both symmetries, at 1,
4 and 16 tokens, each count's launch is checked against ``x @ dequant(W).T`` (twice: the
accumulators must be zero again after the first) and timed as in call 1 (best of two
alternating runs inside one CUDA graph); fp16 cuBLAS beside them. Token counts on the command
line replace 1, 4 and 16 (call 3: 32, after the table's count became
``configs.balanced_splits``'s).
Run from the repository root with PYTHONPATH=core/src:plugins/ct_wna16/src.
"""

from __future__ import annotations

import sys

import torch

from volta_core.kernels.bench import time_cuda_graph
from volta_ct_wna16 import configs
from volta_ct_wna16.bench import SHAPES, weights
from volta_ct_wna16.ops import dequantize_dense, wna16_linear

REPLAYS = 7
MS = (1, 4, 16)
_real_split_count = configs.split_count


def forced(splits: int):
    """A ``split_count`` that cuts the input into ``splits`` (fewer where steps run out)."""

    def split_count(n, k, launch, sm_count, m=1):
        k_blocks = -(-k // launch.block_k)
        per_split = -(-k_blocks // min(splits, k_blocks)) * launch.block_k
        return -(-k // per_split), per_split

    return split_count


def counts(n: int, k: int, launch: configs.Launch, sms: int, m: int) -> list[int]:
    """Every distinct split count from the table's down to a third and up to three times."""
    k_blocks = -(-k // launch.block_k)
    shipped = _real_split_count(n, k, launch, sms, m)[0]
    seen = []
    for steps in range(1, k_blocks + 1):
        s = -(-k_blocks // steps)
        if shipped // 3 <= s <= 3 * shipped and s not in seen:
            seen.append(s)
    return sorted(seen)


def timed(x, pws, outs, launch) -> float:
    return (
        time_cuda_graph(
            lambda i: wna16_linear(x, pws[i], launch=launch, out=outs[i % 2]),
            [(i,) for i in range(len(pws))],
            replays=REPLAYS,
        ).median_ms
        * 1e3
    )


def layer_lines(n: int, k: int, sym: bool, sms: int, ms: tuple[int, ...]) -> list[str]:
    pws = weights(n, k, sym, max(2, min(8, -(-(256 << 20) // (n * k // 2)))))
    dense = [dequantize_dense(p, torch.float16).t().contiguous() for p in pws[:2]]
    cap = torch.cuda.get_device_capability()
    lines = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(2)]
        launch = configs.choose(m, n, cap, 4)
        shipped = _real_split_count(n, k, launch, sms, m)[0]
        cs = counts(n, k, launch, sms, m)
        ref = (x.double() @ dense[0].double().t()).float()
        for s in cs:
            configs.split_count = forced(s)
            for _ in range(2):
                got = wna16_linear(x, pws[0], launch=launch)
                err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
                assert err < 5e-3, (n, k, sym, m, s, err)
        configs.split_count = _real_split_count
        fp16 = (
            time_cuda_graph(
                lambda i, x=x, outs=outs: torch.matmul(x, dense[i].t(), out=outs[i]),
                [(0,), (1,)],
                replays=REPLAYS,
            ).median_ms
            * 1e3
        )
        times: dict[int, list[float]] = {s: [] for s in cs}
        for _ in range(2):
            for s in cs:
                configs.split_count = forced(s)
                times[s].append(timed(x, pws, outs, launch))
        configs.split_count = _real_split_count
        best = min(times, key=lambda s: min(times[s]))
        line = (
            f"{n:>6}x{k:<6}{'y' if sym else 'n':>2}{m:>4} table {shipped:>3} best {best:>3}  "
            + "  ".join(f"{s}{'*' if s == shipped else ''}:{min(t):.1f}" for s, t in times.items())
            + f"  fp16 {fp16:6.1f}"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def main() -> int:
    ms = tuple(int(a) for a in sys.argv[1:]) or MS
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    lines = []
    for n, k in SHAPES:
        for sym in (True, False):
            lines += layer_lines(n, k, sym, sms, ms)
            torch.cuda.empty_cache()
    print("\n== us by split count (* the table's), best of two alternating runs")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
