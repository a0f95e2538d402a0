"""The vLLM side for fused MoE experts of FP8 checkpoints: a ``FusedMoEMethodBase`` (this module
imports vLLM).

After vLLM's router has picked ``topk_ids`` and ``topk_weights``,
:func:`volta_fp8w.experts.experts_forward` runs the routed pairs: up to 16 tokens through GEMV
launches straight from the ids, more through the routed blocks' grouped GEMMs; neither
reads anything back to the host, so vLLM can capture decode steps. On a V100 the routed blocks run
on the tensor cores (CUDA, NVRTC), whose builds load when the weights are processed. On CPU each
expert's tokens go through its dequantized weights.

Weights are registered under upstream's parameter names, in the checkpoint's dtype and
orientation (``[experts, out, in]``): ``w13_weight`` / ``w2_weight`` float8_e4m3fn, and
``w13_<scale>`` / ``w2_<scale>`` float32 where ``<scale>`` is ``weight_scale_inv`` for vLLM
``fp8`` blocks and ``weight_scale`` otherwise (blocks ``[E, 2 * ceil(inter / block_n),
ceil(hidden / block_k)]`` and ``[E, ceil(hidden / block_n), ceil(inter / block_k)]``; channel
``[E, 2 * inter, 1]`` and ``[E, hidden, 1]``; tensor ``[E, 2]`` and ``[E]``), with the
attributes vLLM's ``RoutedExperts.weight_loader`` reads (``quant_method`` the
``FusedMoeWeightScaleSupported`` value of the strategy on the scales, ``is_transposed`` False),
so that loader places gate/up/down of every expert and shards them for tensor parallelism (a
block scale with its weight's blocks). A checkpoint's static ``input_scale`` is loaded into
``w13_input_scale`` / ``w2_input_scale`` and dropped (the kernels take fp16 activations).

Each tensor passes a checking loader first (whole, before sharding: an e5m2 or non-float8 weight
is refused there, before vLLM's copy would convert it; scale shapes and values), and after
loading every expert is checked again (NaN codes, scales) and moved to the kernels' layout by
:func:`volta_fp8w.experts.stack_experts` without copying the codes; the checkpoint tensors are
released.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from vllm.model_executor.layers.fused_moe import (
    FusedMoEConfig,
    FusedMoEMethodBase,
    MoEActivation,
)
from vllm.model_executor.layers.fused_moe.config import FusedMoEQuantConfig
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

from volta_core import QuantConfig, QuantLayer
from volta_fp8w.experts import ExpertWeights, experts_forward, stack_experts, warm_up
from volta_fp8w.layout import SCALE_DTYPES, Fp8Weights, WeightFormatError, check_block, check_scales
from volta_fp8w.scheme import (
    COMPRESSED_TENSORS,
    EXPERT_PROJECTIONS,
    FP8,
    Fp8Scheme,
    Unsupported,
    expert_blocks_reason,
    layer_scheme,
    quant_layer_scheme,
)

logger = logging.getLogger(__name__)

#: vLLM's ``FusedMoeWeightScaleSupported`` values, by strategy (the loader's ``quant_method``).
SCALE_LOADING = {"block": "block", "channel": "channel", "tensor": "tensor"}


def make_moe_method(
    *, volta_config: QuantConfig, layer: QuantLayer, engine_config: Any = None
) -> QuantizeMethodBase | None:
    """The factory named by the plugin's MoE claims (the adapter's contract).

    The scheme is read again with vLLM's ignore list (``ignored_layers`` of an ``fp8`` config,
    ``ignore`` of a compressed-tensors one, mapped to vLLM's module names). Experts that list
    ignores are left to vLLM (None: the adapter then asks vLLM's own config, which gives them
    its unquantized method).
    """
    method = volta_config.raw.get("quant_method")
    ignore = getattr(engine_config, "ignored_layers" if method == FP8 else "ignore", None)
    ignore = list(ignore) if ignore else None
    scheme = quant_layer_scheme(volta_config.raw, layer, ignore=ignore)
    if scheme is None:
        return None
    if isinstance(scheme, Unsupported):
        raise WeightFormatError(f"layer {layer.prefix}: fp8w cannot run it: {scheme.reason}")
    return Fp8MoEMethod(scheme, layer.prefix, volta_config.raw, ignore)


@dataclass(frozen=True)
class _Sizes:
    """One rank's sizes: ``hidden`` in and out, ``inter`` the intermediate per rank."""

    hidden: int
    inter: int
    tp: int

    def full(self, shard: str) -> tuple[int, int]:
        """The whole checkpoint projection's (out, in) for shard ``w1``/``w3``/``w2``."""
        if shard == "w2":
            return self.hidden, self.inter * self.tp
        return self.inter * self.tp, self.hidden


