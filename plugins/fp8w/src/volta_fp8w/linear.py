"""The vLLM side: a ``LinearMethodBase`` for claimed layers (this module imports vLLM).

The vLLM adapter imports this module only when a layer is claimed, and calls
:func:`make_linear_method` with the checkpoint's config, the layer and vLLM's own config object
(``Fp8Config`` or ``CompressedTensorsConfig``). The method registers the checkpoint's tensors
under their checkpoint names with vLLM's parameter classes, as vLLM's own FP8 methods do
(``weight``; ``weight_scale_inv`` per block, ``weight_scale`` per channel or per shard;
``input_scale`` accepted and dropped), so vLLM's loader shards them for tensor parallelism, a
block scale with its weight rows and columns, and places merged QKV / gate-up shards. Each
tensor passes a checking loader first (an e5m2 or non-float8 weight is refused there, before
vLLM's copy would convert it), scales start as NaN so a missing one is caught, and after loading
:mod:`volta_fp8w.layout` checks the whole layer and moves it to the kernels' layout.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from vllm.model_executor.layers.linear import (
    LinearMethodBase,
    UnquantizedLinearMethod,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.parameter import (
    BasevLLMParameter,
    BlockQuantScaleParameter,
    ChannelQuantScaleParameter,
    ModelWeightParameter,
    PerTensorScaleParameter,
)

from volta_core import DEFAULT_FUSED, QuantConfig, QuantLayer
from volta_fp8w import ops
from volta_fp8w.layout import (
    NAN_CODES,
    Fp8Weights,
    WeightFormatError,
    block_weights,
    channel_weights,
    check_block,
    tensor_weights,
)
from volta_fp8w.scheme import (
    FP8,
    Fp8Scheme,
    Unsupported,
    block_shards_reason,
    quant_layer_scheme,
)

logger = logging.getLogger(__name__)

#: The checkpoint dtypes a weight may arrive in: e4m3fn, or its bytes.
WEIGHT_DTYPES = (torch.float8_e4m3fn, torch.uint8)


def make_linear_method(
    *, volta_config: QuantConfig, layer: QuantLayer, engine_config: Any = None
) -> QuantizeMethodBase:
    """The factory named by the plugin's claims (the adapter's contract).

    ``engine_config`` is vLLM's config object: its ignore list (``ignored_layers`` of an ``fp8``
    config, ``ignore`` of a compressed-tensors one) has been mapped to vLLM's module names and its
    ``packed_modules_mapping`` names the model's fused modules, so the scheme is read again with
    both before quantizing.
    """
    fused: Mapping[str, Sequence[str]] = (
        getattr(engine_config, "packed_modules_mapping", None) or DEFAULT_FUSED
    )
    raw = dict(volta_config.raw)
    if raw.get("quant_method") == FP8:
        ignored = getattr(engine_config, "ignored_layers", None)
        if ignored:
            raw["ignored_layers"] = list(ignored)
    else:
        ignored = getattr(engine_config, "ignore", None)
        if ignored:
            raw["ignore"] = list(ignored)
    scheme = quant_layer_scheme(raw, layer, fused=fused)
    if scheme is None:
        return UnquantizedLinearMethod()
    if isinstance(scheme, Unsupported):
        raise WeightFormatError(f"layer {layer.prefix}: fp8w cannot run it: {scheme.reason}")
    return Fp8LinearMethod(scheme, layer.prefix)


@register_weight_loader_v2_supported_method
class Fp8LinearMethod(LinearMethodBase):
    """Linear layers with e4m3 weights run weight-only by the plugin's kernels."""

    def __init__(self, scheme: Fp8Scheme, prefix: str) -> None:
        self.scheme = scheme
        self.prefix = prefix
        if scheme.activations:
            logger.warning(
                "layer %s: the checkpoint's %s activation scales are not applied; fp8w runs "
                "FP8 weights with fp16 activations on this GPU",
                prefix,
                scheme.activations,
            )

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        scheme, name = self.scheme, self.prefix
        if params_dtype != torch.float16 and kernels_run_here():
            raise WeightFormatError(
                f"layer {name}: the fp8w kernels take float16 activations, the engine runs "
                f"{params_dtype}; start vLLM with --dtype float16 (Volta has no bf16)"
            )
        n, k = sum(output_partition_sizes), input_size_per_partition
        if scheme.block is not None:
            check_block(name, scheme.block)
            reason = block_shards_reason(
                scheme.block, input_size, k, output_size, output_partition_sizes
            )
            if reason is not None:
                raise WeightFormatError(f"layer {name}: {reason}")
            # vLLM's merged and QKV loaders place a block scale's shards by the layer's
            # ``weight_block_size`` (``adjust_block_scale_shard``), as its own FP8 method sets it.
            layer.weight_block_size = list(scheme.block)
        loader = functools.partial(
            _checked_load, layer_name=name, inner=extra_weight_attrs["weight_loader"]
        )
        # NaN codes until loaded: a shard whose weight never arrives is refused at load.
        weight = ModelWeightParameter(
            data=torch.full((n, k), NAN_CODES[0], dtype=torch.uint8).view(torch.float8_e4m3fn),
            input_dim=1,
            output_dim=0,
            weight_loader=functools.partial(loader, tensor="weight"),
        )
        scale_loader = functools.partial(loader, tensor=scheme.scale_name)
        scale: BasevLLMParameter
        if scheme.strategy == "block":
            assert scheme.block is not None
            block_n, block_k = scheme.block
            scale = BlockQuantScaleParameter(
                data=torch.full((-(-n // block_n), -(-k // block_k)), torch.nan),
                input_dim=1,
                output_dim=0,
                weight_loader=scale_loader,
            )
        elif scheme.strategy == "channel":
            scale = ChannelQuantScaleParameter(
                data=torch.full((n, 1), torch.nan), output_dim=0, weight_loader=scale_loader
            )
        else:
            scale = PerTensorScaleParameter(
                data=torch.full((len(output_partition_sizes),), torch.nan),
                weight_loader=scale_loader,
            )
        layer.register_parameter("weight", weight)
        layer.register_parameter(scheme.scale_name, scale)
        if scheme.activations == "static":
            # Loaded so the checkpoint's tensor has a home, then dropped: the kernels take
            # fp16 activations (see the module docstring).
            input_scale = PerTensorScaleParameter(
                data=torch.ones(len(output_partition_sizes)),
                weight_loader=extra_weight_attrs["weight_loader"],
            )
            layer.register_parameter("input_scale", input_scale)
        layer.fp8w_shape = (n, k, tuple(output_partition_sizes))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        scheme, name = self.scheme, self.prefix
        n, k, shards = layer.fp8w_shape
        weight = layer.weight.data
        scale = getattr(layer, scheme.scale_name).data
        if scheme.strategy == "block":
            assert scheme.block is not None
            w = block_weights(name, weight, scale, n, k, scheme.block, scheme.scale_name)
        elif scheme.strategy == "channel":
            w = channel_weights(name, weight, scale, n, k)
        else:
            w = tensor_weights(name, weight, scale, n, k, shards)
        for tensor in ("weight", scheme.scale_name, "input_scale"):
            if hasattr(layer, tensor):
                delattr(layer, tensor)
        layer.register_parameter("fp8w_weight", torch.nn.Parameter(w.weight, requires_grad=False))
        layer.register_parameter("fp8w_scales", torch.nn.Parameter(w.scales, requires_grad=False))
        layer.fp8w_blocks = (w.block_n, w.block_k)
        # The operator's arguments in one plain attribute: a module's parameters are found by
        # ``nn.Module.__getattr__``, a slow path per name.
        layer.fp8w_operands = (layer.fp8w_weight, layer.fp8w_scales, w.block_n, w.block_k)
        # The tensor-core builds compile now, before vLLM captures its CUDA graphs.
        ops.warm_up(w)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        weight, scales, block_n, block_k = layer.fp8w_operands
        return ops.linear_op(x, weight, scales, bias, block_n, block_k)


def layer_weights(layer: torch.nn.Module) -> Fp8Weights:
    """A loaded layer's weights as the kernels take them."""
    block_n, block_k = layer.fp8w_blocks
    n, k = layer.fp8w_weight.shape
    return Fp8Weights(layer.fp8w_weight, layer.fp8w_scales, n, k, block_n, block_k)


def kernels_run_here() -> bool:
    """Whether ``apply`` will launch the kernels (a CUDA platform), not the CPU path."""
    from vllm.platforms import current_platform

    return current_platform.is_cuda()


def _shard_key(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> object:
    if args:
        return args[0]
    return kwargs.get("loaded_shard_id", kwargs.get("shard_id"))


def _checked_load(
    param: torch.nn.Parameter,
    loaded_weight: torch.Tensor,
    *args: Any,
    tensor: str,
    layer_name: str,
    inner: Callable[..., Any],
    **kwargs: Any,
) -> None:
    """Check one checkpoint tensor's dtype (whole, before TP sharding), then hand it to vLLM's
    loader; a shape that does not fit the parameter is named too."""
    shard = _shard_key(args, kwargs)
    where = f"layer {layer_name}: {tensor}" + (f" (shard {shard})" if shard is not None else "")
    if tensor == "weight" and loaded_weight.dtype not in WEIGHT_DTYPES:
        raise WeightFormatError(
            f"{where}: dtype {loaded_weight.dtype}; fp8w runs float8_e4m3fn weights"
        )
    if tensor != "weight" and not loaded_weight.is_floating_point():
        raise WeightFormatError(f"{where}: dtype {loaded_weight.dtype}; expected a float scale")
    if tensor == "weight" and loaded_weight.dtype == torch.uint8:
        loaded_weight = loaded_weight.view(torch.float8_e4m3fn)
    try:
        inner(param, loaded_weight, *args, **kwargs)
    except (AssertionError, RuntimeError, IndexError) as exc:
        raise WeightFormatError(
            f"{where}: shape {tuple(loaded_weight.shape)} does not fit the layer's parameter "
            f"{tuple(param.shape)}: {str(exc) or type(exc).__name__}"
        ) from exc
