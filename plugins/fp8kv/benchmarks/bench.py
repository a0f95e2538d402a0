"""Benchmark suite of vllm-volta-fp8kv, run on a CUDA machine from the repository root::

    python plugins/fp8kv/benchmarks/bench.py --out DIR

with the plugin, the host and the devkit installed (``pip install ./core ./core/devkit
'./plugins/fp8kv[bench]'``) or on ``PYTHONPATH=core/src:core/devkit/src:plugins/fp8kv/src``.

Measures, in one run: the device's copy bandwidth (the ceiling), the cache write of 8,192 tokens
x 8 KV heads x head size 128 (e5m2 with per-tensor and per-head scales, fp16, and e5m2 through
the host's writer as the engine's step calls it), the gather / dequantize of the same amount,
bytes per token of each format, and the accuracy table of :mod:`volta_fp8kv.accuracy` at full
size. Writes ``fp8kv_bench.json`` and ``fp8kv_bench.png`` under DIR and prints a table last.

Timing is the devkit's (:mod:`volta_devkit.bench`): these kernels take about 20 µs, less than a
Python launch, so each runs back to back inside one captured CUDA graph, as in vLLM's graph
mode (``time_cuda_graph``); only the host-checked write, which cannot be captured, is timed
eagerly (``time_cuda``). Four input sets rotate (about 200 MB, four times the H100's L2), so no
launch reads what the previous one left in cache.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from volta_core.kernel_api import device_facts
from volta_devkit.bench import environment, time_cuda, time_cuda_graph
from volta_fp8kv import cache_ops, configs
from volta_fp8kv.accuracy import error_table, realistic_activations
from volta_fp8kv.format import CacheFormat, bytes_per_token
from volta_fp8kv.ops import gather_kv_cache, launch_gather, write_kv_cache
from volta_fp8kv.scales import KVScales, kv_scales

TOKENS, HEADS, HEAD_SIZE, BLOCK_SIZE = 8192, 8, 128, 16
SETS = 4
ACCURACY_TOKENS = 4096
COPY_ELEMENTS = 128 * 2**20

#: Where the suite runs: "cuda" for measurements; the CPU smoke test shrinks the sizes and runs
#: the kernels in the Triton interpreter, to keep this script from rotting in CI.
DEVICE = "cuda"


def median_time(launch: Callable[[int], Any], sets: int, graph: bool = True) -> float:
    """Median seconds of one ``launch(i)`` (input set ``i``): inside a captured CUDA graph with
    ``graph``, else eager calls one by one, host work included. Off CUDA (the smoke test) one
    wall-clock pass over the sets."""
    if DEVICE != "cuda":
        launch(0)
        begin = time.perf_counter()
        for i in range(sets):
            launch(i)
        return (time.perf_counter() - begin) / sets
    timer = time_cuda_graph if graph else time_cuda
    return timer(launch, [(i,) for i in range(sets)]).median_ms / 1e3


def copy_bandwidth() -> dict[str, float]:
    """Device-to-device copy of 256 MiB buffers: bytes read plus written per second."""
    src = [torch.randn(COPY_ELEMENTS, device=DEVICE).half() for _ in range(2)]
    dst = [torch.empty_like(s) for s in src]
    seconds = median_time(lambda i: dst[i].copy_(src[i]), sets=2, graph=False)
    moved = 2 * src[0].numel() * 2
    return {"bytes": moved, "seconds": seconds, "gb_per_s": moved / seconds / 1e9}


def _write_sets(fmt: CacheFormat) -> list[dict[str, torch.Tensor]]:
    blocks = TOKENS // BLOCK_SIZE
    out = []
    for s in range(SETS):
        gen = torch.Generator(device=DEVICE).manual_seed(s)
        key = torch.randn(TOKENS, HEADS, HEAD_SIZE, device=DEVICE, generator=gen).half()
        value = torch.randn(TOKENS, HEADS, HEAD_SIZE, device=DEVICE, generator=gen).half()
        order = torch.randperm(blocks, device=DEVICE, generator=gen)
        slots = (order[:, None] * BLOCK_SIZE + torch.arange(BLOCK_SIZE, device=DEVICE)).reshape(-1)
        cache = torch.empty(
            blocks, HEADS, BLOCK_SIZE, 2 * HEAD_SIZE, dtype=fmt.storage_dtype, device=DEVICE
        )
        out.append({"key": key, "value": value, "slots": slots, "cache": cache})
    return out


def bench_cache_write(
    fmt: CacheFormat, scales: KVScales | None, check: bool, *, host_writer: bool = False
) -> dict[str, Any]:
    """The write of :func:`volta_fp8kv.ops.write_kv_cache`, or with ``host_writer`` of
    :func:`volta_fp8kv.cache_ops.write` given the scale tensors as an attention backend gives
    them (its per-call reciprocals included)."""
    sets = _write_sets(fmt)

    def launch(i: int) -> None:
        s = sets[i]
        if host_writer:
            cache_ops.write(
                s["key"],
                s["value"],
                s["cache"],
                s["slots"],
                kv_cache_dtype=fmt.value,
                k_scale=scales.k if scales else None,
                v_scale=scales.v if scales else None,
                check_values=check,
            )
        else:
            write_kv_cache(
                s["key"], s["value"], s["cache"], s["slots"], fmt.value, scales, check_indices=check
            )

    # The checked call reads the slots back to the host: it cannot be captured, time it eagerly.
    seconds = median_time(launch, len(sets), graph=not check)
    moved = (
        2 * TOKENS * HEADS * HEAD_SIZE * 2  # K and V read (fp16)
        + TOKENS * 8  # slots
        + 2 * TOKENS * HEADS * HEAD_SIZE * fmt.element_bytes  # cache written
    )
    return {"bytes": moved, "seconds": seconds, "gb_per_s": moved / seconds / 1e9}


def bench_gather(fmt: CacheFormat, scales: KVScales | None) -> dict[str, Any]:
    """8 sequences of 1,024 tokens from a shuffled paged cache into fp16 K and V."""
    seqs, per_seq = 8, TOKENS // 8
    sets = []
    for s, w in enumerate(_write_sets(fmt)):
        write_kv_cache(w["key"], w["value"], w["cache"], w["slots"], fmt.value, scales)
        table = (w["slots"][::BLOCK_SIZE] // BLOCK_SIZE).int().reshape(seqs, -1).contiguous()
        lens = torch.full((seqs,), per_seq, dtype=torch.int32, device=DEVICE)
        key, value = gather_kv_cache(w["cache"], table, lens, fmt.value, HEAD_SIZE, scales)
        if s == 0:  # correctness of what is timed: the gather returns what was written
            ref_k = w["key"].float()
            err = float((key.float() - ref_k).norm() / ref_k.norm())
        cu = torch.arange(seqs, dtype=torch.int32, device=DEVICE) * per_seq
        sets.append((w["cache"], table, lens, cu, key, value))
    unit = scales or kv_scales(1.0, 1.0, HEADS, DEVICE)

    def launch(i: int) -> None:
        cache, table, lens, cu, key, value = sets[i]
        launch_gather(cache, table, lens, cu, per_seq, key, value, fmt, unit)

    seconds = median_time(launch, len(sets))
    moved = 2 * TOKENS * HEADS * HEAD_SIZE * (fmt.element_bytes + 2) + table.numel() * 4
    return {
        "bytes": moved,
        "seconds": seconds,
        "gb_per_s": moved / seconds / 1e9,
        "roundtrip_rel_error_k": err,
    }


def sweep_tiles(per_tensor: KVScales) -> dict[str, dict[str, float]]:
    """Throughput against tokens per program (BLOCK_T, 4 warps), recording why
    :func:`volta_fp8kv.configs.tile` chose what it chose."""
    chosen = configs.tile
    sweep: dict[str, dict[str, float]] = {}
    try:
        for block_t in (4, 8, 16, 32):
            configs.tile = lambda capability, pad, b=block_t: (b, 4)
            sweep[str(block_t)] = {
                "cache_write_e5m2_gb_per_s": bench_cache_write(
                    CacheFormat.FP8_E5M2, per_tensor, check=False
                )["gb_per_s"],
                "gather_e5m2_gb_per_s": bench_gather(CacheFormat.FP8_E5M2, per_tensor)["gb_per_s"],
            }
    finally:
        configs.tile = chosen
    return sweep


def compiled_kernels() -> list[dict[str, Any]]:
    """Registers and spills of every kernel variant this run compiled (Triton's own figures)."""
    from volta_fp8kv.kernels.cache_write import cache_write_kernel
    from volta_fp8kv.kernels.gather import gather_kernel

    found = []
    for name, jit in (("cache_write", cache_write_kernel), ("gather", gather_kernel)):
        for kernel_cache, *_ in getattr(jit, "device_caches", {}).values():
            for compiled in kernel_cache.values():
                constants = getattr(compiled, "src", None)
                found.append(
                    {
                        "kernel": name,
                        "constexprs": str(getattr(constants, "constants", "")),
                        "n_regs": getattr(compiled, "n_regs", None),
                        "n_spills": getattr(compiled, "n_spills", None),
                    }
                )
    return found


def versions() -> dict[str, Any]:
    """The devkit's record of device and software; the smoke test's interpreter off CUDA."""
    if DEVICE == "cuda":
        return environment()
    import triton

    return {
        "device": "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
    }


def run(out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    capability = device_facts(torch.device(DEVICE)).capability
    per_head = kv_scales(
        torch.linspace(0.5, 2.0, HEADS), torch.linspace(0.25, 1.0, HEADS), HEADS, DEVICE
    )
    per_tensor = kv_scales(0.75, 0.5, HEADS, DEVICE)
    e5m2, fp16 = CacheFormat.FP8_E5M2, CacheFormat.FLOAT16
    results: dict[str, Any] = {
        "versions": versions(),
        "shape": {
            "tokens": TOKENS,
            "kv_heads": HEADS,
            "head_size": HEAD_SIZE,
            "block_size": BLOCK_SIZE,
        },
        "tile": dict(
            zip(
                ("BLOCK_T", "num_warps"),
                configs.tile(capability, configs.head_pad(HEAD_SIZE, HEAD_SIZE)),
                strict=True,
            )
        ),
    }
    results["copy"] = copy_bandwidth()
    copy_bw = results["copy"]["gb_per_s"]
    write = {
        "e5m2_per_tensor": bench_cache_write(e5m2, per_tensor, check=False),
        "e5m2_per_head": bench_cache_write(e5m2, per_head, check=False),
        "e5m2_per_tensor_checked": bench_cache_write(e5m2, per_tensor, check=True),
        "e5m2_per_head_host_writer": bench_cache_write(e5m2, per_head, False, host_writer=True),
        "fp16": bench_cache_write(fp16, None, check=False),
    }
    gather = {
        "e5m2_per_tensor": bench_gather(e5m2, per_tensor),
        "e5m2_per_head": bench_gather(e5m2, per_head),
        "fp16": bench_gather(fp16, None),
    }
    if capability >= (8, 9):
        write["e4m3_per_head"] = bench_cache_write(CacheFormat.FP8_E4M3, per_head, check=False)
        gather["e4m3_per_head"] = bench_gather(CacheFormat.FP8_E4M3, per_head)
    for group in (write, gather):
        for entry in group.values():
            entry["of_copy_bw"] = entry["gb_per_s"] / copy_bw
    results["cache_write"], results["gather"] = write, gather
    if DEVICE == "cuda":
        results["tile_sweep"] = sweep_tiles(per_tensor)
    results["per_head_vs_per_tensor_write"] = (
        write["e5m2_per_head"]["seconds"] / write["e5m2_per_tensor"]["seconds"]
    )
    results["bytes_per_token"] = {
        f.value: bytes_per_token(HEADS, HEAD_SIZE, HEAD_SIZE, f) for f in (fp16, e5m2)
    }
    formats = (e5m2, CacheFormat.FP8_E4M3) if capability >= (8, 9) else (e5m2,)
    acts = realistic_activations(ACCURACY_TOKENS, HEADS, HEAD_SIZE, device=DEVICE, seed=1)
    plain = realistic_activations(
        ACCURACY_TOKENS, HEADS, HEAD_SIZE, device=DEVICE, seed=1, outlier_gain=1
    )
    results["accuracy"] = {
        "with_outlier_channels": error_table(acts, formats),
        "without_outlier_channels": error_table(plain, formats),
    }
    results["targets"] = {
        "cache_write_e5m2 >= 0.70 copy": write["e5m2_per_tensor"]["of_copy_bw"] >= 0.70,
        "per_head within 10% of per_tensor": abs(results["per_head_vs_per_tensor_write"] - 1)
        <= 0.10,
        "gather_e5m2 >= 0.70 copy": gather["e5m2_per_tensor"]["of_copy_bw"] >= 0.70,
        "e5m2 bytes/token == fp16 / 2": 2 * results["bytes_per_token"]["fp8_e5m2"]
        == results["bytes_per_token"]["float16"],
    }
    if DEVICE == "cuda":
        results["compiled"] = compiled_kernels()
    (out / "fp8kv_bench.json").write_text(json.dumps(results, indent=2))
    _chart(results, out / "fp8kv_bench.png")
    return results


def _chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values = ["copy"], [results["copy"]["gb_per_s"]]
    for group in ("cache_write", "gather"):
        for name, entry in results[group].items():
            labels.append(f"{group}\n{name}")
            values.append(entry["gb_per_s"])
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.bar(range(len(values)), values, color=["grey"] + ["tab:blue"] * (len(values) - 1))
    ax.axhline(0.7 * values[0], color="red", linestyle="--", label="70% of copy bandwidth")
    ax.set_xticks(range(len(values)), labels, fontsize=7)
    ax.set_ylabel("GB/s (bytes read + written)")
    v = results["versions"]
    ax.set_title(
        f"fp8kv kernels, {TOKENS} tokens x {HEADS} KV heads x {HEAD_SIZE}: "
        f"{v['device']}, torch {v['torch']}, triton {v['triton']}",
        fontsize=9,
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(results: dict[str, Any]) -> str:
    lines = [f"{'kernel':40} {'us':>9} {'GB/s':>8} {'of copy':>8}"]
    copy = results["copy"]
    lines.append(
        f"{'copy (ceiling)':40} {copy['seconds'] * 1e6:9.1f} {copy['gb_per_s']:8.0f} {1:8.2f}"
    )
    for group in ("cache_write", "gather"):
        for name, e in results[group].items():
            lines.append(
                f"{group + ' ' + name:40} {e['seconds'] * 1e6:9.1f} "
                f"{e['gb_per_s']:8.0f} {e['of_copy_bw']:8.2f}"
            )
    lines.append(f"per-head / per-tensor write time: {results['per_head_vs_per_tensor_write']:.3f}")
    lines.append(f"bytes per token per layer: {results['bytes_per_token']}")
    for setting, errs in results["accuracy"].items():
        for key, value in errs.items():
            lines.append(f"attention rel. error {setting} {key}: {value:.4f}")
    for block_t, entry in results.get("tile_sweep", {}).items():
        lines.append(
            f"sweep BLOCK_T={block_t}: write e5m2 {entry['cache_write_e5m2_gb_per_s']:.0f} GB/s, "
            f"gather e5m2 {entry['gather_e5m2_gb_per_s']:.0f} GB/s"
        )
    for entry in results.get("compiled", []):
        lines.append(
            f"compiled {entry['kernel']}: {entry['n_regs']} registers, {entry['n_spills']} spills"
        )
    for target, ok in results["targets"].items():
        lines.append(f"target {target}: {'MET' if ok else 'MISSED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for JSON and PNG")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the benchmark needs a CUDA device")
    print(table(run(args.out)))


if __name__ == "__main__":
    main()
