"""The vLLM side for fused MoE experts: a ``FusedMoEMethodBase`` (this module imports vLLM).

After vLLM's router has picked ``topk_ids`` and ``topk_weights``,
:func:`volta_ct_wna16.experts.experts_forward` runs the routed pairs: up to 16 tokens through
the decode kernels straight from the ids (one launch or two), more through the routed blocks' fused
kernel (six launches); neither synchronizes with the host, so vLLM can capture decode steps. On
CPU each expert's tokens go through the dense layers' reference op.

Weights are registered under upstream's parameter names (``w13_weight_packed``,
``w13_weight_scale``, ``w13_weight_zero_point``, ``w13_weight_shape`` and ``w2_*``) in the
checkpoint's orientation (``[experts, out, in / pack]``) with the attributes vLLM's
``RoutedExperts.weight_loader`` reads (``quant_method`` group/channel, ``is_transposed``
False), so that loader places gate/up/down of every expert and shards them for tensor
parallelism; each tensor is checked (whole, before sharding) by a wrapping loader first. After
loading, every expert is moved to the kernels' layout by :func:`volta_ct_wna16.layout.prepare`
and the checkpoint tensors are released.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from volta_ct_wna16 import ops
from volta_ct_wna16.experts import ExpertWeights, experts_forward
from volta_ct_wna16.layout import (
    SCALE_DTYPES,
    PackedWeights,
    WeightFormatError,
    check_scales,
    prepare,
    require_whole_groups,
)
from volta_ct_wna16.linear import kernels_run_here
from volta_ct_wna16.scheme import (
    EXPERT_PROJECTIONS,
    Unsupported,
    WeightScheme,
    expert_scheme,
    layer_scheme,
    quant_layer_scheme,
)

#: The checkpoint tensors of one projection, as compressed-tensors names them.
TENSORS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")


def make_moe_method(
    *, volta_config: QuantConfig, layer: QuantLayer, engine_config: Any = None
) -> QuantizeMethodBase | None:
    """The factory named by the plugin's MoE claims (the adapter's contract).

    The ignore rule is checked again with vLLM's ``ignore`` list (mapped to its module names).
    Experts that list ignores are left to vLLM (None: the adapter then asks vLLM's own config,
    which gives them its unquantized method; building that here would need the layer's
    ``FusedMoEConfig``, which the factory does not get).
    """
    engine_ignore = getattr(engine_config, "ignore", None)
    scheme = quant_layer_scheme(volta_config.raw, layer, ignore=engine_ignore or None)
    if scheme is None:
        return None
    if isinstance(scheme, Unsupported):
        raise WeightFormatError(f"layer {layer.prefix}: ct_wna16 cannot run it: {scheme.reason}")
    return WNA16MoEMethod(scheme, layer.prefix, volta_config.raw, engine_ignore or None)


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


class WNA16MoEMethod(FusedMoEMethodBase):
    """Fused MoE experts with compressed-tensors int4/int8 weights (the kernels of
    :func:`volta_ct_wna16.experts.experts_forward`: GEMVs on the router's ids up to 16 tokens,
    routed blocks above).

    ``apply`` is reached through ``RoutedExperts.forward_modular`` (vLLM routes first): the
    method builds no modular kernel (``moe_kernel`` stays None, so ``is_monolithic`` and
    ``supports_internal_mk`` are False and the runner computes shared experts itself) and
    returns the routed output unreduced (the runner all-reduces it over tensor parallelism).
    """

    def __init__(
        self,
        scheme: WeightScheme,
        prefix: str,
        raw: Mapping[str, Any],
        ignore: Sequence[str] | None = None,
    ) -> None:
        # The adapter's factory gets no vLLM layer, so the layer's FusedMoEConfig is bound in
        # create_weights (RoutedExperts sets ``moe_config`` before it asks for the method, and
        # reads nothing of the method's config before create_weights).
        super().__init__(cast(FusedMoEConfig, None))
        self.scheme = scheme
        self.prefix = prefix
        self.raw = raw
        self.ignore = ignore

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
        check_layer(name, scheme, layer, self.raw, hidden_size, params_dtype, extra_weight_attrs)
        global_experts = int(extra_weight_attrs.get("global_num_experts", num_experts))
        check_expert_schemes(name, scheme, self.raw, self.ignore, global_experts)
        pack = scheme.pack_factor
        sizes = _Sizes(hidden_size, intermediate_size_per_partition, self.moe.tp_size)
        h, i = sizes.hidden, sizes.inter
        require_whole_groups(
            name, scheme.group_size, {"hidden size": h, "intermediate size per TP rank": i}
        )
        if scheme.group_size:
            g13, g2 = h // scheme.group_size, i // scheme.group_size
        else:
            g13 = g2 = 1
        if i % pack:
            raise WeightFormatError(
                f"layer {name}: intermediate size per TP rank {i} is not a multiple of "
                f"{pack}: down_proj's packed words (and gate/up's zero points) would straddle "
                "the rank's shard"
            )
        seen: set[tuple[str, str, int]] = set()
        inner = extra_weight_attrs["weight_loader"]
        strategy = "group" if scheme.group_size else "channel"
        e = num_experts
        shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
            "w13_weight_packed": ((e, 2 * i, -(-h // pack)), torch.int32),
            "w2_weight_packed": ((e, h, i // pack), torch.int32),
            "w13_weight_scale": ((e, 2 * i, g13), params_dtype),
            "w2_weight_scale": ((e, h, g2), params_dtype),
            # Symmetric: an empty placeholder whose loader refuses a checkpoint's zero points.
            "w13_weight_zero_point": (
                (e, 0) if scheme.symmetric else (e, 2 * i // pack, g13),
                torch.int32,
            ),
            "w2_weight_zero_point": (
                (e, 0) if scheme.symmetric else (e, -(-h // pack), g2),
                torch.int32,
            ),
            "w13_weight_shape": ((e, 2), torch.int64),
            "w2_weight_shape": ((e, 2), torch.int64),
        }
        for param_name, (shape, dtype) in shapes.items():
            param = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            loader = functools.partial(
                _checked_load,
                tensor=param_name.split("_", 1)[1],
                layer_name=name,
                scheme=scheme,
                sizes=sizes,
                seen=seen,
                inner=inner,
            )
            layer.register_parameter(param_name, param)
            param.weight_loader = loader  # type: ignore[attr-defined]
            param.quant_method = strategy  # type: ignore[attr-defined]
            param.is_transposed = False  # type: ignore[attr-defined]
        layer.ct_wna16_seen = seen
        layer.ct_wna16_sizes = sizes
        layer.ct_wna16_global_experts = global_experts
        # vLLM 0.19's and 1Cat-vLLM's FusedMoE.load_weights (the Transformers backend's loader)
        # calls the layer's weight_loader, not the parameter's: route it through the checks.
        layer.weight_loader = functools.partial(_through_param_loader, inner=inner)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        name, scheme = self.prefix, self.scheme
        sizes: _Sizes = layer.ct_wna16_sizes
        _check_complete(name, scheme, layer.ct_wna16_seen, layer.ct_wna16_global_experts)
        h, i = sizes.hidden, sizes.inter
        act_dtype = layer.w13_weight_scale.dtype
        experts = layer.w13_weight_packed.shape[0]

        def prepared(stem: str, n: int, k: int) -> Iterator[PackedWeights]:
            zp = getattr(layer, f"{stem}_weight_zero_point").data
            for e in range(experts):
                yield prepare(
                    f"{name} expert {e} ({stem})",
                    scheme,
                    n=n,
                    k=k,
                    weight_packed=getattr(layer, f"{stem}_weight_packed").data[e],
                    weight_scale=getattr(layer, f"{stem}_weight_scale").data[e],
                    weight_zero_point=zp[e] if zp.numel() else None,
                    act_dtype=act_dtype,
                )

        weights = ExpertWeights.stack(prepared("w13", 2 * i, h), prepared("w2", h, i), experts)
        for stem in ("w13", "w2"):
            for tensor in TENSORS:
                delattr(layer, f"{stem}_{tensor}")
        del layer.ct_wna16_seen
        install_experts(layer, weights)

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
        here, so it never hands them to the method): what vLLM passes for them (0.19:
        ``shared_experts_input``; 1Cat and 0.32+: ``shared_experts`` too) is not used."""
        return experts_forward(
            x,
            topk_weights,
            topk_ids,
            expert_weights(layer),
            expert_map=layer.expert_map,
            weight_on_input=bool(layer.apply_router_weight_on_input),
        )


