"""The vLLM side for the fused MoE experts of AWQ and GPTQ checkpoints (imports vLLM).

The tensors are registered as vLLM's own AWQ and GPTQ MoE methods register them (input
dimension first, ``is_transposed``, group-wise scales, or channel-wise ones with one group), so
the routed-experts layer's ``weight_loader`` places and shards every expert's gate, up and down
for tensor parallelism:

- AWQ: ``w13_qweight`` ``[E, H, 2I / pack]``, ``w2_qweight`` ``[E, I, H / pack]``, ``qzeros``
  ``[E, groups, out / pack]``, ``scales`` ``[E, groups, out]`` (``groups`` 1 channel-wise).
- GPTQ: ``w13_qweight`` ``[E, H / pack, 2I]``, ``w2_qweight`` ``[E, I / pack, H]``, the same
  zero points and scales, and ``g_idx`` per expert (checked to be the plain group order: these
  experts are not act-order, which the claim declines).

After loading, each expert is repacked (:mod:`volta_ct_wna16.repack`), the experts are stacked
into the layout the compressed-tensors experts use, and the layer runs their kernels
(:class:`volta_ct_wna16.moe.WNA16MoEMethod`'s ``apply``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

from volta_core import QuantConfig, QuantLayer
from volta_ct_wna16.awq_gptq_linear import claimed_scheme
from volta_ct_wna16.experts import ExpertWeights
from volta_ct_wna16.layout import PackedWeights, WeightFormatError, require_whole_groups
from volta_ct_wna16.moe import WNA16MoEMethod, check_layer, install_experts
from volta_ct_wna16.repack import awq_weights, gptq_weights
from volta_ct_wna16.scheme import Packing

#: The tensors of each packing (per stem ``w13`` / ``w2``).
TENSORS = {True: ("qweight", "qzeros", "scales"), False: ("qweight", "qzeros", "scales", "g_idx")}


def make_moe_method(
    *, volta_config: QuantConfig, layer: QuantLayer, engine_config: Any = None
) -> QuantizeMethodBase | None:
    """The factory named by the plugin's AWQ and GPTQ expert claims (the adapter's contract);
    None leaves experts the checkpoint keeps unquantized to vLLM."""
    scheme = claimed_scheme(volta_config, layer, engine_config)
    if scheme is None:
        return None
    return AWQGPTQMoEMethod(scheme, layer.prefix, volta_config.raw)


class AWQGPTQMoEMethod(WNA16MoEMethod):
    """Fused MoE experts of an AWQ or GPTQ checkpoint, run by the compressed-tensors experts'
    kernels after a repack at load."""

    @property
    def is_awq(self) -> bool:
        return self.scheme.packing is Packing.AWQ

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
        check_layer(name, scheme, layer, None, hidden_size, params_dtype, extra_weight_attrs)
        pack, group = scheme.pack_factor, scheme.group_size
        e, h, i = num_experts, hidden_size, intermediate_size_per_partition
        require_whole_groups(name, group, {"hidden size": h, "intermediate size per TP rank": i})
        for what, size in {"hidden size": h, "intermediate size per TP rank": i}.items():
            if size % pack:
                raise WeightFormatError(
                    f"layer {name}: {what} {size} is not a multiple of {pack}, the values per "
                    f"word of {scheme.label}"
                )
        g13, g2 = (h // group, i // group) if group else (1, 1)
        if self.is_awq:
            qweights = {"w13": (e, h, 2 * i // pack), "w2": (e, i, h // pack)}
        else:
            qweights = {"w13": (e, h // pack, 2 * i), "w2": (e, i // pack, h)}
        shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
            "w13_qweight": (qweights["w13"], torch.int32),
            "w2_qweight": (qweights["w2"], torch.int32),
            "w13_scales": ((e, g13, 2 * i), params_dtype),
            "w2_scales": ((e, g2, h), params_dtype),
            "w13_qzeros": ((e, g13, 2 * i // pack), torch.int32),
            "w2_qzeros": ((e, g2, h // pack), torch.int32),
        }
        inner = extra_weight_attrs["weight_loader"]
        # vLLM's loader shards group scales along the input of down (row-parallel) and keeps a
        # channel's one row of scales whole there ("channel": the strategy vLLM's own GPTQ MoE
        # method sets for group_size -1, quantization/auto_gptq.py); gate/up's split by output.
        strategy = "group" if group else "channel"
        for param_name, (shape, dtype) in shapes.items():
            param = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(param_name, param)
            param.weight_loader = _checked(inner, name, param_name, dtype)  # type: ignore[attr-defined]
            param.quant_method = strategy  # type: ignore[attr-defined]
            param.is_transposed = True  # type: ignore[attr-defined]
        if not self.is_awq:
            for stem, rows in (("w13", h), ("w2", i)):
                empty = torch.zeros(e, 0, dtype=torch.int32)
                param = torch.nn.Parameter(empty, requires_grad=False)
                layer.register_parameter(f"{stem}_g_idx", param)
                param.weight_loader = functools.partial(  # type: ignore[attr-defined]
                    _plain_order, layer_name=name, rows=rows, group=group, stem=stem
                )
        layer.ct_wna16_sizes = (h, i)
        # vLLM 0.19's and 1Cat-vLLM's FusedMoE.load_weights (the Transformers backend's loader)
        # calls the layer's weight_loader, not the parameter's: route it through the checks.
        layer.weight_loader = functools.partial(_through_param_loader, inner=inner)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        name, scheme = self.prefix, self.scheme
        h, i = layer.ct_wna16_sizes
        act_dtype = layer.w13_scales.dtype
        experts = layer.w13_qweight.shape[0]
        repack = awq_weights if self.is_awq else gptq_weights
        extra: dict[str, Any] = {} if self.is_awq else {"g_idx": None}

        def repacked(stem: str, n: int, k: int) -> Iterator[PackedWeights]:
            for e in range(experts):
                yield repack(
                    f"{name} expert {e} ({stem})",
                    scheme,
                    n=n,
                    k=k,
                    qweight=getattr(layer, f"{stem}_qweight").data[e],
                    qzeros=getattr(layer, f"{stem}_qzeros").data[e],
                    scales=getattr(layer, f"{stem}_scales").data[e],
                    act_dtype=act_dtype,
                    **extra,
                ).weights

        weights = ExpertWeights.stack(repacked("w13", 2 * i, h), repacked("w2", h, i), experts)
        for stem in ("w13", "w2"):
            for tensor in TENSORS[self.is_awq]:
                delattr(layer, f"{stem}_{tensor}")
        install_experts(layer, weights)


def _checked(
    inner: Callable[..., Any], layer_name: str, param_name: str, dtype: torch.dtype
) -> Callable[..., Any]:
    """vLLM's experts loader after a dtype check (its copy would cast silently); a shape it
    refuses is reported as the layer's, expert's and tensor's error."""
    float_tensor = dtype.is_floating_point

    def load(
        param: torch.nn.Parameter,
        loaded_weight: torch.Tensor,
        weight_name: str,
        shard_id: str,
        expert_id: int,
        return_success: bool = False,
    ) -> Any:
        where = f"layer {layer_name} expert {expert_id} ({shard_id}): {param_name}"
        if loaded_weight.dtype.is_floating_point != float_tensor or (
            not float_tensor and loaded_weight.dtype != torch.int32
        ):
            want = "a floating dtype" if float_tensor else "torch.int32"
            raise WeightFormatError(f"{where} is {loaded_weight.dtype}; expected {want}")
        try:
            return inner(param, loaded_weight, weight_name, shard_id, expert_id, return_success)
        except (AssertionError, RuntimeError, IndexError) as exc:
            raise WeightFormatError(
                f"{where}: shape {tuple(loaded_weight.shape)} does not fit the layer's "
                f"{tuple(param.shape)}: {exc or type(exc).__name__}"
            ) from exc

    load.volta_checked = True  # type: ignore[attr-defined]
    return load


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
    """The layer's ``weight_loader``: a parameter of this method's goes through its own loader
    (checks, then vLLM's), any other straight to vLLM's (``inner``)."""
    loader = getattr(param, "weight_loader", None)
    ours = getattr(loader, "volta_checked", False) or (
        isinstance(loader, functools.partial) and loader.func is _plain_order
    )
    chosen = loader if ours and loader is not None else inner
    return chosen(param, loaded_weight, weight_name, shard_id, expert_id, return_success)


def _plain_order(
    param: torch.nn.Parameter,
    loaded_weight: torch.Tensor,
    weight_name: str,
    shard_id: str,
    expert_id: int,
    return_success: bool = False,
    *,
    layer_name: str,
    rows: int,
    group: int | None,
    stem: str,
) -> Any:
    """An expert's ``g_idx``: read and checked to be the plain group order, then dropped (these
    experts are not act-order; their rows need no permutation). Channel-wise (``group`` None):
    every row in group 0, as GPTQ's packers write it (one group spanning the input)."""
    del param, weight_name
    full = loaded_weight.shape[-1]
    plain = torch.arange(full, dtype=torch.int64, device=loaded_weight.device) // (group or full)
    if not torch.equal(loaded_weight.to(torch.int64).reshape(-1, full)[0], plain):
        raise WeightFormatError(
            f"layer {layer_name} expert {expert_id} ({shard_id}): {stem}_g_idx is not the plain "
            f"group order of {rows} rows per rank: act-order experts are not run"
        )
    return True if return_success else None
