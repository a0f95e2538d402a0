"""A model's layers as the plan needs them, read from its ``config.json`` through transformers.

transformers (imported lazily) resolves per-layer attributes (Gemma-4's 256-dim sliding and
512-dim global layers come back as ``per_layer_config``); the ``quantization_config`` section is
taken from the file exactly as the checkpoint states it.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import logging
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from volta_core.errors import UsageError
from volta_core.host.checkpoint import quant_config
from volta_core.host.types import (
    AttentionFeature,
    LayerKind,
    QuantConfig,
    QuantLayer,
    TensorSplit,
)
from volta_core.planner import model_files
from volta_core.planner.config_check import LAYER_FIELDS, check_config

#: Layer types (``config.layer_types``) that attend with a paged KV cache.
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "attention"})

#: Model types whose full-attention q_proj also produces an output gate (twice the width).
GATED_QUERY_MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"})

_EXAMPLES = "volta_core.planner.examples"


def example_names() -> list[str]:
    """Names of the bundled example configs (file stems under ``volta_core/planner/examples``)."""
    folder = resources.files(_EXAMPLES)
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def read_config(target: str) -> tuple[str, dict[str, Any]]:
    """Read ``target`` (a model directory, a ``config.json`` or an example name) as a dict.

    Returns a display name and the parsed JSON. Raises :class:`UsageError` with one accurate
    line for a missing path, a symbolic link loop, something that is not a regular file (a FIFO,
    ``/dev/null``: reading those would block or read nothing), a directory's ``config.json`` that
    resolves outside it, a file over :data:`~volta_core.planner.model_files.MAX_CONFIG_BYTES`,
    bytes that are not UTF-8, malformed JSON (:func:`~volta_core.planner.model_files.loads`), or
    an unknown example name (listing the known ones).
    """
    path = Path(target)
    kind = _file_kind(path, target)
    directory = path if kind == "directory" else None
    if directory is not None:
        path = directory / "config.json"
        kind = _file_kind(path, str(path))
        if kind == "missing":
            raise UsageError(f"{target}: directory has no config.json")
    if kind == "missing":
        if path.suffix == ".json" or "/" in target or target.startswith("."):
            raise UsageError(f"{target}: no such file or directory")
        if target not in example_names():
            known = ", ".join(example_names())
            raise UsageError(f"{target!r} is not a path nor a bundled example (examples: {known})")
        text = resources.files(_EXAMPLES).joinpath(f"{target}.json").read_text()
        return f"example {target}", _parse(text, target)
    if kind != "file":
        raise UsageError(f"{path}: not a regular file ({kind})")
    if directory is not None:  # a directory's config.json must stay inside it
        model_files.confined(directory, path.name, target)
    data = model_files.read_capped(path, model_files.MAX_CONFIG_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path}: not UTF-8 text (byte {exc.start}); a config.json is JSON text"
        ) from exc
    return target, _parse(text, str(path))


def _file_kind(path: Path, shown: str) -> str:
    """``file``, ``directory``, ``missing``, or what else ``path`` is (following links)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            raise UsageError(f"{shown}: broken symbolic link") from None
        return "missing"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{shown}: symbolic link loop") from None
        raise UsageError(f"{shown}: cannot read: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def _parse(text: str, where: str) -> dict[str, Any]:
    data = model_files.loads(text, where)
    if not isinstance(data, dict):
        raise UsageError(f"{where}: a config.json must hold a JSON object")
    return data


@dataclass(frozen=True)
class ModelLayer:
    """One decoder layer: attention layers carry their shape; others only their type."""

    index: int
    layer_type: str
    prefix: str
    head_size: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    sliding_window: int | None = None
    features: frozenset[AttentionFeature] = frozenset()
    owns_kv_cache: bool = True
    """False for layers that reuse another layer's KV cache (Gemma's KV-shared layers)."""

    @property
    def is_attention(self) -> bool:
        return self.layer_type in ATTENTION_LAYER_TYPES


@dataclass(frozen=True)
class ModelDescription:
    """What the plan resolves: layers, representative linear modules, quantization, dtype."""

    name: str
    model_type: str
    architectures: tuple[str, ...]
    dtype: str
    layers: tuple[ModelLayer, ...]
    linear_modules: tuple[QuantLayer, ...]
    quant: QuantConfig | None
    problems: tuple[str, ...] = ()
    """What the engine would refuse in the config itself, each naming the field and the file."""
    notes: tuple[str, ...] = ()


class _DropTorchAdvice(logging.Filter):
    """Drops transformers' "PyTorch was not found" advice: the plan needs no torch, and stderr
    carries only the project's own lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "PyTorch was not found" not in record.getMessage()


@contextlib.contextmanager
def _quiet_transformers_import() -> Iterator[None]:
    logger = logging.getLogger("transformers")
    advice = _DropTorchAdvice()
    logger.addFilter(advice)
    try:
        yield
    finally:
        logger.removeFilter(advice)


def _known_model_types() -> Any:
    with _quiet_transformers_import():
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    return CONFIG_MAPPING_NAMES


def _load_transformers_config(raw: Mapping[str, Any], name: str) -> Any:
    model_type = str(raw["model_type"])
    known = _known_model_types()
    if model_type not in known:
        closest = difflib.get_close_matches(model_type, list(known), n=3, cutoff=0.6)
        hint = f" (closest: {', '.join(closest)})" if closest else ""
        raise UsageError(f"{name}: unknown model_type {model_type!r}{hint}")
    with _quiet_transformers_import():
        from transformers import AutoConfig
    fields = {k: v for k, v in raw.items() if k not in {"model_type", "quantization_config"}}
    try:
        return AutoConfig.for_model(model_type, **fields)
    except Exception as exc:  # transformers' own validation, in whatever type it raises
        detail = " ".join(str(exc).split())
        if len(detail) > 200:
            detail = detail[:197] + "..."
        raise UsageError(f"{name}: transformers cannot read this config: {detail}") from exc


def text_config(name: str, raw: Mapping[str, Any]) -> Any:
    """transformers' text (decoder) config of a parsed ``config.json``, as
    :func:`describe_model` reads it: hidden and vocabulary sizes for the memory fit."""
    return _load_transformers_config(raw, name).get_text_config()


def _dtype_name(value: Any) -> str:
    text = str(value or "float16").removeprefix("torch.")
    return {"half": "float16", "bf16": "bfloat16", "fp16": "float16"}.get(text, text)


def describe_model(name: str, raw: Mapping[str, Any]) -> ModelDescription:
    """Describe a model from its parsed ``config.json``.

    The config is checked first (:func:`volta_core.planner.config_check.check_config`): a field
    of the wrong type raises :class:`UsageError`; values the engine would refuse come back in
    ``problems`` (with no layers when the layers cannot be built from them).
    """
    check = check_config(raw, name)
    quant = quant_config(raw.get("quantization_config"))
    if not check.describable:
        return ModelDescription(
            name=name,
            model_type=str(raw["model_type"]),
            architectures=tuple(raw.get("architectures") or ()),
            dtype=_dtype_name(raw.get("torch_dtype") or raw.get("dtype")),
            layers=(),
            linear_modules=(),
            quant=quant,
            problems=check.problems,
            notes=check.notes,
        )
    config = _load_transformers_config(raw, name)
    text = config.get_text_config()
    base = "model.language_model" if text is not config else "model"
    num_layers = int(text.num_hidden_layers)
    layer_types = list(getattr(text, "layer_types", None) or ["full_attention"] * num_layers)
    shared = int(getattr(text, "num_kv_shared_layers", 0) or 0)
    soft_cap = getattr(text, "attn_logit_softcapping", None)
    window = getattr(text, "sliding_window", None)
    layers = []
    for i in range(num_layers):
        layer_cfg = _layer_attention(text, i, layer_types[i])
        layer_type = layer_types[i]
        prefix = f"{base}.layers.{i}"
        if layer_type not in ATTENTION_LAYER_TYPES:
            layers.append(ModelLayer(i, layer_type, prefix))
            continue
        heads = int(layer_cfg.num_attention_heads)
        head_size = int(getattr(layer_cfg, "head_dim", None) or text.hidden_size // heads)
        # A sliding layer with no window attends to the whole context (vLLM runs it so).
        sliding = layer_type == "sliding_attention" and window is not None
        features = set()
        if sliding:
            features.add(AttentionFeature.SLIDING_WINDOW)
        if soft_cap:
            features.add(AttentionFeature.LOGITS_SOFT_CAP)
        layers.append(
            ModelLayer(
                i,
                layer_type,
                f"{prefix}.self_attn.attn",
                head_size=head_size,
                num_heads=heads,
                num_kv_heads=int(layer_cfg.num_key_value_heads or heads),
                sliding_window=int(window) if sliding and window is not None else None,
                features=frozenset(features),
                owns_kv_cache=i < num_layers - shared,
            )
        )
    dtype = _dtype_name(raw.get("torch_dtype") or raw.get("dtype") or getattr(text, "dtype", None))
    return ModelDescription(
        name=name,
        model_type=str(raw["model_type"]),
        architectures=tuple(raw.get("architectures") or ()),
        dtype=dtype,
        layers=tuple(layers),
        linear_modules=_linear_modules(text, base, layers),
        quant=quant,
        problems=check.problems,
        notes=check.notes,
    )


def _layer_attention(text: Any, index: int, layer_type: str) -> SimpleNamespace:
    """One layer's attention fields (``num_attention_heads``, ``head_dim``,
    ``num_key_value_heads``; None where the config has none).

    transformers 5.14+ resolves them per layer (``per_layer_config``: Gemma-4's 512-dim global
    layers). Earlier releases, which vLLM 0.19 and 1Cat-vLLM need for Gemma-4 (their model code
    reads ``head_dim`` and ``global_head_dim`` from the config itself), keep a global layer's
    head size in ``global_head_dim`` and its KV heads in ``num_global_key_value_heads`` (used
    where ``attention_k_eq_v`` is set), and keep a newer config's ``per_layer_config`` as the
    plain mapping it was written as.
    """
    per_layer = getattr(text, "per_layer_config", None)
    if per_layer is not None and not isinstance(per_layer, Mapping):
        layer = per_layer[index]
        return SimpleNamespace(**{name: getattr(layer, name, None) for name in LAYER_FIELDS})
    fields = {name: getattr(text, name, None) for name in LAYER_FIELDS}
    if isinstance(per_layer, Mapping):
        overrides = {int(k): v for k, v in per_layer.items()}.get(index) or {}
        fields.update({k: v for k, v in overrides.items() if k in LAYER_FIELDS})
    elif layer_type == "full_attention" and getattr(text, "global_head_dim", None):
        fields["head_dim"] = text.global_head_dim
        global_kv = getattr(text, "num_global_key_value_heads", None)
        if global_kv and getattr(text, "attention_k_eq_v", False):
            fields["num_key_value_heads"] = global_kv
    return SimpleNamespace(**fields)


def _row_parallel(prefix: str, input_size: int, output_size: int) -> QuantLayer:
    """A linear module vLLM builds as ``RowParallelLinear`` (its inputs divided across the
    tensor-parallel ranks): the attention output, the MLP's down projection, the linear
    attention's output (vLLM's ``models/qwen2.py`` MLP, ``qwen3.py`` attention,
    ``qwen3_next.py`` linear attention)."""
    return QuantLayer(LayerKind.LINEAR, prefix, input_size, output_size, split=TensorSplit.INPUT)


def _linear_modules(text: Any, base: str, layers: list[ModelLayer]) -> tuple[QuantLayer, ...]:
    """One representative module per linear-layer kind (from the first layer of each type),
    split as vLLM splits it across tensor-parallel ranks (the plan sets the size): the router
    replicated (``ReplicatedLinear`` in vLLM's ``models/qwen3_moe.py``), the projections into
    attention and the MLP by output rows, those out of them by inputs."""
    hidden = int(text.hidden_size)
    gated = 2 if str(getattr(text, "model_type", "")) in GATED_QUERY_MODEL_TYPES else 1
    modules: list[QuantLayer] = []
    seen: set[str] = set()
    for layer in layers:
        if layer.layer_type in seen:
            continue
        seen.add(layer.layer_type)
        prefix = f"{base}.layers.{layer.index}"
        if layer.is_attention:
            q, kv = layer.num_heads * layer.head_size, layer.num_kv_heads * layer.head_size
            for proj, inp, out in (("q", hidden, gated * q), ("k", hidden, kv), ("v", hidden, kv)):
                modules.append(
                    QuantLayer(LayerKind.LINEAR, f"{prefix}.self_attn.{proj}_proj", inp, out)
                )
            modules.append(_row_parallel(f"{prefix}.self_attn.o_proj", q, hidden))
            modules.append(QuantLayer(LayerKind.ATTENTION, f"{prefix}.self_attn.attn"))
        elif layer.layer_type == "linear_attention":
            key = int(text.linear_num_key_heads) * int(text.linear_key_head_dim)
            value = int(text.linear_num_value_heads) * int(text.linear_value_head_dim)
            la = f"{prefix}.linear_attn"
            modules.append(
                QuantLayer(LayerKind.LINEAR, f"{la}.in_proj_qkvz", hidden, 2 * key + 2 * value)
            )
            modules.append(
                QuantLayer(
                    LayerKind.LINEAR,
                    f"{la}.in_proj_ba",
                    hidden,
                    2 * int(text.linear_num_value_heads),
                )
            )
            modules.append(_row_parallel(f"{la}.out_proj", value, hidden))
    first = f"{base}.layers.0.mlp"
    experts = getattr(text, "num_experts", None)
    if experts:
        moe = int(getattr(text, "moe_intermediate_size", None) or text.intermediate_size)
        modules.append(
            QuantLayer(
                LayerKind.LINEAR, f"{first}.gate", hidden, int(experts), split=TensorSplit.NONE
            )
        )
        top_k = int(getattr(text, "num_experts_per_tok", 0) or 0)
        modules.append(
            QuantLayer(LayerKind.FUSED_MOE, f"{first}.experts", hidden, moe, int(experts), top_k)
        )
    else:
        inter = int(text.intermediate_size)
        modules.append(QuantLayer(LayerKind.LINEAR, f"{first}.gate_proj", hidden, inter))
        modules.append(QuantLayer(LayerKind.LINEAR, f"{first}.up_proj", hidden, inter))
        modules.append(_row_parallel(f"{first}.down_proj", inter, hidden))
    modules.append(QuantLayer(LayerKind.LINEAR, "lm_head", hidden, int(text.vocab_size)))
    return tuple(modules)