def install_experts(layer: torch.nn.Module, weights: ExpertWeights) -> None:
    """Register the stacked experts in the kernels' layout (``ct_*`` parameters), which
    :func:`expert_weights` reads at every call."""
    for stem, pw in (("w13", weights.w13), ("w2", weights.w2)):
        for attr in ("qweight", "scales", "zeros"):
            tensor = getattr(pw, attr)
            if tensor is None:
                setattr(layer, f"ct_{stem}_{attr}", None)
            else:
                param = torch.nn.Parameter(tensor, requires_grad=False)
                layer.register_parameter(f"ct_{stem}_{attr}", param)
    w13, w2 = weights.w13, weights.w2
    layer.ct_wna16_meta = (w13.k, w2.k, w13.bits, w13.group, w2.group)


def expert_weights(layer: torch.nn.Module) -> ExpertWeights:
    """The loaded layer's weights as :class:`ExpertWeights` (its parameters, no copies)."""
    h, i, bits, g13, g2 = layer.ct_wna16_meta
    return ExpertWeights(
        PackedWeights(
            layer.ct_w13_qweight, layer.ct_w13_scales, layer.ct_w13_zeros, 2 * i, h, bits, g13
        ),
        PackedWeights(layer.ct_w2_qweight, layer.ct_w2_scales, layer.ct_w2_zeros, h, i, bits, g2),
    )


