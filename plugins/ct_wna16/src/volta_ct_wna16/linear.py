"""The vLLM side: a ``LinearMethodBase`` for claimed layers (this module imports vLLM).

The vLLM adapter imports this module only when a layer is claimed, and calls
:func:`make_linear_method` with the checkpoint's config, the layer and vLLM's own
``CompressedTensorsConfig``. The method registers the checkpoint's tensors under their
checkpoint names with vLLM's parameter classes (as upstream ``CompressedTensorsWNA16`` does), so
vLLM's loader shards them for tensor parallelism and places merged QKV / gate-up shards; each
tensor passes through a checking loader first, so a malformed checkpoint fails at load time
with the layer and tensor named. After loading, the tensors are checked against each other and
moved to the kernels' layout (:func:`volta_ct_wna16.layout.prepare`), the originals are
released, and on a V100 the tensor-core GEMM's builds are compiled
(:func:`volta_ct_wna16.ops.warm_up`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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
)

from volta_core import DEFAULT_FUSED, QuantConfig, QuantLayer, ignored_module
from volta_ct_wna16 import ops
from volta_ct_wna16.layout import (
    SCALE_DTYPES,
    PackedWeights,
    WeightFormatError,
    check_scales,
    prepare,
    require_whole_groups,
)
from volta_ct_wna16.scheme import (
    Unsupported,
    WeightScheme,
    quant_layer_scheme,
)


def make_linear_method(
    *, volta_config: QuantConfig, layer: QuantLayer, engine_config: Any = None
) -> QuantizeMethodBase:
    """The factory named by the plugin's claims (the adapter's contract).

    ``engine_config`` is vLLM's ``CompressedTensorsConfig``: its ``ignore`` list has been mapped
    to vLLM's module names and its ``packed_modules_mapping`` names the model's fused modules,
    so the ignore rule is checked again with both before quantizing.
    """
    fused: Mapping[str, Sequence[str]] = (
        getattr(engine_config, "packed_modules_mapping", None) or DEFAULT_FUSED
    )
    engine_ignore = getattr(engine_config, "ignore", None)
    if engine_ignore and ignored_module(layer.prefix, engine_ignore, fused):
        return UnquantizedLinearMethod()
    scheme = quant_layer_scheme(volta_config.raw, layer, fused=fused)
    if scheme is None:
        return UnquantizedLinearMethod()
    if isinstance(scheme, Unsupported):
        raise WeightFormatError(f"layer {layer.prefix}: ct_wna16 cannot run it: {scheme.reason}")
    return WNA16LinearMethod(scheme, layer.prefix)


@dataclass
class _Record:
    """What the checking loaders saw of one layer's checkpoint tensors, per shard."""

    shapes: dict[tuple[str, object], tuple[int, ...]] = field(default_factory=dict)
    values: dict[object, tuple[int, ...]] = field(default_factory=dict)


