"""The vLLM side for AWQ and GPTQ linear layers (this module imports vLLM).

The tensors are registered under the checkpoint's names with the parameter classes vLLM's own
``AWQLinearMethod`` and ``GPTQLinearMethod`` use, so vLLM's loader shards them for tensor
parallelism and places merged QKV / gate-up shards exactly as it does for its own methods:

- AWQ: ``qweight`` ``[K, N / pack]``, ``qzeros`` ``[groups, N / pack]`` (both packed along the
  output dimension), ``scales`` ``[groups, N]``.
- GPTQ: ``qweight`` ``[K / pack, N]``, ``qzeros`` ``[groups, N / pack]``, ``scales``
  ``[groups, N]``, ``g_idx`` ``[K]``; an act-order layer split along its input keeps every
  group's scales (vLLM does the same: its groups are spread over all ranks' rows).

After loading, :mod:`volta_ct_wna16.repack` checks them and moves them to the kernels' layout,
the checkpoint's tensors are released, and the layer runs as a compressed-tensors one does
(:func:`volta_ct_wna16.linear.apply_packed`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
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
    ChannelQuantScaleParameter,
    GroupQuantScaleParameter,
    PackedColumnParameter,
    PackedvLLMParameter,
    RowvLLMParameter,
)

from volta_core import DEFAULT_FUSED, QuantConfig, QuantLayer
from volta_ct_wna16.layout import SCALE_DTYPES, WeightFormatError
from volta_ct_wna16.linear import apply_packed, check_linear_layer, install_packed
from volta_ct_wna16.repack import awq_weights, gptq_weights
from volta_ct_wna16.scheme import Packing, Unsupported, WeightScheme, quant_layer_scheme
from volta_ct_wna16.weight_scheme import act_order_split_reason

#: What each packing registers (and releases after the repack).
TENSORS = {
    Packing.AWQ: ("qweight", "qzeros", "scales"),
    Packing.GPTQ: ("qweight", "qzeros", "scales", "g_idx"),
}


def engine_view(raw: dict[str, Any], engine_config: Any) -> dict[str, Any]:
    """The config as vLLM's own reader holds it: its module lists mapped to vLLM's names
    (``apply_vllm_mapper``) and, for GPTQ, the quantized modules it read from the checkpoint's
    tensors (``maybe_update_config``)."""
    view = dict(raw)
    for key in ("modules_to_not_convert", "modules_in_block_to_quantize"):
        value = getattr(engine_config, key, None)
        if value:
            view[key] = list(value)
    return view


def make_linear_method(
    *, volta_config: QuantConfig, layer: QuantLayer, engine_config: Any = None
) -> QuantizeMethodBase:
    """The factory named by the plugin's AWQ and GPTQ claims (the adapter's contract)."""
    scheme = claimed_scheme(volta_config, layer, engine_config)
    if scheme is None:
        return UnquantizedLinearMethod()
    return AWQGPTQLinearMethod(scheme, layer.prefix)


def claimed_scheme(
    volta_config: QuantConfig, layer: QuantLayer, engine_config: Any
) -> WeightScheme | None:
    """The scheme a factory builds for ``layer``, read from the config as vLLM holds it
    (:func:`engine_view`); None where the checkpoint leaves it unquantized.

    :raises WeightFormatError: the claim's scheme is one the plugin does not run (the claim
        declined it, so only a factory called without one gets here).
    """
    fused = getattr(engine_config, "packed_modules_mapping", None) or DEFAULT_FUSED
    scheme = quant_layer_scheme(engine_view(volta_config.raw, engine_config), layer, fused=fused)
    if isinstance(scheme, Unsupported):
        raise WeightFormatError(f"layer {layer.prefix}: ct_wna16 cannot run it: {scheme.reason}")
    return scheme


def _checked(inner: Callable[..., Any], layer_name: str, tensor: str) -> Callable[..., Any]:
    """vLLM's loader, after a dtype check (its copy would cast silently), with a shape it
    refuses reported as the layer's and tensor's error."""
    dtypes = SCALE_DTYPES if tensor == "scales" else (torch.int32,)

    @functools.wraps(inner)
    def load(param: torch.nn.Parameter, loaded_weight: torch.Tensor, *args: Any, **kw: Any) -> Any:
        if loaded_weight.dtype not in dtypes:
            raise WeightFormatError(
                f"layer {layer_name}: {tensor} is {loaded_weight.dtype}; expected "
                f"{' or '.join(map(str, dtypes))}"
            )
        try:
            return inner(param, loaded_weight, *args, **kw)
        except (AssertionError, RuntimeError, IndexError) as exc:
            raise WeightFormatError(
                f"layer {layer_name}: {tensor} of shape {tuple(loaded_weight.shape)} does not "
                f"fit the layer's {tuple(param.shape)}: {exc or type(exc).__name__}"
            ) from exc

    return load


def _one_order(inner: Callable[..., Any], layer_name: str) -> Callable[..., Any]:
    """``g_idx``'s loader for a layer whose fused shards (q/k/v, gate/up) read one input: GPTQ
    orders a layer's rows by its input's statistics, so their orders must be one."""
    first: list[torch.Tensor] = []

    @functools.wraps(inner)
    def load(param: torch.nn.Parameter, loaded_weight: torch.Tensor, *args: Any, **kw: Any) -> Any:
        if first and not torch.equal(first[0], loaded_weight):
            raise WeightFormatError(
                f"layer {layer_name}: the fused shards' g_idx differ; one vLLM module reads one "
                "input order"
            )
        first[:] = [loaded_weight]
        return inner(param, loaded_weight, *args, **kw)

    return load


@register_weight_loader_v2_supported_method
class AWQGPTQLinearMethod(LinearMethodBase):
    """Linear layers of AWQ and GPTQ checkpoints run by the plugin's kernels."""

    def __init__(self, scheme: WeightScheme, prefix: str) -> None:
        self.scheme = scheme
        self.prefix = prefix

    @property
    def is_awq(self) -> bool:
        return self.scheme.packing is Packing.AWQ

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
        pack = scheme.pack_factor
        n, k = sum(output_partition_sizes), input_size_per_partition
        check_linear_layer(name, scheme, params_dtype, input_size, k)
        act_order_split = act_order_split_reason(scheme, input_split=k != input_size)
        if act_order_split is not None:
            raise WeightFormatError(f"layer {name}: {act_order_split}")
        if n % pack:
            raise WeightFormatError(
                f"layer {name}: output size per TP rank {n} is not a multiple of {pack}, the "
                f"values per word of {scheme.label}"
            )
        if not self.is_awq and k % pack:
            raise WeightFormatError(
                f"layer {name}: input size per TP rank {k} is not a multiple of {pack}, the "
                f"values per word of {scheme.label}"
            )
        loader = extra_weight_attrs["weight_loader"]
        sharded_groups = scheme.group_size is not None and not scheme.act_order
        groups = (k if sharded_groups else input_size) // scheme.group_for(input_size)
        group_data = {
            "scales": torch.empty(groups, n, dtype=params_dtype),
            "qzeros": torch.empty(groups, n // pack, dtype=torch.int32),
        }
        params: dict[str, BasevLLMParameter] = {}
        if self.is_awq:
            params["qweight"] = PackedvLLMParameter(
                data=torch.empty(k, n // pack, dtype=torch.int32),
                input_dim=0,
                output_dim=1,
                packed_dim=1,
                packed_factor=pack,
                weight_loader=_checked(loader, name, "qweight"),
            )
        else:
            params["qweight"] = PackedvLLMParameter(
                data=torch.empty(k // pack, n, dtype=torch.int32),
                input_dim=0,
                output_dim=1,
                packed_dim=0,
                packed_factor=pack,
                weight_loader=_checked(loader, name, "qweight"),
            )
            params["g_idx"] = RowvLLMParameter(
                data=torch.zeros(k, dtype=torch.int32),
                input_dim=0,
                weight_loader=_one_order(_checked(loader, name, "g_idx"), name),
            )
        if sharded_groups:
            params["scales"] = GroupQuantScaleParameter(
                data=group_data["scales"],
                input_dim=0,
                output_dim=1,
                weight_loader=_checked(loader, name, "scales"),
            )
            params["qzeros"] = PackedvLLMParameter(
                data=group_data["qzeros"],
                input_dim=0,
                output_dim=1,
                packed_dim=1,
                packed_factor=pack,
                weight_loader=_checked(loader, name, "qzeros"),
            )
        else:
            # Channel-wise, or act-order groups spread over every rank's rows: each rank
            # keeps all of them (vLLM's GPTQLinearMethod does the same).
            params["scales"] = ChannelQuantScaleParameter(
                data=group_data["scales"],
                output_dim=1,
                weight_loader=_checked(loader, name, "scales"),
            )
            params["qzeros"] = PackedColumnParameter(
                data=group_data["qzeros"],
                output_dim=1,
                packed_dim=1,
                packed_factor=pack,
                weight_loader=_checked(loader, name, "qzeros"),
            )
        for tensor, param in params.items():
            layer.register_parameter(tensor, param)
        layer.ct_wna16_shape = (n, k)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        scheme, name = self.scheme, self.prefix
        n, k = layer.ct_wna16_shape
        act_dtype = layer.scales.dtype
        if self.is_awq:
            repacked = awq_weights(
                name,
                scheme,
                n=n,
                k=k,
                qweight=layer.qweight.data,
                qzeros=layer.qzeros.data,
                scales=layer.scales.data,
                act_dtype=act_dtype,
            )
        else:
            repacked = gptq_weights(
                name,
                scheme,
                n=n,
                k=k,
                qweight=layer.qweight.data,
                qzeros=layer.qzeros.data,
                scales=layer.scales.data,
                g_idx=layer.g_idx.data,
                act_dtype=act_dtype,
            )
        for tensor in TENSORS[Packing.AWQ if self.is_awq else Packing.GPTQ]:
            delattr(layer, tensor)
        install_packed(layer, repacked.weights, repacked.perm)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return apply_packed(layer, x, bias)