def check_layer(
    name: str,
    scheme: WeightScheme,
    layer: torch.nn.Module,
    raw: Mapping[str, Any] | None,
    hidden_size: int,
    params_dtype: torch.dtype,
    extra_weight_attrs: Mapping[str, Any],
) -> None:
    """Refuse, when the layer is built, what this method does not compute.

    ``FusedMoEConfig`` differs between vLLM families: the SwiGLU limits (1Cat: ``swiglu_limit``
    only; 0.19: none) and TP padding (0.32+) are read where the family has them; absent, the
    family has no such layers. A family's layer that names no checkpoint projections (0.19,
    1Cat: its model's loader maps them) has the ``gate_proj``/``up_proj``/``down_proj`` that
    vLLM's own compressed-tensors MoE reads there (``raw``: the compressed-tensors config whose
    per-projection schemes are compared; None where one scheme covers the experts module).
    """
    moe = layer.moe_config
    if moe.activation is not MoEActivation.SILU or not moe.is_act_and_mul:
        gated = "" if moe.is_act_and_mul else " without gating"
        raise WeightFormatError(
            f"layer {name}: activation {moe.activation.value!r}{gated}; the ct_wna16 MoE path "
            "runs SiLU(gate) * up only"
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
            raise WeightFormatError(f"layer {name}: {what} are not supported by ct_wna16")
    if params_dtype not in ops.KERNEL_DTYPES and kernels_run_here():
        raise WeightFormatError(
            f"layer {name}: the ct_wna16 kernels take float16 activations, the engine runs "
            f"{params_dtype}; start vLLM with --dtype float16 (Volta has no bf16)"
        )
    projections: Sequence[str] = tuple(
        getattr(layer, f"ckpt_{p}_proj_name", p + "_proj") for p in ("gate", "up", "down")
    )
    if raw is not None and tuple(projections) != EXPERT_PROJECTIONS:
        actual = expert_scheme(raw, name, projections)
        if actual != scheme:
            raise WeightFormatError(
                f"layer {name}: the checkpoint's projections {list(projections)} have scheme "
                f"{actual}, not the {scheme.label} claimed"
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
    scheme: WeightScheme,
    sizes: _Sizes,
    seen: set[tuple[str, str, int]],
    inner: Callable[..., Any],
) -> Any:
    """Check one expert's checkpoint tensor (whole, before TP sharding), then hand it to vLLM."""
    where = f"layer {layer_name} expert {expert_id} ({shard_id}): {tensor}"
    shape = tuple(loaded_weight.shape)
    pack = scheme.pack_factor
    rows, cols = sizes.full(shard_id) if shard_id in ("w1", "w2", "w3") else (0, 0)
    groups = cols // scheme.group_size if scheme.group_size else 1
    if tensor == "weight_zero_point" and scheme.symmetric:
        raise WeightFormatError(f"{where}: present, but the scheme is symmetric (no zero points)")
    if tensor == "weight_scale":
        if loaded_weight.dtype not in SCALE_DTYPES:
            raise WeightFormatError(
                f"{where}: dtype {loaded_weight.dtype}; expected one of {SCALE_DTYPES}"
            )
        check_scales(f"{layer_name} expert {expert_id} ({shard_id})", loaded_weight)
        want: tuple[int, ...] = (rows, groups)
    elif tensor == "weight_packed":
        want = (rows, -(-cols // pack))
    elif tensor == "weight_zero_point":
        want = (-(-rows // pack), groups)
    else:
        want = (2,)
    if tensor in ("weight_packed", "weight_zero_point") and loaded_weight.dtype != torch.int32:
        raise WeightFormatError(f"{where}: dtype {loaded_weight.dtype}; expected torch.int32")
    if tensor == "weight_shape":
        values = tuple(int(v) for v in loaded_weight.flatten().tolist())
        if values != (rows, cols):
            raise WeightFormatError(
                f"{where}: {list(values)}; the layer's {shard_id} projection is {[rows, cols]}"
            )
        loaded_weight = loaded_weight.to(param.dtype)
    elif shape != want:
        raise WeightFormatError(
            f"{where}: shape {shape}; the layer's {shard_id} projection ({rows} x {cols}, "
            f"{scheme.label}) needs {want}"
        )
    seen.add((tensor, shard_id, expert_id))
    try:
        return inner(param, loaded_weight, weight_name, shard_id, expert_id, return_success)
    except (AssertionError, RuntimeError, IndexError) as exc:
        raise WeightFormatError(
            f"{where}: shape {shape} does not fit the layer's parameter "
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


def check_expert_schemes(
    layer_name: str,
    scheme: WeightScheme,
    raw: Mapping[str, Any],
    ignore: Sequence[str] | None,
    experts: int,
) -> None:
    """Every expert's projections are quantized as expert 0's (the scheme the method was made
    for, which the factory read from expert 0 as vLLM does): the stacked kernels run one scheme
    for the whole layer, so another expert's scheme is refused when the layer is built, before
    any weight loads. ``ignore`` replaces the checkpoint's list as in the factory."""
    if ignore is not None:
        raw = {**raw, "ignore": list(ignore)}
    for expert in range(1, experts):
        for projection in EXPERT_PROJECTIONS:
            found = layer_scheme(raw, f"{layer_name}.{expert}.{projection}", is_linear=True)
            if found != scheme:
                what = found.label if isinstance(found, WeightScheme) else "unquantized"
                if isinstance(found, Unsupported):
                    what = found.reason
                raise WeightFormatError(
                    f"layer {layer_name}: expert {expert}'s {projection} is {what}, expert 0's "
                    f"{scheme.label}: the fused experts run one scheme"
                )


def _check_complete(
    layer_name: str, scheme: WeightScheme, seen: set[tuple[str, str, int]], experts: int
) -> None:
    """Every expert's gate, up and down arrived with packed weights and scales (and zero
    points when asymmetric); a missing one would otherwise run as zeros."""
    needed = ["weight_packed", "weight_scale"]
    if not scheme.symmetric:
        needed.append("weight_zero_point")
    for expert in range(experts):
        for shard in ("w1", "w3", "w2"):
            missing = [t for t in needed if (t, shard, expert) not in seen]
            if missing:
                raise WeightFormatError(
                    f"layer {layer_name} expert {expert} ({shard}): the checkpoint has no "
                    f"{', '.join(missing)}"
                )
