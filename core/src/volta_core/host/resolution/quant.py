"""Quant-method resolution: the highest-priority claim wins; declines are kept for the plan."""

from __future__ import annotations

from collections.abc import Iterable

from volta_core.errors import PluginError
from volta_core.host.types import QuantClaim, QuantDecline, QuantLayer, QuantResolution


def resolve_quant(
    layer: QuantLayer, answers: Iterable[tuple[str, QuantClaim | QuantDecline | None]]
) -> QuantResolution:
    """Pick the claim with the highest priority among plugin answers for one layer.

    Two claims at the same top priority are an error naming both plugins: which one ran would
    otherwise depend on installation order.
    """
    claims = [(name, a) for name, a in answers if isinstance(a, QuantClaim)]
    declines = tuple((name, a) for name, a in answers if isinstance(a, QuantDecline))
    if not claims:
        return QuantResolution(layer, None, None, declines)
    claims.sort(key=lambda item: -item[1].priority)
    if len(claims) > 1 and claims[0][1].priority == claims[1][1].priority:
        (first, a), (second, b) = claims[0], claims[1]
        raise PluginError(
            f"layer {layer.prefix}: plugins {first!r} ({a.method}) and {second!r} ({b.method}) "
            f"both claim it at priority {a.priority}; give one a higher priority"
        )
    source, claim = claims[0]
    return QuantResolution(layer, claim, source, declines)
