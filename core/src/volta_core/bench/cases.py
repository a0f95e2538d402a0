"""What ``vllm-volta bench`` times for a model: every stage a plugin serves, at its shapes.

From a plan made for the device present, each distinct attention layer a plugin's backend
runs, and each distinct module shape a plugin's quant method claims (linear layers, fused
experts), is timed in every stage of the kernel paths the plan prints for it: a stage named
by a range of counts (``"1-7 tokens"``, ``"decode, 3-8 query tokens"``,
:func:`volta_core.kernel_api.token_stage`'s names) at its first count, and in a full run at
its last too (an open-ended one's at :attr:`Points.open_end`), so that no stage is left to
fixed points that happen to miss it; the decode stages at a few sequences x context points,
the prefill stage at a few chunks. Each attention layer's KV-cache write is timed through the
format owner's writer. For each the serving plugin gives, for the same
:class:`~volta_core.kernel_api.Workload`, what the work costs (``volta_kernel_cost``) and how
to call its kernel (``volta_bench_case``: a function named by import path, imported only when
the call is timed). The KV-cache write no plugin prices: the host gives its cost, its bytes
once each way (its roofline). A stage no call reaches is listed with the reason
(:func:`unmeasured_paths`).

Listing needs no GPU: nothing here runs a kernel or imports torch at import.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from volta_core.errors import PluginError
from volta_core.host.bench_case import BenchCall, BenchCase
from volta_core.host.dispatch import KernelCost, LaunchCost, StageCost, Unit, Workload
from volta_core.host.kv_cache_ops import kv_cache_writer
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import (
    AttentionLayer,
    KernelPath,
    LayerKind,
    QuantLayer,
    canonical_kv_dtype,
)
from volta_core.planner.calibration import Family, attention_family, module_family
from volta_core.planner.plan import LayerPlan, Plan, QuantPlan


@dataclass(frozen=True)
class Points:
    """What each stage is timed with besides its counts: decode ``(sequences, context)``,
    prefill ``(chunk, context)``, the KV-cache write's token counts; ``stage_ends``: each stage
    timed at its last count too, an open-ended stage's at ``open_end`` (a prefill chunk)."""

    decode: tuple[tuple[int, int], ...]
    prefill: tuple[tuple[int, int], ...]
    kv_write_tokens: tuple[int, ...]
    stage_ends: bool
    open_end: int = 2048


#: ``--quick``: each stage at its first count; decodes at one and at 16 sequences, one
#: prefill chunk.
QUICK = Points(((1, 4096), (16, 4096)), ((2048, 2048),), (16, 2048), stage_ends=False)
#: The full run: each stage at both ends; long and batched decodes, a chunk after a cached
#: prefix.
FULL = Points(
    ((1, 1024), (1, 16384), (16, 4096), (64, 2048)),
    ((2048, 2048), (2048, 8192)),
    (1, 16, 2048),
    stage_ends=True,
)

#: A stage named by a range of counts, as :func:`volta_core.kernel_api.token_stage` names
#: them (of tokens, or of query tokens): ``1 token``, ``2-4 tokens``, ``257+ tokens``.
_RANGE = re.compile(r"(?P<first>\d+)(?:(?P<open>\+)|-(?P<last>\d+))? (?:query )?tokens?$")


def stage_counts(stage: str, points: Points) -> tuple[int, ...]:
    """The counts ``stage`` is timed at: its first (where its kernels take over) and, with
    ``points.stage_ends``, its last (an open-ended stage's :attr:`Points.open_end` where that
    is past its first). Empty where the name gives no range of counts."""
    match = _RANGE.search(stage)
    if match is None:
        return ()
    first = int(match["first"])
    if not points.stage_ends:
        return (first,)
    last = int(match["last"]) if match["last"] else points.open_end if match["open"] else first
    return tuple(sorted({first, max(first, last)}))


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


def _attention_works(lp: LayerPlan, points: Points) -> list[tuple[Family, Workload]]:
    """The workloads of each of the layer's stages: a ``prefill`` stage at the prefill points,
    a ``decode`` stage at the decode points with each of its query-token counts (one where
    its name gives none), the cache tokens a sliding window holds at most."""
    assert lp.spec is not None
    works: list[tuple[Family, Workload]] = []
    for path in lp.kernel_paths:
        family = attention_family(path.stage)
        if family is Family.ATTENTION_PREFILL:
            works += [
                (family, Workload(1, chunk, _held(lp.spec, ctx))) for chunk, ctx in points.prefill
            ]
        elif family is Family.ATTENTION_DECODE:
            works += [
                (family, Workload(seqs, q_len, _held(lp.spec, ctx)))
                for q_len in stage_counts(path.stage, points) or (1,)
                for seqs, ctx in points.decode
            ]
    return list(dict.fromkeys(works))


def plan_cases(
    manager: VoltaPluginManager, plan: Plan, model: str, points: Points
) -> list[Planned]:
    """Every call to time for ``plan`` (made for the device present) with ``points``."""
    planned: list[Planned] = []
    for lp in _attention_layers(plan):
        assert lp.spec is not None
        assert lp.plugin is not None
        assert lp.backend is not None
        module = attention_module(lp.spec)
        for family, work in _attention_works(lp, points):
            planned.append(
                _ask(manager, plan, model, family, module, lp.plugin, lp.spec, lp.backend, work)
            )
        planned += _kv_writes(manager, plan, model, lp, points.kv_write_tokens)
    for q in _quant_modules(plan):
        assert q.plugin is not None
        assert q.method is not None
        assert q.module is not None
        family = module_family(q.module.kind)
        counts = sorted({c for path in q.kernel_paths for c in stage_counts(path.stage, points)})
        for count in counts:
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


def _why_not(stage: str, attention: bool, points: Points) -> str:
    """Why no call was planned in a stage of the plan's kernel paths."""
    if attention and attention_family(stage) is None:
        return "its name says neither decode nor prefill: no workload is chosen for it"
    if not attention and not stage_counts(stage, points):
        return "its name gives no range of token counts to choose one from"
    return "the plugin's cost puts the workloads chosen for it in another stage"


def unmeasured_paths(
    plan: Plan, planned: Sequence[Planned], model: str, points: Points
) -> list[dict[str, str]]:
    """Each stage the plan prints for a plugin-served layer that no call was planned in (by
    its cost's stage), named with its kernel and why, so that the report accounts for every
    stage of the plan: timed, or listed here (or, planned but not timed, by the report)."""
    ran = {(p.module, p.estimate.stage) for p in planned if p.estimate is not None}
    paths: list[tuple[bool, str, KernelPath]] = []
    for lp in _attention_layers(plan):
        assert lp.spec is not None
        paths += [(True, attention_module(lp.spec), path) for path in lp.kernel_paths]
    for q in _quant_modules(plan):
        paths += [(False, q.prefix, path) for path in q.kernel_paths]
    return [
        {
            "model": model,
            "module": module,
            "stage": path.stage,
            "kernel": path.kernel,
            "reason": _why_not(path.stage, attention, points),
        }
        for attention, module, path in paths
        if (module, path.stage) not in ran
    ]
