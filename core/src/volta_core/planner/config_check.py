"""Checking a model's ``config.json`` before anything plans with it.

Two kinds of finding, because they call for different answers:

- A field of the wrong JSON type (a string layer count, a ``quantization_config`` that is a
  string, an ``ignore`` pattern that is not a regular expression) means the file is not a model
  config the tool can read: :class:`UsageError`, one line naming the field and the file (exit 2).
- A well-typed value the engine would refuse (zero or negative heads, KV heads that do not
  divide the heads, a missing ``num_attention_heads`` or ``hidden_size``, no layers, a
  ``layer_types`` list of the wrong length) is a *problem*: the plan prints it, naming the field
  and the file, and exits 1. It is never filled in with a default: transformers' defaults
  describe some other model, and a plan of some other model is worse than none.

Every field the plan reads is checked here, so describing the model afterwards cannot fail.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from volta_core.errors import UsageError

#: Fields read from the text section that must be positive integers when present.
_POSITIVE = (
    "intermediate_size",
    "vocab_size",
    "moe_intermediate_size",
    "global_head_dim",
    "linear_num_key_heads",
    "linear_key_head_dim",
    "linear_num_value_heads",
    "linear_value_head_dim",
)


@dataclass(frozen=True)
class ConfigCheck:
    """What checking found: problems the engine would refuse, notes, and whether the layers
    can be described at all (``False`` when a field they are built from is unusable)."""

    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    describable: bool = True


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type_error(where: str, field: str, expected: str, value: object) -> UsageError:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return UsageError(f"{where}: {field} must be {expected}, got {shown}")


def text_section(raw: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """The section holding the language model's fields (``text_config`` of multimodal models)."""
    text = raw.get("text_config")
    if text is None:
        return raw
    if not isinstance(text, Mapping):
        raise _type_error(where, "text_config", "a JSON object", text)
    return text


