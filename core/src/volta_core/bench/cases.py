"""What ``vllm-volta bench`` times for a model: every stage a plugin serves, at its shapes.

From a plan made for the device present, each distinct attention layer a plugin's backend
runs is timed at a few decode points (sequences x context) and prefill chunks, each linear
module and fused experts a plugin's quant method claims at a few token counts, and each
attention layer's KV-cache write through the format owner's writer. For each the serving
plugin gives, for the same :class:`~volta_core.kernel_api.Workload`, what the work costs
(``volta_kernel_cost``) and how to call its kernel (``volta_bench_case``: a function named by
import path, imported only when the call is timed). The KV-cache
write no plugin prices: the host gives its cost, its bytes once each way (its roofline).

Listing needs no GPU: nothing here runs a kernel or imports torch at import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from volta_core.errors import PluginError
from volta_core.host.bench_case import BenchCall, BenchCase
from volta_core.host.dispatch import KernelCost, LaunchCost, StageCost, Unit, Workload
from volta_core.host.kv_cache_ops import kv_cache_writer
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import AttentionLayer, LayerKind, QuantLayer, canonical_kv_dtype
from volta_core.planner.plan import LayerPlan, Plan, QuantPlan


class Family(str, Enum):
    """The kernel families a verdict is given for."""

    ATTENTION_DECODE = "attention decode"
    ATTENTION_PREFILL = "attention prefill"
    LINEAR = "linear"
    MOE = "MoE experts"
    KV_WRITE = "KV-cache write"


@dataclass(frozen=True)
class Points:
    """The workloads timed: decode ``(sequences, context)``, prefill ``(chunk, context)``,
    linear and MoE token counts, KV-cache write token counts."""

    decode: tuple[tuple[int, int], ...]
    prefill: tuple[tuple[int, int], ...]
    tokens: tuple[int, ...]
    kv_write_tokens: tuple[int, ...]


#: ``--quick``: a decode at one and at 16 sequences, one prefill chunk, the three linear
#: stages of the W4A16 kernels (GEMV, tensor-core GEMM, dequantize then cuBLAS).
QUICK = Points(((1, 4096), (16, 4096)), ((2048, 2048),), (1, 16, 512), (16, 2048))
#: The full run: long and batched decodes, a chunk after a cached prefix, more token counts.
FULL = Points(
    ((1, 1024), (1, 16384), (16, 4096), (64, 2048)),
    ((2048, 2048), (2048, 8192)),
    (1, 4, 16, 64, 256, 1024),
    (1, 16, 2048),
)


@dataclass(frozen=True)
class Planned:
    """One call to time: where the plan puts it, its work, the serving plugin's estimate for
    it, and what runs: the bench case's stage and kernel, and ``make_call`` building the call
    (None, with ``note`` saying why, where nothing can be timed)."""

    model: str
    family: Family
    module: str
    plugin: str
    served_by: str
    work: Workload
    estimate: StageCost | None
    stage: str | None
    kernel: str | None
    make_call: Callable[[], BenchCall] | None
    note: str = ""

    @property
    def shape(self) -> dict[str, int]:
        """The work as the report prints it."""
        if self.family in (Family.LINEAR, Family.MOE, Family.KV_WRITE):
            return {"tokens": self.work.tokens}
        return {
            "sequences": self.work.sequences,
            "query_len": self.work.query_len,
            "context": self.work.context,
        }


def _held(layer: AttentionLayer, context: int) -> int:
    """Cache tokens a query reads: a sliding-window layer holds at most its window (as the
    plan's estimate counts them)."""
    return min(context, layer.sliding_window) if layer.sliding_window else context


def _ask(
    manager: VoltaPluginManager,
    plan: Plan,
    model: str,
    family: Family,
    module: str,
    plugin: str,
    layer: AttentionLayer | QuantLayer,
    served_by: str,
    work: Workload,
) -> Planned:
    device, quant = plan.options.device, plan.model.quant
    estimate = manager.kernel_cost(plugin, layer, served_by, device, quant, work)
    case = manager.bench_case(plugin, layer, served_by, device, quant, work)
    where = (model, family, module, plugin, served_by, work, estimate)
    if case is None:
        return Planned(*where, None, None, None, f"plugin {plugin} gives no bench case here")
    return Planned(*where, case.stage, case.kernel, _loader(plugin, case, layer, quant, work))


def _loader(
    plugin: str, case: BenchCase, layer: AttentionLayer | QuantLayer, quant: Any, work: Workload
) -> Callable[[], BenchCall]:
    """What makes the case's call when it is timed: its ``impl`` imported and called, its
    answer checked (:class:`PluginError` naming the plugin otherwise)."""

    def make_call() -> BenchCall:
        module, _, name = case.impl.partition(":")
        try:
            impl = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise PluginError(
                f"plugin {plugin!r}: bench case {case.impl} cannot be imported: {exc}"
            ) from exc
        call = impl(layer, quant, work)
        if not isinstance(call, BenchCall):
            raise PluginError(
                f"plugin {plugin!r}: {case.impl} returned {type(call).__name__}, not a BenchCall"
            )
        return call

    return make_call


def _attention_layers(plan: Plan) -> list[LayerPlan]:
    """One plan per distinct attention layer a plugin's backend serves (same shape, same
    backend: the same kernels)."""
    seen: set[tuple[AttentionLayer, str]] = set()
    layers = []
    for lp in plan.layers:
        if lp.spec is None or lp.plugin is None or lp.backend is None:
            continue
        key = (replace(lp.spec, prefix=""), lp.backend)
        if key not in seen:
            seen.add(key)
            layers.append(lp)
    return layers


def attention_module(layer: AttentionLayer) -> str:
    """An attention layer as the report names it (the estimate's own label, and the window)."""
    window = f", window {layer.sliding_window}" if layer.sliding_window else ""
    heads = f"{layer.num_heads}/{layer.num_kv_heads} heads"
    return f"attention, head size {layer.head_size}, {heads}{window}"


def kv_write_cost(layer: AttentionLayer, tokens: int) -> StageCost:
    """The host's roofline of a KV-cache write: K and V read in the activation dtype (2 bytes
    an element), written in the cache's, and the slot mapping's int64 read; one scale product
    an element on the FMA units."""
    elements = tokens * max(1, layer.num_kv_heads) * 2 * layer.head_size
    cache_bytes = 2 if canonical_kv_dtype(layer.kv_cache_dtype, layer.dtype) == "float16" else 1
    launch = LaunchCost(2 * elements + 8 * tokens, cache_bytes * elements, elements, Unit.FMA)
    return StageCost("cache write", KernelCost("KV-cache write", (launch,)))


def kv_write_call(
    write: Callable[..., None],
    layer: AttentionLayer,
    tokens: int,
    blocks: int,
    device: str = "cuda",
) -> BenchCall:
    """The write of ``tokens`` new tokens' K and V into a ``blocks``-block packed cache at
    distinct random slots, with per-tensor scales of 1, as the engine's step calls it (on
    ``device``: the tests run it on CPU under the Triton interpreter)."""
    heads, head, block = max(1, layer.num_kv_heads), layer.head_size, layer.block_size
    dtype = canonical_kv_dtype(layer.kv_cache_dtype, layer.dtype)
    cache_bytes = 2 if dtype == "float16" else 1

    def make_inputs() -> tuple[Any, ...]:
        import torch

        key = torch.randn(tokens, heads, head, dtype=torch.float16, device=device)
        value = torch.randn_like(key)
        cache_dtype = torch.float16 if dtype == "float16" else torch.uint8
        cache = torch.zeros(blocks, heads, block, 2 * head, dtype=cache_dtype, device=device)
        slots = torch.randperm(blocks * block, device=device)[:tokens].clone()
        scale = torch.ones(1, dtype=torch.float32, device=device)
        return key, value, cache, slots, scale

    def run(key: Any, value: Any, cache: Any, slots: Any, scale: Any) -> None:
        write(
            key, value, cache, slots,
            kv_cache_dtype=dtype, k_scale=scale, v_scale=scale, check_values=False,
        )  # fmt: skip

    size = 2 * tokens * heads * head * 2 + blocks * heads * block * 2 * head * cache_bytes
    return BenchCall(make_inputs, run, size + 8 * tokens + 4)  # int64 slots, a float32 scale


def _kv_writes(
    manager: VoltaPluginManager, plan: Plan, model: str, lp: LayerPlan, tokens: Sequence[int]
) -> list[Planned]:
    """The layer's KV-cache write by the format's owner, where a plugin writes it."""
    assert lp.spec is not None
    backend = next((s for _, s in manager.attention_backends() if s.name == lp.backend), None)
    if backend is None or not backend.kv_cache_layout:
        return []
    dtype = canonical_kv_dtype(lp.spec.kv_cache_dtype, lp.spec.dtype)
    owner = manager.kv_cache_format(backend.kv_cache_layout, dtype)
    if owner is None:
        return []
    layout, spec = backend.kv_cache_layout, lp.spec
    module = attention_module(spec)
    planned = []
    for count in tokens:

        def make_call(count: int = count) -> BenchCall:
            # Twice the tokens' blocks: the slots are spread over the cache as a step's are
            # over a serving cache, not packed in its first blocks.
            blocks = max(1, -(-2 * count // spec.block_size))
            write = kv_cache_writer(layout, dtype, spec.dtype, manager)
            return kv_write_call(write, spec, count, blocks)

        cost = kv_write_cost(spec, count)
        where = (model, Family.KV_WRITE, module, owner[0], owner[1].name, Workload(count))
        planned.append(Planned(*where, cost, cost.stage, cost.cost.kernel, make_call))
    return planned


def plan_cases(
    manager: VoltaPluginManager, plan: Plan, model: str, points: Points
) -> list[Planned]:
    """Every call to time for ``plan`` (made for the device present) at ``points``."""
    planned: list[Planned] = []
    for lp in _attention_layers(plan):
        assert lp.spec is not None
        assert lp.plugin is not None
        assert lp.backend is not None
        module = attention_module(lp.spec)
        works = [
            (Family.ATTENTION_DECODE, Workload(seqs, 1, _held(lp.spec, ctx)))
            for seqs, ctx in points.decode
        ] + [
            (Family.ATTENTION_PREFILL, Workload(1, chunk, _held(lp.spec, ctx)))
            for chunk, ctx in points.prefill
        ]
        for family, work in works:
            planned.append(
                _ask(manager, plan, model, family, module, lp.plugin, lp.spec, lp.backend, work)
            )
        planned += _kv_writes(manager, plan, model, lp, points.kv_write_tokens)
    for q in _quant_modules(plan):
        assert q.plugin is not None
        assert q.method is not None
        assert q.module is not None
        family = Family.MOE if q.module.kind is LayerKind.FUSED_MOE else Family.LINEAR
        for count in points.tokens:
            work = Workload(count)
            args = (manager, plan, model, family, q.prefix, q.plugin, q.module, q.method, work)
            planned.append(_ask(*args))
    return planned


def _quant_modules(plan: Plan) -> list[QuantPlan]:
    """One plan per distinct module shape a plugin's quant method serves (the first of each:
    the same method at the same shape runs the same kernels)."""
    seen: set[tuple[str, LayerKind, int, int, int, int]] = set()
    modules = []
    for q in plan.quant:
        if q.plugin is None or q.method is None or q.module is None:
            continue
        m = q.module
        key = (q.method, m.kind, m.input_size, m.output_size, m.experts, m.top_k)
        if key not in seen:
            seen.add(key)
            modules.append(q)
    return modules


def unmeasured_paths(plan: Plan, planned: Sequence[Planned]) -> list[dict[str, str]]:
    """Each kernel the plan prints for a plugin-served layer that no timed call ran, so the
    report lists every kernel of the plan: measured, or named here with its stage."""
    ran = {(p.module, p.estimate.stage) for p in planned if p.estimate is not None}
    rows = []
    for lp in _attention_layers(plan):
        assert lp.spec is not None
        module = attention_module(lp.spec)
        rows += [
            {"module": module, "stage": path.stage, "kernel": path.kernel}
            for path in lp.kernel_paths
            if (module, path.stage) not in ran
        ]
    for q in _quant_modules(plan):
        rows += [
            {"module": q.prefix, "stage": path.stage, "kernel": path.kernel}
            for path in q.kernel_paths
            if (q.prefix, path.stage) not in ran
        ]
    return rows
