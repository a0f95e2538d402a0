"""What a checkpoint's ``quantization_config`` says, read the way the checkpoint states it.

One reading for everyone: the plan command and the vLLM adapter both describe a checkpoint's
weights and KV scales through these functions, so the KV verdict a user sees in the plan is
the one the engine applies.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import re
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from volta_core.errors import UsageError
from volta_core.host.types import CheckpointKV, KVScaleScheme, QuantConfig

#: compressed-tensors ``kv_cache_scheme.strategy`` values and the scale layout each means.
_CT_KV_STRATEGIES: dict[str, KVScaleScheme] = {
    "tensor": KVScaleScheme.PER_TENSOR,
    "attn_head": KVScaleScheme.PER_ATTENTION_HEAD,
}


def quant_config(raw: object) -> QuantConfig | None:
    """Wrap a ``quantization_config`` section; None for an unquantized checkpoint.

    A section that is not a mapping is treated as absent here; ``vllm-volta plan`` refuses it
    beforehand (:mod:`volta_core.planner.config_check`) with a line naming the field.
    """
    if not isinstance(raw, Mapping) or not raw:
        return None
    method = raw.get("quant_method")
    if not isinstance(method, str) or not method:
        return QuantConfig("unknown", raw)
    return QuantConfig(method, raw)


#: Longest ``re:`` pattern of an ``ignore`` list (real ones are a few dozen characters).
MAX_PATTERN_CHARS = 256
#: Most variable-length repetitions (``*``, ``+``, ``?``, ``{m,n}``) in one pattern: a failed
#: match of a backtracking engine tries every way to split the name between them, a count that
#: grows as the name's length to this power.
MAX_VARIABLE_REPEATS = 3

# Python's own pattern parser (``sre_parse``, ``re._parser`` from 3.11), to judge a pattern's
# shape before it is matched.
_sre_parse: Any = importlib.import_module(
    "re._parser" if sys.version_info >= (3, 11) else "sre_parse"
)
_REPEATS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"})


class _Refused(Exception):
    pass


def _variable_parts(items: Any) -> tuple[int, bool]:
    """The variable-length repetitions under ``items`` (a parsed pattern) and whether any
    alternation is; :class:`_Refused` for a backreference or a nested repetition."""
    repeats, branches = 0, False
    for op, arg in items:
        name = str(op)
        if name in {"GROUPREF", "GROUPREF_EXISTS"}:
            raise _Refused("a backreference")
        children: list[Any] = []
        if name in _REPEATS:
            low, high, body = arg
            inner, inner_branches = _variable_parts(body)
            if high > 1 and (inner or inner_branches):
                raise _Refused(
                    "a repetition of a group that itself repeats or alternates, which "
                    "backtracks exponentially"
                )
            repeats += inner + (low != high)
            branches = branches or inner_branches
            continue
        if name == "SUBPATTERN":
            children = [arg[-1]]
        elif name == "BRANCH":
            children, branches = list(arg[1]), True
        elif name in {"ASSERT", "ASSERT_NOT"}:
            children = [arg[1]]
        elif name == "ATOMIC_GROUP":
            children = [arg]
        for child in children:
            inner, inner_branches = _variable_parts(child)
            repeats, branches = repeats + inner, branches or inner_branches
    return repeats, branches


def ignore_pattern_refusal(pattern: str) -> str | None:
    """Why the ``re:`` pattern ``pattern`` (without its prefix) is refused, or None.

    Python's ``re`` backtracks and has no time limit, so a pattern is matched only when its
    shape bounds the work: at most :data:`MAX_PATTERN_CHARS` characters, no backreference, no
    repetition of something that itself repeats or alternates (``(a+)+``, ``(a|ab)*``: the
    exponential cases), at most :data:`MAX_VARIABLE_REPEATS` variable-length repetitions.
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"longer than {MAX_PATTERN_CHARS} characters"
    try:
        parsed = _sre_parse.parse(pattern)
    except re.error as exc:
        return f"not a valid regular expression: {exc}"
    except RecursionError:
        return "nested too deeply"
    try:
        repeats, _ = _variable_parts(parsed)
    except _Refused as exc:
        return f"it has {exc}"
    if repeats > MAX_VARIABLE_REPEATS:
        return f"it has {repeats} variable-length repetitions (at most {MAX_VARIABLE_REPEATS})"
    return None


@functools.lru_cache(maxsize=256)
def _ignore_regex(pattern: str) -> re.Pattern[str] | None:
    return None if ignore_pattern_refusal(pattern) else re.compile(pattern)


class _MatchBudget:
    def __init__(self, seconds: float) -> None:
        self.left = seconds


_budget: contextvars.ContextVar[_MatchBudget | None] = contextvars.ContextVar(
    "volta_ignore_match_budget", default=None
)


@contextlib.contextmanager
def ignore_match_budget(seconds: float) -> Iterator[None]:
    """Within this block, :func:`is_ignored` spends at most ``seconds`` matching ``re:``
    patterns in all, then raises :class:`UsageError` naming the pattern: the command line's
    bound on a checkpoint's patterns, whatever their number and the model's size."""
    token = _budget.set(_MatchBudget(seconds))
    try:
        yield
    finally:
        _budget.reset(token)


