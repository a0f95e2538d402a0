"""Per-layer attention backend selection with head-size (and feature) fallback."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from volta_core.device import Device
from volta_core.errors import NoAttentionBackendError
from volta_core.host.types import (
    AttentionBackendSpec,
    AttentionChoice,
    AttentionLayer,
    BackendRefusal,
    canonical_kv_dtype,
)


def _cap(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def refusal_reason(
    spec: AttentionBackendSpec,
    layer: AttentionLayer,
    device: Device,
    kv_cache_formats: frozenset[str] = frozenset(),
) -> str | None:
    """Why ``spec`` cannot run ``layer`` on ``device``, or None when it can.

    ``kv_cache_formats`` names the KV-cache formats plugins write (``layout.dtype``): a
    backend that writes through the host (``kv_cache_layout``) needs the layer's.

    Checks run in a fixed order and the first failing one is reported, so a plan reads the
    same every time.
    """
    if not spec.min_capability <= device.capability <= spec.max_capability:
        return (
            f"compute capability {_cap(device.capability)} is outside "
            f"{_cap(spec.min_capability)}..{_cap(spec.max_capability)}"
        )
    if layer.head_size < spec.min_head_size:
        return f"head size {layer.head_size} is below its minimum {spec.min_head_size}"
    if spec.head_sizes and layer.head_size not in spec.head_sizes:
        sizes = ", ".join(str(s) for s in sorted(spec.head_sizes))
        return f"head size {layer.head_size} is not one of its head sizes ({sizes})"
    if layer.dtype not in spec.dtypes:
        return f"activation dtype {layer.dtype} is not one of {', '.join(sorted(spec.dtypes))}"
    kv_dtype = canonical_kv_dtype(layer.kv_cache_dtype, layer.dtype)
    if kv_dtype not in spec.kv_cache_dtypes:
        return f"KV-cache dtype {kv_dtype} is not one of {', '.join(sorted(spec.kv_cache_dtypes))}"
    needed = spec.kv_dtype_min_capability.get(kv_dtype)
    if needed is not None and device.capability < needed:
        return f"KV-cache dtype {kv_dtype} needs compute capability {_cap(needed)} or newer"
    if spec.kv_cache_layout and f"{spec.kv_cache_layout}.{kv_dtype}" not in kv_cache_formats:
        return (
            f"no plugin writes a {kv_dtype} KV cache in its {spec.kv_cache_layout} layout "
            "(install the plugin that defines the format, vllm-volta-fp8kv)"
        )
    if spec.block_size_multiple and layer.block_size % spec.block_size_multiple:
        return f"block size {layer.block_size} is not a multiple of {spec.block_size_multiple}"
    missing = sorted(f.value for f in layer.features - spec.features)
    if missing:
        return f"it does not implement {', '.join(missing)}"
    return None


def candidate_order(backends: Iterable[AttentionBackendSpec]) -> list[AttentionBackendSpec]:
    """Plugin backends first, by descending priority (name breaks ties), then built-ins."""
    return sorted(backends, key=lambda b: (b.builtin, -b.priority, b.name))


def select_backend(
    layer: AttentionLayer,
    device: Device,
    candidates: Sequence[AttentionBackendSpec],
    forced: str | None = None,
    kv_cache_formats: frozenset[str] = frozenset(),
) -> AttentionChoice:
    """Give ``layer`` to the first candidate (in :func:`candidate_order`) that admits it.

    ``forced`` is an explicit ``--attention-backend``: only that backend is tried, so a layer it
    cannot run is an error naming the layer and the reason rather than a silent fallback.
    Raises :class:`NoAttentionBackendError` listing every candidate's refusal.
    """
    ordered = candidate_order(candidates)
    if forced is not None:
        ordered = [b for b in ordered if b.name == forced or b.vllm_name == forced]
        if not ordered:
            known = ", ".join(b.name for b in candidate_order(candidates)) or "none"
            refusal = BackendRefusal(forced, f"{forced!r} is not declared (known: {known})")
            raise no_backend(layer, device, (refusal,))
    refusals: list[BackendRefusal] = []
    for spec in ordered:
        reason = refusal_reason(spec, layer, device, kv_cache_formats)
        if reason is None:
            # A backend made for other devices is not a fallback the layer fell through: keep
            # only refusals by backends that target this device.
            fell_through = tuple(r for r in refusals if not r.other_device)
            return AttentionChoice(layer, spec, fell_through)
        other = not spec.min_capability <= device.capability <= spec.max_capability
        refusals.append(BackendRefusal(spec.name, reason, other))
    raise no_backend(layer, device, tuple(refusals))


def no_backend(
    layer: AttentionLayer, device: Device, refusals: tuple[BackendRefusal, ...]
) -> NoAttentionBackendError:
    """The error for a layer no backend admits, naming each backend's refusal."""
    detail = "; ".join(f"{r.backend}: {r.reason}" for r in refusals) or "no backend is declared"
    kv = canonical_kv_dtype(layer.kv_cache_dtype, layer.dtype)
    summary = (
        f"no attention backend can run head size {layer.head_size}, {layer.dtype}, KV {kv} "
        f"on {device.sm}: {detail}"
    )
    return NoAttentionBackendError(layer.prefix, summary, refusals)
