"""Per-layer cost of the checks on the eager path: the direct API's checked calls (what the
backend ran outside CUDA-graph capture before issue 33 item 9) against the backend's calls
now (``do_kv_cache_update`` + ``forward``, which read nothing back), and the unchecked direct
calls as the floor.

Shape: 8 sequences x 8K tokens decode, 32/8 heads, head size 128, block 16, fp8_e5m2 cache
with per-head scales. ``LAYERS`` layers, each with its own cache, run back to back as a model's
layers do; a step is timed on the host clock from one synchronisation to the next, so the
stalls the checks cause are in the figure. Median of ``STEPS`` steps after warm-up.

Run on the GPU machine from the repository root with
``PYTHONPATH=core/src:plugins/attn_v100/src:plugins/attn_v100/tests`` (the backend then
imports :mod:`vllm_stand_in`'s stand-ins, through ``test_backend_steps``);
``python3 probe_checks.py OUTDIR`` writes ``checks.json`` there and prints the table.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from attn_v100_cases import make_case
from test_backend_steps import common_metadata, make_layer, new_token_slots

from volta_attn_v100.ops import paged_attention, write_kv_cache

LAYERS = 32
STEPS = 30
HEADS, KV_HEADS, HEAD_SIZE = 32, 8, 128


def median_step_us(step: Callable[[], None]) -> float:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(STEPS):
        begin = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - begin) * 1e6)
    return statistics.median(times)


def main(out_dir: Path) -> None:
    case = make_case(
        [(1, 8192)] * 8,
        head_size=HEAD_SIZE,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        kv_cache_dtype="fp8_e5m2",
        scales="head",
        device="cuda",
    )
    caches = [case.kv_cache.clone() for _ in range(LAYERS)]
    layer, builder = make_layer(case, HEADS, max_model_len=8192 + 64)
    slots = new_token_slots(case)
    gen = torch.Generator().manual_seed(1)
    key = torch.randn((8, KV_HEADS, HEAD_SIZE), generator=gen).to(torch.float16).cuda()
    value = torch.randn_like(key)
    query = case.query.reshape(8, -1)
    out = torch.empty_like(query)
    metadata = common_metadata(case, slots)
    attn_metadata = builder.build(0, metadata)
    q3, o3 = case.query, out.view_as(case.query)

    def write(cache: torch.Tensor, checked: bool) -> None:
        write_kv_cache(
            key, value, cache, slots, kv_cache_dtype="fp8_e5m2",
            k_scale=case.k_scale, v_scale=case.v_scale, check_values=checked,
        )  # fmt: skip

    def attend(cache: torch.Tensor, checked: bool) -> None:
        paged_attention(
            q3, cache, case.block_table, case.seq_lens, case.query_start_loc, o3,
            **case.kwargs(), num_splits=attn_metadata.num_splits, check_bounds=checked,
        )  # fmt: skip

    def backend_write(cache: torch.Tensor) -> None:
        layer.impl.do_kv_cache_update(layer, key, value, cache, slots)

    def backend_attend(cache: torch.Tensor) -> None:
        layer.impl.forward(layer, query, key, value, cache, attn_metadata, output=out)

    def each_layer(*calls: Callable[[torch.Tensor], None]) -> Callable[[], None]:
        def step() -> None:
            for cache in caches:
                for call in calls:
                    call(cache)

        return step

    rows = {
        "write+attention checked (before)": each_layer(
            lambda c: write(c, True), lambda c: attend(c, True)
        ),
        "write+attention backend (now)": each_layer(backend_write, backend_attend),
        "write+attention unchecked direct": each_layer(
            lambda c: write(c, False), lambda c: attend(c, False)
        ),
        "attention checked (before)": each_layer(lambda c: attend(c, True)),
        "attention backend (now)": each_layer(backend_attend),
        "cache write checked (before)": each_layer(lambda c: write(c, True)),
        "cache write backend (now)": each_layer(backend_write),
    }
    per_layer = {name: median_step_us(step) / LAYERS for name, step in rows.items()}
    build_us = []
    for _ in range(200):
        begin = time.perf_counter()
        builder.build(0, metadata)
        build_us.append((time.perf_counter() - begin) * 1e6)
    result = {
        "shape": "decode 8 x 8192, 32/8 heads, head 128, block 16, fp8_e5m2, per-head scales",
        "layers": LAYERS,
        "steps": STEPS,
        "per_layer_us": per_layer,
        "builder_build_us_median": statistics.median(build_us),
        "device": torch.cuda.get_device_name(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "checks.json").write_text(json.dumps(result, indent=1))
    print(f"== per layer, us (median of {STEPS} steps of {LAYERS} layers), {result['device']}")
    for name, us in per_layer.items():
        print(f"{name:36s} {us:9.1f}")
    for what in ("write+attention", "attention", "cache write"):
        before, now = per_layer[f"{what} checked (before)"], per_layer[f"{what} backend (now)"]
        print(f"{what}: now / before = {now / before:.3f} ({before - now:.1f} us saved a layer)")
    print(f"builder.build (host, once a step): {result['builder_build_us_median']:.1f} us")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