def is_ignored(config: QuantConfig, prefix: str) -> bool:
    """Whether the checkpoint keeps module ``prefix`` unquantized (its ``ignore`` list).

    Entries are exact module names or ``re:`` patterns matched against the whole name, the way
    compressed-tensors matches them; a pattern :func:`ignore_pattern_refusal` refuses (the
    config check reports it) or that is invalid never matches.
    """
    budget = _budget.get()
    for entry in config.ignore:
        if not isinstance(entry, str):
            continue
        if entry.startswith("re:"):
            pattern = _ignore_regex(entry[3:])
            if pattern is None:
                continue
            start = time.perf_counter()
            matched = pattern.match(prefix) is not None
            if budget is not None:
                budget.left -= time.perf_counter() - start
                if budget.left < 0:
                    raise UsageError(
                        f"quantization_config.ignore: matching {entry[:80]!r} against the "
                        "model's module names takes too long; simplify the pattern"
                    )
            if matched:
                return True
        elif entry == prefix:
            return True
    return False


#: AWQ and GPTQ ``quant_method`` names (and vLLM's Marlin and "auto" variants of them).
_AWQ_GPTQ = frozenset({"awq", "awq_marlin", "auto_awq", "gptq", "gptq_marlin", "auto_gptq"})


def unquantized_reason(config: QuantConfig, prefix: str) -> str | None:
    """Why the engine runs module ``prefix`` of a quantized checkpoint unquantized, or None when
    it is quantized: the checkpoint's ``ignore`` list (:func:`is_ignored`); for vLLM's ``fp8``
    method its ``ignored_layers`` (``modules_to_not_convert``) by exact name, and the output head,
    which ``Fp8Config`` never quantizes (it quantizes linear layers; ``lm_head`` is a
    ``ParallelLMHead`` there); for AWQ and GPTQ the output head unless the config sets
    ``lm_head``."""
    if is_ignored(config, prefix):
        return "in the checkpoint's ignore list"
    is_head = prefix.rsplit(".", 1)[-1] == "lm_head"
    if config.method in _AWQ_GPTQ and is_head and not config.raw.get("lm_head"):
        return f"vLLM's {config.method} method quantizes the output head only with lm_head set"
    if config.method != "fp8":
        return None
    if prefix.rsplit(".", 1)[-1] == "lm_head":
        return "vLLM's fp8 method quantizes linear layers, not the output head"
    skipped = config.raw.get("ignored_layers") or config.raw.get("modules_to_not_convert") or ()
    if isinstance(skipped, list | tuple) and prefix in skipped:
        return "in the checkpoint's ignored layers"
    return None


def _ct_weight_format(raw: Mapping[str, Any]) -> str:
    """The weight format of a compressed-tensors checkpoint (``int4``, ``fp8``, ``int8``...)."""
    formats = set()
    groups = raw.get("config_groups")
    for group in groups.values() if isinstance(groups, Mapping) else ():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            continue
        bits, kind = weights.get("num_bits"), weights.get("type", "int")
        if bits:
            formats.add(f"{'fp' if kind == 'float' else 'int'}{bits}")
    return "+".join(sorted(formats)) or "fp16"


def weight_format(config: QuantConfig | None) -> str:
    """A short name for how the weights are stored: ``fp16``, ``fp8``, ``int4``..."""
    if config is None:
        return "fp16"
    if config.method == "compressed-tensors":
        return _ct_weight_format(config.raw)
    if config.method in {"fp8", "fbgemm_fp8", "modelopt"}:
        return "fp8"
    bits = config.raw.get("bits") or config.raw.get("w_bit")
    return f"int{bits}" if bits else config.method


def checkpoint_kv(config: QuantConfig | None) -> CheckpointKV:
    """What the checkpoint ships for the KV cache: scale layout and the dtype they were made for.

    compressed-tensors states it in ``kv_cache_scheme`` (``strategy`` tensor or attn_head; an
    8-bit float scheme is calibrated for e4m3, the format llm-compressor produces). Dense fp8
    checkpoints from other tools state ``kv_cache_quant_algo``/``kv_cache_scheme`` likewise.
    """
    fmt = weight_format(config)
    if config is None:
        return CheckpointKV(weight_format=fmt, source="unquantized checkpoint")
    scheme = config.kv_cache_scheme
    if scheme is not None:
        strategy = str(scheme.get("strategy", "tensor"))
        layout = _CT_KV_STRATEGIES.get(strategy)
        if layout is None:
            known = ", ".join(sorted(_CT_KV_STRATEGIES))
            raise UsageError(f"kv_cache_scheme strategy {strategy!r} is not one of: {known}")
        kind, bits = scheme.get("type", "float"), scheme.get("num_bits", 8)
        calibrated = "fp8_e4m3" if (kind, bits) == ("float", 8) else f"{kind}{bits}"
        return CheckpointKV(
            layout, calibrated, fmt, f"{config.method} kv_cache_scheme ({strategy})"
        )
    algo = config.raw.get("kv_cache_quant_algo")
    if isinstance(algo, str) and algo.upper() == "FP8":
        return CheckpointKV(KVScaleScheme.PER_TENSOR, "fp8_e4m3", fmt, "kv_cache_quant_algo FP8")
    return CheckpointKV(weight_format=fmt, source=f"{config.method}: no KV-cache scales")