class Fp8MoEMethod(FusedMoEMethodBase):
    """Fused MoE experts with FP8 e4m3 weights, run weight-only (fp16 activations) by the kernels
    of :func:`volta_fp8w.experts.experts_forward`.

    ``apply`` is reached through the family's runner after routing (vLLM 0.32's
    ``RoutedExperts.forward_modular``; 0.19's ``FusedMoE`` passes ``shared_experts_input`` only,
    1Cat-vLLM's ``shared_experts`` too, hence ``apply``'s open arguments): the method builds no
    modular kernel
    (``moe_kernel`` stays None, so ``is_monolithic`` and ``supports_internal_mk`` are False and
    the runner computes shared experts itself) and returns the routed output unreduced (the
    runner all-reduces it over tensor parallelism).
    """

    def __init__(
        self,
        scheme: Fp8Scheme,
        prefix: str,
        raw: Mapping[str, Any],
        ignore: Sequence[str] | None = None,
    ) -> None:
        # The adapter's factory gets no vLLM layer, so the layer's FusedMoEConfig is bound in
        # create_weights (the layer sets ``moe_config`` before it asks for the method, and reads
        # nothing of the method's config before create_weights).
        super().__init__(cast(FusedMoEConfig, None))
        self.scheme = scheme
        self.prefix = prefix
        self.raw = raw
        self.ignore = ignore
        if scheme.activations:
            logger.warning(
                "layer %s: the checkpoint's %s activation scales are not applied; fp8w runs "
                "FP8 experts with fp16 activations on this GPU",
                prefix,
                scheme.activations,
            )

    def create_weights(
        self,
        layer: torch.nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        self.moe = layer.moe_config
        name, scheme = self.prefix, self.scheme
        _check_layer(name, layer, hidden_size, params_dtype, extra_weight_attrs)
        global_experts = int(extra_weight_attrs.get("global_num_experts", num_experts))
        projections = tuple(
            getattr(layer, f"ckpt_{p}_proj_name", None) or f"{p}_proj"
            for p in ("gate", "up", "down")
        )
        check_expert_schemes(name, scheme, self.raw, self.ignore, global_experts, projections)
        sizes = _Sizes(hidden_size, intermediate_size_per_partition, self.moe.tp_size)
        h, i, e = sizes.hidden, sizes.inter, num_experts
        shapes: dict[str, tuple[int, ...]]
        if scheme.strategy == "block":
            assert scheme.block is not None
            check_block(name, scheme.block)
            block_n, block_k = scheme.block
            reason = expert_blocks_reason(scheme.block, i, sizes.tp)
            if reason is not None:
                raise WeightFormatError(f"layer {name}: {reason}")
            shapes = {
                "w13": (e, 2 * -(-i // block_n), -(-h // block_k)),
                "w2": (e, -(-h // block_n), -(-i // block_k)),
            }
        elif scheme.strategy == "channel":
            shapes = {"w13": (e, 2 * i, 1), "w2": (e, h, 1)}
        else:
            shapes = {"w13": (e, 2), "w2": (e,)}
        seen: set[tuple[str, str, int]] = set()
        inner = extra_weight_attrs["weight_loader"]

        def register(param_name: str, data: torch.Tensor, tensor: str, **attrs: Any) -> None:
            param = torch.nn.Parameter(data, requires_grad=False)
            layer.register_parameter(param_name, param)
            param.weight_loader = functools.partial(  # type: ignore[attr-defined]
                _checked_load,
                tensor=tensor,
                layer_name=name,
                scheme=scheme,
                sizes=sizes,
                seen=seen,
                inner=inner,
            )
            param.is_transposed = False  # type: ignore[attr-defined]
            for key, value in attrs.items():
                setattr(param, key, value)

        fp8 = torch.float8_e4m3fn
        register("w13_weight", torch.empty((e, 2 * i, h), dtype=fp8), "weight")
        register("w2_weight", torch.empty((e, h, i), dtype=fp8), "weight")
        # NaN until loaded: a scale the checkpoint lacks fails the checks after loading.
        for stem, shape in shapes.items():
            register(
                f"{stem}_{scheme.scale_name}",
                torch.full(shape, torch.nan, dtype=torch.float32),
                scheme.scale_name,
                quant_method=SCALE_LOADING[scheme.strategy],
            )
        if scheme.activations == "static":
            # Loaded so the checkpoint's tensors have a home, then dropped (see the module).
            for stem in ("w13", "w2"):
                register(f"{stem}_input_scale", torch.ones(e), "input_scale")
        layer.fp8w_moe_seen = seen
        layer.fp8w_moe_sizes = sizes
        layer.fp8w_moe_global_experts = global_experts
        # vLLM 0.19's FusedMoE.load_weights (the Transformers backend's loader) calls the layer's
        # weight_loader, not the parameter's: route it through the checks.
        layer.weight_loader = functools.partial(_through_param_loader, inner=inner)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        name, scheme = self.prefix, self.scheme
        sizes: _Sizes = layer.fp8w_moe_sizes
        _check_complete(name, scheme, layer.fp8w_moe_seen, layer.fp8w_moe_global_experts)
        h, i = sizes.hidden, sizes.inter
        scale = scheme.scale_name
        w13 = stack_experts(
            f"{name} (w13)",
            layer.w13_weight.data,
            getattr(layer, f"w13_{scale}").data,
            n=2 * i,
            k=h,
            strategy=scheme.strategy,
            block=scheme.block,
            shards=(i, i),
            tensor=f"w13_{scale}",
        )
        w2 = stack_experts(
            f"{name} (w2)",
            layer.w2_weight.data,
            getattr(layer, f"w2_{scale}").data,
            n=h,
            k=i,
            strategy=scheme.strategy,
            block=scheme.block,
            tensor=f"w2_{scale}",
        )
        weights = ExpertWeights(w13, w2)
        weights.check()
        for stem in ("w13", "w2"):
            for tensor in ("weight", scale, "input_scale"):
                if hasattr(layer, f"{stem}_{tensor}"):
                    delattr(layer, f"{stem}_{tensor}")
        del layer.fp8w_moe_seen
        for stem, w in (("w13", w13), ("w2", w2)):
            for attr in ("weight", "scales"):
                param = torch.nn.Parameter(getattr(w, attr), requires_grad=False)
                layer.register_parameter(f"fp8w_{stem}_{attr}", param)
        layer.fp8w_moe_blocks = ((w13.block_n, w13.block_k), (w2.block_n, w2.block_k))
        # The tensor-core builds load now, before vLLM captures any CUDA graph.
        warm_up(weights)

    def get_fused_moe_quant_config(self, layer: torch.nn.Module) -> FusedMoEQuantConfig | None:
        """None: ``apply`` runs the experts itself, no modular kernel reads a quant config."""
        return None

    def apply(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        *shared: Any,
        **shared_named: Any,
    ) -> torch.Tensor:
        """The routed experts' weighted sum. Shared experts are the runner's (no modular kernel
        here, so it never hands them to the method): what vLLM passes for them
        (``shared_experts``, ``shared_experts_input``) is not used."""
        return experts_forward(
            x,
            expert_weights(layer),
            topk_weights,
            topk_ids,
            layer.expert_map,
            weight_on_input=bool(layer.apply_router_weight_on_input),
        )


def expert_weights(layer: torch.nn.Module) -> ExpertWeights:
    """The loaded layer's weights as :class:`~volta_fp8w.experts.ExpertWeights` (its
    parameters, no copies)."""
    (bn13, bk13), (bn2, bk2) = layer.fp8w_moe_blocks
    sizes: _Sizes = layer.fp8w_moe_sizes
    h, i = sizes.hidden, sizes.inter
    return ExpertWeights(
        Fp8Weights(layer.fp8w_w13_weight, layer.fp8w_w13_scales, 2 * i, h, bn13, bk13),
        Fp8Weights(layer.fp8w_w2_weight, layer.fp8w_w2_scales, h, i, bn2, bk2),
    )


def kernels_run_here() -> bool:
    """Whether ``apply`` will launch the kernels (a CUDA platform), not the CPU path."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda())


def _check_layer(
    name: str,
    layer: torch.nn.Module,
    hidden_size: int,
    params_dtype: torch.dtype,
    extra_weight_attrs: Mapping[str, Any],
) -> None:
    """Refuse, when the layer is built, what this method does not compute. Fields a vLLM family
    lacks (SwiGLU limits, TP padding) are read where present."""
    moe = layer.moe_config
    if moe.activation is not MoEActivation.SILU or not moe.is_act_and_mul:
        gated = "" if moe.is_act_and_mul else " without gating"
        raise WeightFormatError(
            f"layer {name}: activation {moe.activation.value!r}{gated}; the fp8w MoE path runs "
            "SiLU(gate) * up only"
        )
    swiglu = (getattr(moe, f, None) for f in ("swiglu_limit", "swiglu_alpha", "swiglu_beta"))
    extras = {
        "expert biases": moe.has_bias,
        "swiglu limit/alpha/beta": any(v is not None for v in swiglu),
        "block-aligned TP padding": getattr(moe, "tp_shard_with_padding", False),
        "a padded hidden size": extra_weight_attrs.get("unpadded_hidden_size", hidden_size)
        != hidden_size,
    }
    for what, present in extras.items():
        if present:
            raise WeightFormatError(f"layer {name}: {what} are not supported by fp8w")
    if params_dtype != torch.float16 and kernels_run_here():
        raise WeightFormatError(
            f"layer {name}: the fp8w kernels take float16 activations, the engine runs "
            f"{params_dtype}; start vLLM with --dtype float16 (Volta has no bf16)"
        )


def check_expert_schemes(
    layer_name: str,
    scheme: Fp8Scheme,
    raw: Mapping[str, Any],
    ignore: Sequence[str] | None,
    experts: int,
    projections: Sequence[str] = EXPERT_PROJECTIONS,
) -> None:
    """Every expert's projections are quantized as the scheme the method was made for (read
    from expert 0's, as vLLM does): the stacked kernels run one scheme for the whole layer, so
    another expert's is refused when the layer is built, before any weight loads. An ``fp8``
    config has one scheme for every layer; a compressed-tensors one is matched per module."""
    if scheme.source != COMPRESSED_TENSORS:
        return
    if ignore is not None:
        raw = {**raw, "ignore": list(ignore)}
    first = 1 if tuple(projections) == EXPERT_PROJECTIONS else 0
    for expert in range(first, experts):
        for projection in projections:
            found = layer_scheme(raw, f"{layer_name}.{expert}.{projection}")
            if found != scheme:
                what = found.label if isinstance(found, Fp8Scheme) else "unquantized"
                if isinstance(found, Unsupported):
                    what = found.reason
                raise WeightFormatError(
                    f"layer {layer_name}: expert {expert}'s {projection} is {what}, the layer's "
                    f"{scheme.label}: the fused experts run one scheme"
                )


def _checked_load(
    param: torch.nn.Parameter,
    loaded_weight: torch.Tensor,
    weight_name: str,
    shard_id: str,
    expert_id: int,
    return_success: bool = False,
    *,
    tensor: str,
    layer_name: str,
    scheme: Fp8Scheme,
    sizes: _Sizes,
    seen: set[tuple[str, str, int]],
    inner: Callable[..., Any],
) -> Any:
    """Check one expert's checkpoint tensor (whole, before TP sharding), then hand it to vLLM."""
    where = f"layer {layer_name} expert {expert_id} ({shard_id})"
    shape = tuple(loaded_weight.shape)
    rows, cols = sizes.full(shard_id) if shard_id in ("w1", "w2", "w3") else (0, 0)
    if tensor == "weight":
        if loaded_weight.dtype == torch.float8_e5m2:
            raise WeightFormatError(
                f"{where}: weight is float8_e5m2; fp8w runs e4m3fn weights only"
            )
        if loaded_weight.dtype not in (torch.float8_e4m3fn, torch.uint8):
            raise WeightFormatError(
                f"{where}: weight is {loaded_weight.dtype}, expected float8_e4m3fn"
            )
        if shape != (rows, cols):
            raise WeightFormatError(
                f"{where}: weight has shape {shape}; the layer's {shard_id} projection is "
                f"{rows} x {cols}"
            )
        # vLLM's copy converts values: bytes go in as the e4m3fn they are.
        loaded_weight = loaded_weight.view(torch.float8_e4m3fn)
    elif tensor == scheme.scale_name:
        if loaded_weight.dtype not in SCALE_DTYPES:
            raise WeightFormatError(
                f"{where}: {tensor} is {loaded_weight.dtype}, expected one of "
                f"{', '.join(map(str, SCALE_DTYPES))}"
            )
        want: tuple[int, ...]
        if scheme.strategy == "block":
            assert scheme.block is not None
            want = (-(-rows // scheme.block[0]), -(-cols // scheme.block[1]))
        elif scheme.strategy == "channel":
            want = (rows, 1)
            if shape == (rows,):
                loaded_weight = loaded_weight.reshape(rows, 1)
        else:
            want = ()
            if loaded_weight.numel() == 1:
                loaded_weight = loaded_weight.reshape(())
        check_scales(f"{layer_name} expert {expert_id} ({shard_id})", tensor, loaded_weight, want)
    if tensor != "input_scale":
        seen.add((tensor, shard_id, expert_id))
    try:
        return inner(param, loaded_weight, weight_name, shard_id, expert_id, return_success)
    except (AssertionError, RuntimeError, IndexError) as exc:
        raise WeightFormatError(
            f"{where}: {tensor} of shape {shape} does not fit the layer's parameter "
            f"{tuple(param.shape)}: {exc or type(exc).__name__}"
        ) from exc


def _through_param_loader(
    param: torch.nn.Parameter,
    loaded_weight: torch.Tensor,
    weight_name: str,
    shard_id: str,
    expert_id: int,
    return_success: bool = False,
    *,
    inner: Callable[..., Any],
) -> Any:
    """The layer's ``weight_loader``: a parameter of this method's goes through its checking
    loader (which then calls vLLM's, ``inner``), any other straight to vLLM's."""
    loader = getattr(param, "weight_loader", None)
    if not (isinstance(loader, functools.partial) and loader.func is _checked_load):
        loader = inner
    return loader(param, loaded_weight, weight_name, shard_id, expert_id, return_success)


def _check_complete(
    layer_name: str, scheme: Fp8Scheme, seen: set[tuple[str, str, int]], experts: int
) -> None:
    """Every expert's gate, up and down arrived with weights and scales; a missing one would
    otherwise run as garbage."""
    for expert in range(experts):
        for shard in ("w1", "w3", "w2"):
            missing = [t for t in ("weight", scheme.scale_name) if (t, shard, expert) not in seen]
            if missing:
                raise WeightFormatError(
                    f"layer {layer_name} expert {expert} ({shard}): the checkpoint has no "
                    f"{', '.join(missing)}"
                )
