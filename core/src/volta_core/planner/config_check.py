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

- An integer past its bound in :data:`BOUNDS` (a billion layers, a vocabulary of 10^30) is also
  a :class:`UsageError`: no model has it, and planning it would run for hours.

Every field the plan reads is checked here, so describing the model afterwards cannot fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from volta_core.errors import UsageError
from volta_core.host.checkpoint import ignore_pattern_refusal

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


#: The largest value of each integer field the plan reads, far above any published model (the
#: largest have about 130 layers, 128 heads, a 16k hidden size, a 256k vocabulary, 10M
#: positions, 512 experts) and low enough that planning one takes well under a second. The
#: README's "Reliability" section lists them.
BOUNDS: dict[str, int] = {
    "num_hidden_layers": 1024,
    "mtp_num_hidden_layers": 1024,
    "num_kv_shared_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "num_global_key_value_heads": 1024,
    "linear_num_key_heads": 1024,
    "linear_num_value_heads": 1024,
    "head_dim": 4096,
    "global_head_dim": 4096,
    "linear_key_head_dim": 4096,
    "linear_value_head_dim": 4096,
    "linear_conv_kernel_dim": 4096,
    "hidden_size": 2**17,
    "intermediate_size": 2**20,
    "moe_intermediate_size": 2**20,
    "shared_expert_intermediate_size": 2**20,
    "vocab_size": 2**24,
    "num_experts": 2**16,
    "n_routed_experts": 2**16,
    "num_experts_per_tok": 2**16,
    "max_position_embeddings": 2**24,
    "sliding_window": 2**24,
}

#: Fields read as non-negative integers (or null) besides those checked for meaning below.
_COUNTS = (
    "mtp_num_hidden_layers",
    "num_global_key_value_heads",
    "linear_conv_kernel_dim",
    "shared_expert_intermediate_size",
    "n_routed_experts",
    "num_experts_per_tok",
    "max_position_embeddings",
)

#: Bound of the integers of ``vision_config`` and of a quantization scheme's sizes.
MAX_SECTION_INT = 2**24

#: Most bits of a quantized weight or KV-cache element.
MAX_BITS = 64


@dataclass(frozen=True)
class ConfigCheck:
    """What checking found: problems the engine would refuse, notes, and whether the layers
    can be described at all (``False`` when a field they are built from is unusable)."""

    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    describable: bool = True


def _is_int(value: object) -> TypeGuard[int]:
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
        bound = BOUNDS.get(name)
        if bound is not None and value > bound:
            raise UsageError(
                f"{self.where}: {name} {value} is above {bound}, the largest vllm-volta plans"
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

    def strings(
        self, section: Mapping[str, Any], name: str, field: str | None = None
    ) -> list[str] | None:
        value = section.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _type_error(self.where, field or name, "a list of strings", value)
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
    text = text_section(raw, where)
    _check_text(check, text)
    _check_per_layer(check, text.get("per_layer_config"), text.get("num_hidden_layers"))
    _check_vision(check, raw.get("vision_config"))
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
    for name in _COUNTS:
        count = check.integer(text, name, nullable=True)
        if count is not None and count < 0:
            raise _type_error(check.where, name, "a non-negative integer or null", count)
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
            refusal = ignore_pattern_refusal(entry[3:]) if entry.startswith("re:") else None
            if refusal is not None:
                raise UsageError(
                    f"{check.where}: quantization_config.ignore[{i}] {entry[:60]!r} is refused: "
                    f"{refusal}"
                )
    _check_method_fields(check, section)
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
    _bits(check, scheme, f"{field}.num_bits", "num_bits")


def _bits(check: _Checker, section: Mapping[str, Any], field: str, name: str) -> None:
    bits = section.get(name)
    if bits is not None and (not _is_int(bits) or not 0 <= bits <= MAX_BITS):
        raise _type_error(check.where, field, f"an integer from 0 to {MAX_BITS}", bits)


def _size(check: _Checker, section: Mapping[str, Any], field: str, name: str) -> None:
    """A group or block size: an integer of at most :data:`MAX_SECTION_INT` (-1: per channel)."""
    size = section.get(name)
    if size is not None and (not _is_int(size) or not -1 <= size <= MAX_SECTION_INT):
        raise _type_error(check.where, field, f"an integer from -1 to {MAX_SECTION_INT}", size)


def _check_method_fields(check: _Checker, section: Mapping[str, Any]) -> None:
    """The fields of the fp8, GPTQ and AWQ sections the weight estimate reads."""
    field = "quantization_config"
    for name in ("modules_to_not_convert", "ignored_layers"):
        check.strings(section, name, f"{field}.{name}")
    for name in ("bits", "w_bit"):
        _bits(check, section, f"{field}.{name}", name)
    for name in ("group_size", "q_group_size"):
        _size(check, section, f"{field}.{name}", name)
    block = section.get("weight_block_size")
    if block is not None and (
        not isinstance(block, list)
        or len(block) != 2
        or not all(_is_int(b) and 1 <= b <= MAX_SECTION_INT for b in block)
    ):
        raise _type_error(
            check.where, f"{field}.weight_block_size", "two positive integers or null", block
        )


def _check_per_layer(check: _Checker, section: object, layers: object) -> None:
    """transformers' ``per_layer_config``: layer index -> the attention fields it overrides."""
    if section is None:
        return
    if not isinstance(section, Mapping):
        raise _type_error(check.where, "per_layer_config", "a JSON object", section)
    count = layers if _is_int(layers) else 0
    for key, overrides in section.items():
        if not (key.isdecimal() and len(key) < 6 and int(key) < count):
            raise UsageError(
                f"{check.where}: per_layer_config key {key[:20]!r} is not a layer index "
                f"below num_hidden_layers"
            )
        if not isinstance(overrides, Mapping):
            raise _type_error(check.where, f"per_layer_config.{key}", "a JSON object", overrides)
        for name in LAYER_FIELDS:
            value = check.integer(overrides, name, nullable=True)
            if value is not None and value < 1:
                raise _type_error(
                    check.where, f"per_layer_config.{key}.{name}", "a positive integer", value
                )


#: The attention fields a layer may override (transformers' per-layer configs).
LAYER_FIELDS = ("num_attention_heads", "head_dim", "num_key_value_heads")

#: The integers of a Qwen-VL-style ``vision_config`` the weight estimate reads.
VISION_FIELDS = (
    "depth",
    "hidden_size",
    "intermediate_size",
    "in_channels",
    "temporal_patch_size",
    "patch_size",
    "num_position_embeddings",
    "spatial_merge_size",
    "out_hidden_size",
)


def _check_vision(check: _Checker, section: object) -> None:
    """Numbers of ``vision_config`` within :data:`MAX_SECTION_INT` (others are not read)."""
    if not isinstance(section, Mapping):
        return
    for name in VISION_FIELDS:
        value = section.get(name)
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and not -MAX_SECTION_INT <= value <= MAX_SECTION_INT
        ):
            raise _type_error(
                check.where, f"vision_config.{name}", f"at most {MAX_SECTION_INT}", value
            )


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
        _bits(check, weights, f"{field}.{key}.weights.num_bits", "num_bits")
        _size(check, weights, f"{field}.{key}.weights.group_size", "group_size")
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
