"""Combining every plugin's verdict on a KV-cache dtype request."""

from __future__ import annotations

from collections.abc import Iterable

from volta_core.errors import KVCacheDtypeRejected
from volta_core.host.types import KVDecision, KVRequest, KVVerdict, VerdictStatus


def combine_verdicts(
    request: KVRequest, verdicts: Iterable[tuple[str, KVVerdict | None]]
) -> KVDecision:
    """Any reject wins; otherwise any accept accepts; with no opinion the engine decides."""
    given = tuple((name, v) for name, v in verdicts if v is not None)
    statuses = {v.status for _, v in given}
    if VerdictStatus.REJECT in statuses:
        accepted: bool | None = False
    elif VerdictStatus.ACCEPT in statuses:
        accepted = True
    else:
        accepted = None
    return KVDecision(request, accepted, given)


def require_accepted(decision: KVDecision) -> KVDecision:
    """Raise :class:`KVCacheDtypeRejected` listing every reason if the decision rejects."""
    if decision.accepted is False:
        request = decision.request
        raise KVCacheDtypeRejected(
            f"--kv-cache-dtype {request.kv_cache_dtype} is rejected on {request.device.sm}: "
            + "; ".join(decision.reasons)
        )
    return decision
