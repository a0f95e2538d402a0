"""Pure resolution functions: one source of truth for the plan command and the vLLM adapter.

Nothing here imports vLLM, torch or a plugin: inputs are declarations and descriptions
(:mod:`volta_core.host.types`), outputs are decisions with their reasons.
"""

from volta_core.host.resolution.attention import candidate_order, refusal_reason, select_backend
from volta_core.host.resolution.kv_cache import combine_verdicts, require_accepted
from volta_core.host.resolution.quant import resolve_quant
from volta_core.host.resolution.reasoning import check_no_text_lost

__all__ = [
    "candidate_order",
    "check_no_text_lost",
    "combine_verdicts",
    "refusal_reason",
    "require_accepted",
    "resolve_quant",
    "select_backend",
]