class _Checker:
    """Accumulates problems and notes for one file; raises :class:`UsageError` on wrong types."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.describable = True

    def problem(self, message: str, *, fatal: bool = True) -> None:
        """Record a problem; ``fatal`` ones leave the layers undescribed (the plan lists none)."""
        self.problems.append(f"{self.where}: {message}")
        self.describable = self.describable and not fatal

    def integer(self, section: Mapping[str, Any], name: str, *, nullable: bool = False) -> Any:
        value = section.get(name)
        if value is None and (nullable or name not in section):
            return None
        if not _is_int(value):
            raise _type_error(
                self.where, name, "an integer" + (" or null" if nullable else ""), value
            )
        return value

    def positive(self, section: Mapping[str, Any], name: str, *, required: bool = False) -> Any:
        """A positive integer; missing is a problem when ``required`` (never a default)."""
        value = self.integer(section, name, nullable=not required)
        if value is None:
            if required:
                self.problem(f"{name} is missing")
            return None
        if value < 1:
            self.problem(f"{name} must be at least 1, got {value}")
            return None
        return value

    def strings(self, section: Mapping[str, Any], name: str) -> list[str] | None:
        value = section.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _type_error(self.where, name, "a list of strings", value)
        return value

    def number(self, section: Mapping[str, Any], name: str) -> None:
        value = section.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _type_error(self.where, name, "a number or null", value)


def check_config(raw: Mapping[str, Any], where: str) -> ConfigCheck:
    """Check every field the plan reads; return what the engine would refuse.

    Raises :class:`UsageError` for a field of the wrong type (see the module docstring).
    """
    check = _Checker(where)
    if not isinstance(raw.get("model_type"), str):
        if "model_type" not in raw:
            raise UsageError(f"{where}: config has no model_type")
        raise _type_error(where, "model_type", "a string", raw.get("model_type"))
    check.strings(raw, "architectures")
    for name in ("torch_dtype", "dtype"):
        if raw.get(name) is not None and not isinstance(raw[name], str):
            raise _type_error(where, name, "a string or null", raw[name])
    _check_text(check, text_section(raw, where))
    _check_quantization(check, raw.get("quantization_config"))
    return ConfigCheck(tuple(check.problems), tuple(check.notes), check.describable)


def _check_text(check: _Checker, text: Mapping[str, Any]) -> None:
    layers = check.positive(text, "num_hidden_layers", required=True)
    heads = check.positive(text, "num_attention_heads", required=True)
    hidden = check.positive(text, "hidden_size", required=True)
    kv_heads = check.positive(text, "num_key_value_heads")
    head_dim = check.positive(text, "head_dim")
    for name in _POSITIVE:
        check.positive(text, name)
    experts = check.integer(text, "num_experts", nullable=True)
    if experts is not None and experts < 0:
        check.problem(f"num_experts must be at least 0, got {experts}")
    check.number(text, "attn_logit_softcapping")
    if heads and kv_heads and heads % kv_heads:
        check.problem(
            f"num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}",
            fatal=False,
        )
    if heads and hidden and head_dim is None and hidden % heads:
        check.problem(
            f"hidden_size {hidden} is not divisible by num_attention_heads {heads} and there "
            "is no head_dim"
        )
    layer_types = check.strings(text, "layer_types")
    if layer_types is not None and layers and len(layer_types) != layers:
        check.problem(
            f"layer_types has {len(layer_types)} entries for {layers} layers (num_hidden_layers)"
        )
    shared = check.integer(text, "num_kv_shared_layers", nullable=True)
    if shared is not None and layers and not 0 <= shared < layers:
        check.problem(f"num_kv_shared_layers {shared} is not between 0 and {layers - 1}")
    window = check.integer(text, "sliding_window", nullable=True)
    if window is not None and window < 1:
        check.problem(f"sliding_window must be at least 1 or null, got {window}")
    if window is None and layer_types and "sliding_attention" in layer_types:
        check.notes.append(
            "sliding_window is null: the sliding_attention layers attend to the whole context, "
            "as vLLM runs them"
        )


def _check_quantization(check: _Checker, section: object) -> None:
    if section is None or (isinstance(section, Mapping) and not section):
        return
    if not isinstance(section, Mapping):
        raise _type_error(check.where, "quantization_config", "a JSON object", section)
    method = section.get("quant_method")
    if method is None:
        check.problem("quantization_config has no quant_method", fatal=False)
    elif not isinstance(method, str):
        raise _type_error(check.where, "quantization_config.quant_method", "a string", method)
    ignore = section.get("ignore")
    if ignore is not None:
        if not isinstance(ignore, list) or not all(isinstance(v, str) for v in ignore):
            raise _type_error(
                check.where, "quantization_config.ignore", "a list of strings", ignore
            )
        for i, entry in enumerate(ignore):
            if entry.startswith("re:"):
                try:
                    re.compile(entry[3:])
                except re.error as exc:
                    raise UsageError(
                        f"{check.where}: quantization_config.ignore[{i}] {entry!r} is not a "
                        f"valid regular expression: {exc}"
                    ) from exc
    scheme = section.get("kv_cache_scheme")
    if scheme is not None and not isinstance(scheme, Mapping):
        raise _type_error(
            check.where, "quantization_config.kv_cache_scheme", "a JSON object", scheme
        )
    if isinstance(scheme, Mapping):
        _check_kv_scheme(check, scheme)
    if method == "compressed-tensors":
        _check_ct_groups(check, section.get("config_groups"))


def _check_kv_scheme(check: _Checker, scheme: Mapping[str, Any]) -> None:
    field = "quantization_config.kv_cache_scheme"
    for name in ("strategy", "type"):
        if scheme.get(name) is not None and not isinstance(scheme[name], str):
            raise _type_error(check.where, f"{field}.{name}", "a string", scheme[name])
    bits = scheme.get("num_bits")
    if bits is not None and not _is_int(bits):
        raise _type_error(check.where, f"{field}.num_bits", "an integer", bits)


#: Weight formats compressed-tensors checkpoints may use that some vLLM 0.32 kernel runs:
#: ``(type, bits)``. vLLM's WNA16 scheme table lists 2 to 8 bits, but its kernels (Marlin,
#: Machete, Exllama, the Triton W4A16 kernel) implement 4 and 8 only; float weights are fp8,
#: or fp4 (NVFP4/MXFP4).
CT_WEIGHT_FORMATS = frozenset({("int", 4), ("int", 8), ("float", 8), ("float", 4)})

#: Group sizes vLLM 0.32's weight-only kernels implement (``-1``: one group per channel).
CT_GROUP_SIZES = frozenset({-1, 16, 32, 64, 128, 256})


def _check_ct_groups(check: _Checker, groups: object) -> None:
    """compressed-tensors weight schemes the engine has a kernel for; the rest are problems."""
    field = "quantization_config.config_groups"
    if groups is None:
        return
    if not isinstance(groups, Mapping):
        raise _type_error(check.where, field, "a JSON object", groups)
    for key, group in groups.items():
        if not isinstance(group, Mapping):
            raise _type_error(check.where, f"{field}.{key}", "a JSON object", group)
        weights = group.get("weights")
        if weights is None:
            continue
        if not isinstance(weights, Mapping):
            raise _type_error(check.where, f"{field}.{key}.weights", "a JSON object", weights)
        bits, kind = weights.get("num_bits"), weights.get("type", "int")
        group_size = weights.get("group_size")
        if not _is_int(bits):
            raise _type_error(check.where, f"{field}.{key}.weights.num_bits", "an integer", bits)
        if not isinstance(kind, str):
            raise _type_error(check.where, f"{field}.{key}.weights.type", "a string", kind)
        if group_size is not None and not _is_int(group_size):
            raise _type_error(
                check.where, f"{field}.{key}.weights.group_size", "an integer or null", group_size
            )
        if (kind, bits) not in CT_WEIGHT_FORMATS:
            check.problem(
                f"{field}.{key}: {bits}-bit {kind} weights have no vLLM kernel "
                "(int 4 or 8, float 4 or 8)",
                fatal=False,
            )
        if group_size is not None and group_size not in CT_GROUP_SIZES:
            sizes = ", ".join(str(s) for s in sorted(CT_GROUP_SIZES))
            check.problem(
                f"{field}.{key}: group size {group_size} has no vLLM kernel (one of {sizes})",
                fatal=False,
            )
