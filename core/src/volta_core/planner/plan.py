"""``vllm-volta plan``: what the engine would do with a model on a device, and why.

Every decision comes from the manager's resolution methods, the same ones the vLLM adapter
calls, so the plan cannot drift from what the engine does.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from volta_core.cuda_toolkit import nvrtc_found
from volta_core.device import Device
from volta_core.errors import NoAttentionBackendError, PluginError, UsageError
from volta_core.host import builtins
from volta_core.host.checkpoint import checkpoint_kv, unquantized_reason
from volta_core.host.declarations import FAMILIES
from volta_core.host.engine_quant import engine_refusal
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import (
    ACTIVATION_DTYPES,
    FP8_KV_CACHE_DTYPES,
    KV_CACHE_DTYPES,
    AttentionLayer,
    KernelPath,
    KVDecision,
    KVRequest,
    LayerKind,
    QuantConfig,
    QuantLayer,
    QuantResolution,
    canonical_kv_dtype,
)
from volta_core.planner.linear_attention import SM70_VERDICT
from volta_core.planner.model import ModelDescription, ModelLayer

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


#: How the plan names the decision for a module no plugin claims.
ENGINE_LOOKUP = "engine's own lookup"


@dataclass(frozen=True)
class PlanOptions:
    """The engine settings a plan is made for (vLLM's flags of the same names)."""

    device: Device
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    block_size: int = 16
    attention_backend: str | None = None
    engine_family: str | None = None
    """The installed vLLM family's name (``volta_core.vllm.families``), whose own quant methods
    run the layers no plugin claims; None: every family is asked
    (:func:`volta_core.host.engine_quant.engine_refusal`)."""

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in ACTIVATION_DTYPES:
            known = ", ".join(["auto", *sorted(ACTIVATION_DTYPES)])
            raise UsageError(f"unknown --dtype {self.dtype!r} (one of: {known})")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            known = ", ".join(sorted(KV_CACHE_DTYPES))
            raise UsageError(f"unknown --kv-cache-dtype {self.kv_cache_dtype!r} (one of: {known})")
        if self.tensor_parallel_size < 1:
            raise UsageError("--tensor-parallel-size must be at least 1")
        if self.block_size < 1:
            raise UsageError("--block-size must be at least 1")


@dataclass(frozen=True)
class LayerPlan:
    """One decoder layer's attention decision (or why it has none)."""

    layer: ModelLayer
    backend: str | None = None
    fallback_reasons: tuple[str, ...] = ()
    error: str | None = None
    cache_writer: str | None = None
    """Who writes the layer's KV cache: ``plugin NAME`` or ``vLLM``."""
    kernel_paths: tuple[KernelPath, ...] = ()
    """Which kernels the backend's plugin runs per stage on the device (``volta_kernel_paths``)."""
    spec: AttentionLayer | None = None
    """The layer as the backend sees it on one rank (heads divided by TP)."""
    plugin: str | None = None
    """The plugin whose backend serves the layer (None: one of vLLM's own)."""


@dataclass(frozen=True)
class QuantPlan:
    """One linear-layer kind's quant decision."""

    prefix: str
    kind: str
    shape: tuple[int, int]
    decision: str
    declines: tuple[str, ...] = ()
    kernel_paths: tuple[KernelPath, ...] = ()
    module: QuantLayer | None = None
    plugin: str | None = None
    """The plugin whose quant method serves the module (None: vLLM's own lookup)."""
    method: str | None = None


@dataclass(frozen=True)
class LayerKV:
    """One attention layer's KV cache on one rank: bytes per token, and its sliding window.

    ``bytes_per_token = 2 (K and V) x head_size x max(1, kv_heads // tp) x element bytes`` of
    the cache dtype (KV heads are replicated when fewer than the ranks). A sliding-window layer
    holds at most its window of tokens; a layer reusing another's cache has no entry.
    """

    index: int
    bytes_per_token: int
    window: int | None = None


@dataclass
class Plan:
    """The whole plan; ``problems`` lists what would stop the engine."""

    model: ModelDescription
    options: PlanOptions
    activation_dtype: str
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    layers: list[LayerPlan] = field(default_factory=list)
    quant: list[QuantPlan] = field(default_factory=list)
    kv: KVDecision | None = None
    kv_bytes_per_token: int = 0
    """All ranks together, every attention layer per token (the sum of ``kv_layers`` x tp)."""
    kv_bytes_per_token_activation_dtype: int = 0
    kv_layers: list[LayerKV] = field(default_factory=list)
    """Per rank, per attention layer that owns a cache: the one per-layer KV computation."""
    nvrtc: str | None = None
    """The CUDA NVRTC version found here (``"12.9"``), when a kernel path needs it; None when
    none needs it or none is installed (then ``notes`` says which stages fall back)."""

    @property
    def activation_bytes(self) -> int:
        """Bytes of one activation (and of the state vLLM keeps in the model dtype)."""
        return _DTYPE_BYTES[self.activation_dtype]


def resolve_activation_dtype(requested: str, config_dtype: str, device: Device) -> tuple[str, str]:
    """The dtype the engine would run, and a note when it differs from the checkpoint's.

    ``auto`` follows the checkpoint, except that a bf16 checkpoint runs in fp16 on devices
    without bf16 arithmetic (as vLLM does). An explicit ``bfloat16`` there is refused.
    """
    if requested == "bfloat16" and not device.has_bf16:
        raise UsageError(
            f"--dtype bfloat16 is not supported on {device.sm}: it has no bf16 arithmetic"
        )
    if requested != "auto":
        return requested, ""
    dtype = config_dtype if config_dtype in ACTIVATION_DTYPES else "float16"
    if dtype == "bfloat16" and not device.has_bf16:
        return (
            "float16",
            f"checkpoint dtype bfloat16 runs as float16 on {device.sm} (no bf16 arithmetic)",
        )
    return dtype, ""


def _nvrtc_note(plan: Plan) -> None:
    """Record the NVRTC this plan's CUDA-source kernels need, or a note that they fall back."""
    paths = [p for lp in plan.layers for p in lp.kernel_paths]
    paths += [p for q in plan.quant for p in q.kernel_paths]
    needing = sorted({p.stage for p in paths if p.needs_nvrtc})
    if not needing:
        return
    plan.nvrtc, why = nvrtc_found()
    if plan.nvrtc is None:
        plan.notes.append(
            f"no CUDA NVRTC here, so these stages run their fallback kernels: "
            f"{', '.join(needing)} ({why})"
        )


def _kv_element_bytes(kv_dtype: str) -> int:
    return 1 if kv_dtype in FP8_KV_CACHE_DTYPES else _DTYPE_BYTES[kv_dtype]


def layer_kv_bytes_per_token(layer: ModelLayer, tp: int, element_bytes: int) -> int:
    """KV bytes one token takes in ``layer`` on one of ``tp`` ranks (:class:`LayerKV`)."""
    return 2 * layer.head_size * max(1, layer.num_kv_heads // tp) * element_bytes


def make_plan(model: ModelDescription, options: PlanOptions, manager: VoltaPluginManager) -> Plan:
    """Resolve attention per layer, quant per linear-layer kind and the KV-cache dtype.

    Problems the engine would refuse are collected, never raised: the config's own (from the
    model description), an unknown quant method, every layer no backend runs, two plugins
    claiming a layer at one priority, and every plugin that failed in a hook while planning
    (it is disabled and named with its hook). Only bad input raises (:class:`UsageError`).
    """
    known = manager.backend_names()
    forced = options.attention_backend
    # A name neither a plugin nor vLLM defines is a typo (exit 2); one of vLLM's own backends
    # the host does not fall back to is a plan whose layers it cannot run (exit 1).
    if forced is not None and forced not in known and forced not in builtins.RESERVED_BACKENDS:
        raise UsageError(
            f"unknown --attention-backend {options.attention_backend!r} "
            f"(one of: {', '.join(known)})"
        )
    faults_before = len(manager.faults)
    device, tp = options.device, options.tensor_parallel_size
    activation, note = resolve_activation_dtype(options.dtype, model.dtype, device)
    plan = Plan(model, options, activation)
    plan.problems += model.problems
    plan.notes += model.notes
    if note:
        plan.notes.append(note)
    labels = {family.hook: family.label for family in FAMILIES}
    plan.notes += [
        f"plugin {plugin!r} replaces vLLM's own {labels[hook]} {name!r}"
        for plugin, hook, name in manager.replacements()
    ]
    plan.problems += _unknown_quant_method(model, manager)
    kv_dtype = canonical_kv_dtype(options.kv_cache_dtype, activation)

    checkpoint = checkpoint_kv(model.quant)
    request = KVRequest(options.kv_cache_dtype, checkpoint, device, activation)
    plan.kv = manager.decide_kv_cache(request)
    if plan.kv.accepted is False:
        plan.problems.append("KV-cache dtype rejected: " + "; ".join(plan.kv.reasons))

    failures: dict[str, list[int]] = {}
    for layer in model.layers:
        layer_plan = _plan_layer(layer, options, activation, manager, model.quant)
        plan.layers.append(layer_plan)
        if layer_plan.error:
            failures.setdefault(layer_plan.error, []).append(layer.index)
        if layer.is_attention and layer.owns_kv_cache:
            per_rank = layer_kv_bytes_per_token(layer, tp, _kv_element_bytes(kv_dtype))
            plan.kv_layers.append(LayerKV(layer.index, per_rank, layer.sliding_window))
            plan.kv_bytes_per_token += per_rank * tp
            plan.kv_bytes_per_token_activation_dtype += (
                layer_kv_bytes_per_token(layer, tp, _DTYPE_BYTES[activation]) * tp
            )

    plan.problems += [f"layers {_ranges(indices)}: {error}" for error, indices in failures.items()]
    if model.quant is not None:
        for module in model.linear_modules:
            # Each claim sees the tensor-parallel size vLLM builds the layer with, as at run time
            # (volta_core.vllm.quantization passes vLLM's).
            module = replace(module, tensor_parallel_size=tp)
            if unquantized_reason(model.quant, module.prefix) is not None:
                # The engine keeps it unquantized whatever a plugin would answer.
                plan.quant.append(_quant_entry(QuantResolution(module, None, None), model))
                continue
            try:
                resolution = manager.resolve_quant(model.quant, module, device)
            except PluginError as exc:  # two claims at one priority: neither is chosen
                plan.problems.append(str(exc))
                continue
            paths: tuple[KernelPath, ...] = ()
            if resolution.claim is not None and resolution.source is not None:
                paths = manager.kernel_paths(
                    resolution.source, module, resolution.claim.method, device, model.quant
                )
            plan.quant.append(_quant_entry(resolution, model, paths))
        plan.problems += _engine_refusals(plan, model.quant.method)
    _nvrtc_note(plan)
    plan.problems += [str(fault) for fault in manager.faults[faults_before:]]
    return plan


def _engine_refusals(plan: Plan, method: str) -> list[str]:
    """The quantized modules no plugin claims whose format the engine refuses on the device:
    one problem per set of plugin declines (none: no installed plugin recognised them, so the
    fix is the plugin that serves the format; some: a plugin read them and said why not, which
    the problem repeats instead of asking to install it)."""
    unserved: dict[tuple[str, ...], list[str]] = {}
    for row in plan.quant:
        if (
            row.plugin is None
            and row.kind in (LayerKind.LINEAR.value, LayerKind.FUSED_MOE.value)
            and row.decision.startswith(ENGINE_LOOKUP)
        ):
            unserved.setdefault(row.declines, []).append(row.prefix)
    options = plan.options
    problems = []
    for declines, prefixes in unserved.items():
        refusal = engine_refusal(method, options.device.capability, options.engine_family, declines)
        if refusal is None:
            continue
        problem, fix = refusal
        more = len(prefixes) - 3
        shown = ", ".join(prefixes[:3]) + (f" and {more} more" if more > 0 else "")
        problems.append(f"{shown}: {problem} (fix: {fix})")
    return problems


def _unknown_quant_method(model: ModelDescription, manager: VoltaPluginManager) -> list[str]:
    """A ``quant_method`` neither vLLM nor any plugin knows: the engine refuses to load it."""
    if model.quant is None or "quant_method" not in model.quant.raw:
        return []
    method = model.quant.method
    known = builtins.QUANT_METHODS | {spec.name for _, spec in manager.quant_methods()}
    if method in known:
        return []
    closest = difflib.get_close_matches(method, sorted(known), n=3, cutoff=0.6)
    hint = f" (closest: {', '.join(closest)})" if closest else ""
    return [
        f"{model.name}: quantization_config.quant_method {method!r} is not a method vLLM or "
        f"a plugin knows{hint}"
    ]


def _plan_layer(
    layer: ModelLayer,
    options: PlanOptions,
    activation: str,
    manager: VoltaPluginManager,
    quant: QuantConfig | None = None,
) -> LayerPlan:
    if not layer.is_attention:
        return LayerPlan(layer)
    tp = options.tensor_parallel_size
    if layer.num_heads % tp:
        return LayerPlan(
            layer, error=f"{layer.num_heads} attention heads do not divide across {tp} ranks"
        )
    spec = AttentionLayer(
        prefix=layer.prefix,
        head_size=layer.head_size,
        num_heads=layer.num_heads // tp,
        num_kv_heads=max(1, layer.num_kv_heads // tp),
        dtype=activation,
        kv_cache_dtype=options.kv_cache_dtype,
        block_size=options.block_size,
        features=layer.features,
        sliding_window=layer.sliding_window,
    )
    try:
        choice = manager.select_attention(
            spec, options.device, options.attention_backend, options.engine_family
        )
    except NoAttentionBackendError as exc:
        return LayerPlan(layer, error=exc.summary)
    reasons = tuple(f"{r.backend}: {r.reason}" for r in choice.refusals)
    kv_dtype = canonical_kv_dtype(options.kv_cache_dtype, activation)
    writer = manager.cache_writer(choice.backend, kv_dtype)
    plugin = manager.backend_plugin(choice.backend)
    paths = (
        manager.kernel_paths(plugin, spec, choice.backend.name, options.device, quant)
        if plugin
        else ()
    )
    return LayerPlan(
        layer,
        choice.backend.name,
        reasons,
        cache_writer=writer,
        kernel_paths=paths,
        spec=spec,
        plugin=plugin,
    )


def _quant_entry(
    resolution: QuantResolution, model: ModelDescription, paths: tuple[KernelPath, ...] = ()
) -> QuantPlan:
    layer = resolution.layer
    declines = tuple(f"{source}: {d.method}: {d.reason}" for source, d in resolution.declines)
    if resolution.claim is not None:
        claim = resolution.claim
        decision = f"{claim.method} (plugin {resolution.source})"
        if claim.detail:
            decision += f": {claim.detail}"
    elif model.quant is not None and (why := unquantized_reason(model.quant, layer.prefix)):
        decision = f"unquantized ({why})"
    elif layer.kind is LayerKind.ATTENTION:
        has_kv_scheme = model.quant is not None and model.quant.kv_cache_scheme is not None
        decision = (
            "engine's KV-cache method (checkpoint has KV scales)"
            if has_kv_scheme
            else ("no KV-cache method (weight-only checkpoint)")
        )
    else:
        method = model.quant.method if model.quant else "none"
        decision = f"{ENGINE_LOOKUP} ({method})"
    won = resolution.claim
    return QuantPlan(
        layer.prefix,
        layer.kind.value,
        (layer.input_size, layer.output_size),
        decision,
        declines,
        paths,
        module=layer,
        plugin=resolution.source if won is not None else None,
        method=won.method if won is not None else None,
    )


def plan_as_dict(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data (``vllm-volta plan --json``)."""
    kv = plan.kv
    return {
        "model": {
            "name": plan.model.name,
            "model_type": plan.model.model_type,
            "architectures": list(plan.model.architectures),
            "checkpoint_dtype": plan.model.dtype,
            "quant_method": plan.model.quant.method if plan.model.quant else None,
        },
        "device": plan.options.device.sm,
        "dtype": plan.activation_dtype,
        "tensor_parallel_size": plan.options.tensor_parallel_size,
        "nvrtc": plan.nvrtc,
        "notes": plan.notes,
        "problems": plan.problems,
        "attention": [
            {
                "layer": lp.layer.index,
                "type": lp.layer.layer_type,
                "head_size": lp.layer.head_size or None,
                "backend": lp.backend,
                "kv_cache_writer": lp.cache_writer,
                "fallback_reasons": list(lp.fallback_reasons),
                "kernel_paths": [asdict(p) for p in lp.kernel_paths],
                "error": lp.error,
            }
            for lp in plan.layers
        ],
        "quant": [
            {
                "module": q.prefix,
                "kind": q.kind,
                "shape": list(q.shape),
                "decision": q.decision,
                "declines": list(q.declines),
                "kernel_paths": [asdict(p) for p in q.kernel_paths],
            }
            for q in plan.quant
        ],
        "kv_cache": None
        if kv is None
        else {
            "requested": kv.request.kv_cache_dtype,
            "checkpoint_scales": kv.request.checkpoint.scheme.value,
            "calibrated_for": kv.request.checkpoint.calibrated_for,
            "accepted": kv.accepted,
            "reasons": list(kv.reasons),
            "warnings": list(kv.warnings),
            "verdicts": [
                {"plugin": name, "status": v.status.value, "reason": v.reason, "scales": v.scales}
                for name, v in kv.verdicts
            ],
            "bytes_per_token": plan.kv_bytes_per_token,
            "bytes_per_token_in_activation_dtype": plan.kv_bytes_per_token_activation_dtype,
        },
    }


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    out: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        if i is not None:
            start = prev = i
    return ", ".join(out)


def _path_lines(paths: Sequence[KernelPath], nvrtc: str | None) -> list[str]:
    """One line per stage: the kernel that runs it here (its fallback without NVRTC)."""
    lines = []
    for p in paths:
        if not p.needs_nvrtc:
            lines.append(f"      {p.stage}: {p.kernel}")
        elif nvrtc is not None:
            lines.append(
                f"      {p.stage}: {p.kernel} (compiled at first use by NVRTC {nvrtc}; "
                f"{p.fallback} without it)"
            )
        else:
            lines.append(f"      {p.stage}: {p.fallback} ({p.kernel} needs NVRTC: none here)")
    return lines


def render_text(plan: Plan, sections: Sequence[Sequence[str]] = ()) -> str:
    """The plan as a human reads it; layers with the same outcome are listed as ranges.

    ``sections`` (the memory fit, the speed estimate) are printed before the problems.
    """
    m, o = plan.model, plan.options
    arch = ", ".join(m.architectures) or "?"
    lines = [
        f"vllm-volta plan: {m.name} ({m.model_type}, {arch})",
        f"device {o.device}  dtype {plan.activation_dtype}"
        f"  tensor parallel {o.tensor_parallel_size}  block size {o.block_size}"
        + (f"  --attention-backend {o.attention_backend}" if o.attention_backend else ""),
    ]
    lines += [f"note: {n}" for n in plan.notes]

    lines.append("")
    lines.append(f"attention ({len(plan.layers)} layers)")
    groups: dict[tuple[Any, ...], list[int]] = {}
    for lp in plan.layers:
        key = (
            lp.layer.layer_type,
            lp.layer.head_size,
            lp.layer.num_heads,
            lp.layer.num_kv_heads,
            lp.layer.sliding_window,
            lp.backend,
            lp.cache_writer,
            lp.fallback_reasons,
            lp.kernel_paths,
            lp.error,
        )
        groups.setdefault(key, []).append(lp.layer.index)
    for key, indices in groups.items():
        layer_type, head, heads, kv_heads, window, backend, writer, reasons, paths, error = key
        label = f"  layers {_ranges(indices)}: {layer_type}"
        if not head:
            own = SM70_VERDICT if layer_type == "linear_attention" else "the model's own layer"
            lines.append(f"{label}: no paged KV cache ({own})")
            continue
        shape = f"head size {head}, {heads}/{kv_heads} heads" + (
            f", window {window}" if window else ""
        )
        written = f" (KV cache written by {writer})" if writer else ""
        lines.append(f"{label}, {shape} -> {backend or 'NONE'}{written}")
        lines += _path_lines(paths, plan.nvrtc)
        lines += [f"      fallback: {r}" for r in reasons]
        if error:
            lines.append(f"      error: {error}")

    if m.quant is not None:
        lines.append("")
        lines.append(f"quantization ({m.quant.method})")
        for q in plan.quant:
            shape = f"{q.shape[0]}x{q.shape[1]}" if any(q.shape) else "-"
            lines.append(f"  {q.prefix} [{q.kind} {shape}]: {q.decision}")
            lines += _path_lines(q.kernel_paths, plan.nvrtc)
            lines += [f"      declined by {d}" for d in q.declines]

    kv = plan.kv
    if kv is not None:
        ck = kv.request.checkpoint
        lines.append("")
        kv_dtype = canonical_kv_dtype(kv.request.kv_cache_dtype, plan.activation_dtype)
        lines.append(f"kv cache: --kv-cache-dtype {kv.request.kv_cache_dtype} ({kv_dtype})")
        scales = ck.scheme.value + (
            f", calibrated for {ck.calibrated_for}" if ck.calibrated_for else ""
        )
        lines.append(f"  checkpoint: weights {ck.weight_format}; KV scales {scales} ({ck.source})")
        verdict = {
            True: "accepted",
            False: "REJECTED",
            None: "no plugin has a rule; vLLM's own rule applies",
        }
        lines.append(f"  verdict: {verdict[kv.accepted]}")
        for name, v in kv.verdicts:
            extra = f" [scales: {v.scales}]" if v.scales else ""
            lines.append(f"    {name}: {v.status.value}: {v.reason}{extra}")
            lines += [f"      warning: {w}" for w in v.warnings]
        full = plan.kv_bytes_per_token_activation_dtype
        ratio = plan.kv_bytes_per_token / max(1, full)
        lines.append(
            f"  bytes per token: {plan.kv_bytes_per_token:,} "
            f"({plan.activation_dtype}: {full:,}; ratio {ratio:.2f})"
        )

    for section in sections:
        lines.append("")
        lines += section
    lines.append("")
    if plan.problems:
        lines.append("problems:")
        lines += [f"  - {p}" for p in plan.problems]
    else:
        lines.append("problems: none")
    return "\n".join(lines)