@register_weight_loader_v2_supported_method
class WNA16LinearMethod(LinearMethodBase):
    """Linear layers with compressed-tensors int4/int8 weights run by the plugin's kernels."""

    def __init__(self, scheme: WeightScheme, prefix: str) -> None:
        self.scheme = scheme
        self.prefix = prefix

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
        if scheme.group_size:
            groups, full_groups = k // scheme.group_size, input_size // scheme.group_size
        else:
            groups = full_groups = 1
        record = _Record()
        loader = functools.partial(
            _checked_load,
            layer_name=name,
            scheme=scheme,
            input_size=input_size,
            full_groups=full_groups,
            record=record,
            inner=extra_weight_attrs["weight_loader"],
        )
        weight = PackedvLLMParameter(
            input_dim=1,
            output_dim=0,
            packed_factor=pack,
            packed_dim=1,
            data=torch.empty(n, -(-k // pack), dtype=torch.int32),
            weight_loader=functools.partial(loader, tensor="weight_packed"),
        )
        scale_loader = functools.partial(loader, tensor="weight_scale")
        zp_loader = functools.partial(loader, tensor="weight_zero_point")
        zp_data = torch.zeros(-(-n // pack), groups, dtype=torch.int32)
        if scheme.group_size:
            scale: BasevLLMParameter = GroupQuantScaleParameter(
                output_dim=0,
                input_dim=1,
                data=torch.empty(n, groups, dtype=params_dtype),
                weight_loader=scale_loader,
            )
            zero_point: BasevLLMParameter = PackedvLLMParameter(
                input_dim=1,
                output_dim=0,
                packed_dim=0,
                packed_factor=pack,
                data=zp_data,
                weight_loader=zp_loader,
            )
        else:
            # One scale per output row: every TP rank of a row-parallel layer keeps all of them.
            scale = ChannelQuantScaleParameter(
                output_dim=0,
                data=torch.empty(n, 1, dtype=params_dtype),
                weight_loader=scale_loader,
            )
            zero_point = PackedColumnParameter(
                output_dim=0,
                packed_dim=0,
                packed_factor=pack,
                data=zp_data,
                weight_loader=zp_loader,
            )
        if scheme.symmetric:
            # An empty placeholder (vLLM does not require it from the checkpoint) whose loader
            # refuses a zero point a symmetric checkpoint should not have.
            zero_point = BasevLLMParameter(
                data=torch.empty(0, dtype=torch.int32), weight_loader=zp_loader
            )
        weight_shape = BasevLLMParameter(
            data=torch.empty(2, dtype=torch.int64),
            weight_loader=functools.partial(loader, tensor="weight_shape"),
        )
        layer.register_parameter("weight_packed", weight)
        layer.register_parameter("weight_scale", scale)
        layer.register_parameter("weight_zero_point", zero_point)
        layer.register_parameter("weight_shape", weight_shape)
        layer.ct_wna16_record = record
        layer.ct_wna16_shape = (n, k)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        scheme, name = self.scheme, self.prefix
        n, k = layer.ct_wna16_shape
        _cross_check(name, scheme, layer.ct_wna16_record)
        act_dtype = layer.weight_scale.dtype
        pw = prepare(
            name,
            scheme,
            n=n,
            k=k,
            weight_packed=layer.weight_packed.data,
            weight_scale=layer.weight_scale.data,
            weight_zero_point=layer.weight_zero_point.data,
            act_dtype=act_dtype,
        )
        for tensor in ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape"):
            delattr(layer, tensor)
        del layer.ct_wna16_record
        install_packed(layer, pw)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return apply_packed(layer, x, bias)


def install_packed(
    layer: torch.nn.Module, pw: PackedWeights, perm: torch.Tensor | None = None
) -> None:
    """Register one layer's weights in the kernels' layout (``ct_*`` parameters) and, on a
    V100, compile the tensor-core GEMM's builds now, before vLLM captures its CUDA graphs.
    ``perm``: an act-order layer's input permutation (:class:`volta_ct_wna16.repack.Repacked`)."""
    layer.register_parameter("ct_qweight", torch.nn.Parameter(pw.qweight, requires_grad=False))
    layer.register_parameter("ct_scales", torch.nn.Parameter(pw.scales, requires_grad=False))
    for attr in ("zeros", "zeros8"):
        value = getattr(pw, attr)
        if value is not None:
            layer.register_parameter(f"ct_{attr}", torch.nn.Parameter(value, requires_grad=False))
        else:
            setattr(layer, f"ct_{attr}", None)
    if perm is not None:
        layer.register_buffer("ct_perm", perm, persistent=False)
    else:
        layer.ct_perm = None
    layer.ct_wna16_meta = (pw.k, pw.bits, pw.group)
    # The operator's arguments and the permutation, in one plain attribute: a module's
    # parameters and buffers are found by ``nn.Module.__getattr__``, a slow path per name.
    layer.ct_wna16_operands = (
        layer.ct_perm,
        (layer.ct_qweight, layer.ct_scales, layer.ct_zeros, layer.ct_zeros8),
        layer.ct_wna16_meta,
    )
    ops.warm_up(pw)


def apply_packed(
    layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ W.T + bias`` on the weights :func:`install_packed` registered."""
    perm, (qweight, scales, zeros, zeros8), (k, bits, group) = layer.ct_wna16_operands
    if perm is not None:
        x = x.index_select(-1, perm)
    return ops.linear_op(x, qweight, scales, zeros, zeros8, bias, k, bits, group)


def check_linear_layer(
    name: str, scheme: WeightScheme, params_dtype: torch.dtype, input_size: int, k: int
) -> None:
    """Refuse, when a linear layer is built, an activation dtype the kernels do not take (where
    they run) and an input, whole or per tensor-parallel rank ``k``, that splits a group."""
    if params_dtype not in ops.KERNEL_DTYPES and kernels_run_here():
        raise WeightFormatError(
            f"layer {name}: the ct_wna16 kernels take float16 activations, the engine runs "
            f"{params_dtype}; start vLLM with --dtype float16 (Volta has no bf16)"
        )
    require_whole_groups(
        name, scheme.group_size, {"input size": input_size, "input size per TP rank": k}
    )


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
    scheme: WeightScheme,
    input_size: int,
    full_groups: int,
    record: _Record,
    inner: Callable[..., Any],
    **kwargs: Any,
) -> None:
    """Check one checkpoint tensor (whole, before TP sharding), then hand it to vLLM's loader."""
    shard = _shard_key(args, kwargs)
    where = f"layer {layer_name}: {tensor}" + (f" (shard {shard})" if shard is not None else "")
    shape = tuple(loaded_weight.shape)
    pack = scheme.pack_factor
    if tensor == "weight_zero_point" and scheme.symmetric:
        raise WeightFormatError(f"{where}: present, but the scheme is symmetric (no zero points)")
    if tensor == "weight_scale":
        if loaded_weight.dtype not in SCALE_DTYPES:
            raise WeightFormatError(
                f"{where}: dtype {loaded_weight.dtype}; expected one of {SCALE_DTYPES}"
            )
        check_scales(layer_name, loaded_weight)
        if loaded_weight.dim() != 2 or shape[1] != full_groups:
            raise WeightFormatError(
                f"{where}: shape {shape}; input size {input_size} with "
                f"{scheme.label} makes {full_groups} group(s) per row"
            )
    elif tensor in ("weight_packed", "weight_zero_point"):
        if loaded_weight.dtype != torch.int32:
            raise WeightFormatError(f"{where}: dtype {loaded_weight.dtype}; expected torch.int32")
        want = -(-input_size // pack) if tensor == "weight_packed" else full_groups
        if loaded_weight.dim() != 2 or shape[1] != want:
            raise WeightFormatError(
                f"{where}: shape {shape}; input size {input_size} with {scheme.label} needs "
                f"{want} column(s)"
            )
    elif tensor == "weight_shape":
        values = tuple(int(v) for v in loaded_weight.flatten().tolist())
        if len(values) != 2 or values[1] != input_size:
            raise WeightFormatError(
                f"{where}: {list(values)} disagrees with the layer's input size {input_size}"
            )
        record.values[shard] = values
    record.shapes[(tensor, shard)] = shape
    try:
        inner(param, loaded_weight, *args, **kwargs)
    except (AssertionError, RuntimeError, IndexError) as exc:
        raise WeightFormatError(
            f"{where}: shape {shape} does not fit the layer's parameter "
            f"{tuple(param.shape)}: {exc or type(exc).__name__}"
        ) from exc


def _cross_check(layer_name: str, scheme: WeightScheme, record: _Record) -> None:
    """Per shard: packed rows, scale rows and zero-point rows agree with ``weight_shape``."""
    pack = scheme.pack_factor
    for shard, (rows, cols) in record.values.items():
        where = f"layer {layer_name}" + (f" (shard {shard})" if shard is not None else "")
        packed = record.shapes.get(("weight_packed", shard))
        if packed is not None and packed != (rows, -(-cols // pack)):
            raise WeightFormatError(
                f"{where}: weight_packed has shape {packed} but weight_shape says "
                f"{[rows, cols]}, which packs to {(rows, -(-cols // pack))}"
            )
        scale = record.shapes.get(("weight_scale", shard))
        if scale is not None and scale[0] != rows:
            raise WeightFormatError(
                f"{where}: weight_scale has {scale[0]} rows but weight_shape says {rows}"
            )
        zp = record.shapes.get(("weight_zero_point", shard))
        if zp is not None and zp[0] != -(-rows // pack):
            raise WeightFormatError(
                f"{where}: weight_zero_point has {zp[0]} rows; {rows} output rows pack to "
                f"{-(-rows // pack)}"
            )
