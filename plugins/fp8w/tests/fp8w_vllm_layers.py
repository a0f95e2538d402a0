"""Real vLLM layers quantized by this plugin's methods and loaded like a model does.

Shared by ``test_vllm_linear.py`` (one rank, in process), ``tp_worker.py`` (two ranks) and
``test_moe.py``. Linear layers come from vLLM's own classes (column, row, merged gate/up, QKV).
Their quant config is vLLM's real config class for the checkpoint's method (``Fp8Config`` /
``CompressedTensorsConfig``, made by its own ``from_config``, told the model's fused modules and,
when a test passes one, mapped by a model's ``WeightsMapper``), whose linear layers get the
plugin's factory (``volta_fp8w.linear:make_linear_method``) called as the host's adapter calls
it: the checkpoint's config, the layer, and that config object as ``engine_config``. Each
checkpoint tensor goes through vLLM's own loader (a parameter's ``weight_loader`` with the shard
id a model's ``load_weights`` passes); then vLLM's ``process_weights_after_loading`` hook runs.

Fused-MoE layers (:func:`build_moe`) take the host adapter's config (:func:`adapter_config`)
and are built as the installed vLLM family builds them: 0.19's ``FusedMoE`` and 1Cat-vLLM's
``RoutedExperts`` (the same class) are the layer, loaded as the family's MoE models load them;
0.32's ``FusedMoEFactory`` builds a runner owning the ``RoutedExperts`` layer.
:func:`apply_routed` runs the routed experts through the family's runner, the step that hands
the router's choice to the quant method's ``apply``. The one place that knows how each family
builds and runs a MoE layer is this module.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from fp8w_checkpoints import Checkpoint

#: The fused modules of the models these layers stand for (Qwen's, vLLM's
#: ``packed_modules_mapping``).
PACKED_MODULES = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
}

#: The module each kind of layer is built as.
PREFIXES = {
    "column": "model.layers.0.mlp.up_proj",
    "row": "model.layers.0.mlp.down_proj",
    "merged": "model.layers.0.mlp.gate_up_proj",
    "qkv": "model.layers.0.self_attn.qkv_proj",
}

#: The shard ids a model's ``load_weights`` hands each kind's weight loader.
SHARD_IDS: dict[str, list[Any]] = {
    "column": [None],
    "row": [None],
    "merged": [0, 1],
    "qkv": ["q", "k", "v"],
}


@contextlib.contextmanager
def vllm_process(rank: int = 0, world: int = 1, init_file: str | None = None) -> Iterator[None]:
    """A vLLM config and the distributed groups (gloo on CPU), torn down on exit, so nothing
    of it outlives its tests."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(
            world_size=world,
            rank=rank,
            local_rank=rank,
            distributed_init_method=f"file://{init_file or tempfile.mktemp()}",
            backend="gloo",
        )
        try:
            initialize_model_parallel(world)
            yield
        finally:
            destroy_model_parallel()
            destroy_distributed_environment()


@functools.cache
def _config_classes() -> dict[str, type]:
    """vLLM's ``fp8`` and ``compressed-tensors`` config classes, their linear layers given the
    plugin's method; everything else (parsing, the ignore list, the mapper) is upstream's."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from volta_core import LayerKind, QuantConfig, QuantLayer
    from volta_fp8w.linear import make_linear_method

    class AsksFp8w:
        volta_raw: dict[str, Any]

        def get_quant_method(self, layer: Any, prefix: str) -> Any:
            if not isinstance(layer, LinearBase):
                return super().get_quant_method(layer, prefix)  # type: ignore[misc]
            raw = self.volta_raw
            return make_linear_method(
                volta_config=QuantConfig(str(raw["quant_method"]), raw),
                layer=QuantLayer(LayerKind.LINEAR, prefix, layer.input_size, layer.output_size),
                engine_config=self,
            )

    class Fp8wFp8Config(AsksFp8w, Fp8Config):
        pass

    class Fp8wCompressedTensorsConfig(AsksFp8w, CompressedTensorsConfig):
        pass

    return {"fp8": Fp8wFp8Config, "compressed-tensors": Fp8wCompressedTensorsConfig}


def engine_config(
    raw: Mapping[str, Any],
    mapper: Any = None,
    packed: Mapping[str, list[str]] = PACKED_MODULES,
) -> Any:
    """vLLM's config object for the checkpoint's ``quantization_config`` ``raw``, made by the
    real ``Fp8Config.from_config`` / ``CompressedTensorsConfig.from_config``, given the model's
    fused modules and, with ``mapper`` (a ``WeightsMapper``), its names mapped as a model's
    ``hf_to_vllm_mapper`` maps them (the ignore list included)."""
    cls = _config_classes()[str(raw["quant_method"])]
    config = cls.from_config(copy.deepcopy(dict(raw)))
    config.volta_raw = copy.deepcopy(dict(raw))
    config.packed_modules_mapping = {k: list(v) for k, v in packed.items()}
    if mapper is not None:
        config.apply_vllm_mapper(mapper)
    return config


def adapter_config(raw: Mapping[str, Any], capability: tuple[int, int] = (7, 0)) -> Any:
    """The host adapter's config override for ``raw``'s method (``VoltaFp8Config`` /
    ``VoltaCompressedTensorsConfig``), with a host holding only this plugin, judging claims for
    a device of ``capability``."""
    from volta_core.device import Device
    from volta_core.host.manager import VoltaPluginManager
    from volta_core.vllm.quantization import make_quantization_overrides
    from volta_fp8w import plugin

    manager = VoltaPluginManager(strict=True)
    manager.register(plugin, "fp8w", distribution="vllm-volta-fp8w", version="0.1.0")
    overrides = make_quantization_overrides(manager, lambda: Device(capability))
    config = overrides[str(raw["quant_method"])].from_config(copy.deepcopy(dict(raw)))
    config.packed_modules_mapping = {k: list(v) for k, v in PACKED_MODULES.items()}
    return config


def build(
    kind: str,
    sizes: Sequence[int],
    k: int,
    quant_config: Any,
    *,
    bias: bool = False,
    head: int = 64,
    params_dtype: torch.dtype = torch.float16,
    prefix: str | None = None,
) -> Any:
    """A vLLM layer of ``kind`` (column, row, merged gate/up, or qkv with ``head``-wide heads:
    ``sizes`` the q, k and v rows) with ``k`` inputs, quantized by ``quant_config``."""
    from vllm.model_executor.layers import linear

    common = {
        "bias": bias,
        "params_dtype": params_dtype,
        "quant_config": quant_config,
        "prefix": prefix or PREFIXES[kind],
    }
    if kind == "column":
        return linear.ColumnParallelLinear(k, sizes[0], **common)
    if kind == "row":
        return linear.RowParallelLinear(k, sizes[0], **common)
    if kind == "merged":
        return linear.MergedColumnParallelLinear(k, list(sizes), **common)
    assert kind == "qkv", kind
    assert sizes[1] == sizes[2], sizes
    return linear.QKVParallelLinear(k, head, sizes[0] // head, sizes[1] // head, **common)


def kind_of(layer: Any) -> str:
    return {
        "ColumnParallelLinear": "column",
        "RowParallelLinear": "row",
        "MergedColumnParallelLinear": "merged",
        "QKVParallelLinear": "qkv",
    }[type(layer).__name__]


def load_tensors(
    layer: Any, shards: Sequence[Checkpoint], biases: Sequence[torch.Tensor] | None = None
) -> None:
    """Hand each shard's checkpoint tensors (and bias) to the parameters' weight loaders, as a
    model's ``load_weights`` does (whole tensors: vLLM's loaders take the rank's slice)."""
    ids = SHARD_IDS[kind_of(layer)]
    for i, (shard, ckpt) in enumerate(zip(ids, shards, strict=True)):
        named = dict(ckpt.tensors)
        if biases is not None:
            named["bias"] = biases[i]
        for name, tensor in named.items():
            param = getattr(layer, name)
            args = () if shard is None else (shard,)
            param.weight_loader(param, tensor, *args)


def finish(layer: Any) -> None:
    """What vLLM's loader does for each module with a quant method once every tensor is in."""
    layer.quant_method.process_weights_after_loading(layer)


def load(
    layer: Any, shards: Sequence[Checkpoint], biases: Sequence[torch.Tensor] | None = None
) -> None:
    load_tensors(layer, shards, biases)
    finish(layer)


# -- fused MoE layers, per vLLM family ------------------------------------------------------------


@dataclass(frozen=True)
class MoELayer:
    """A built MoE layer: ``experts`` is vLLM's routed-experts layer (the one holding the quant
    method and the weights), ``runner`` the family's runner of it (the step that routes and calls
    the method). Both loaders take a model's checkpoint names relative to the layer's prefix
    (``3.down_proj.weight_scale``): ``load_weights`` loads as the family's MoE models (Qwen3,
    Qwen3.5) do, ``layer_load_weights`` is the routed-experts layer's own ``load_weights``."""

    experts: Any
    runner: Any
    load_weights: Callable[[Iterable[tuple[str, Any]]], Iterable[str]]
    layer_load_weights: Callable[[Iterable[tuple[str, Any]]], Iterable[str]]


#: The checkpoint's names of an expert's projections, as vLLM's MoE models pass them.
CKPT_NAMES = {"gate": "gate_proj", "down": "down_proj", "up": "up_proj"}


def _fused_moe_layer(quant_config: Any, num_experts: int, **args: Any) -> MoELayer:
    """vLLM 0.19 and 1Cat-vLLM: the routed-experts class (``FusedMoE``; 1Cat's
    ``RoutedExperts`` is the same class) is the layer, its runner ``layer.runner``. Its models
    (Qwen3/Qwen3.5 MoE...) load the experts themselves: each checkpoint name is matched against
    the layer class's ``make_expert_params_mapping`` and handed to the parameter's
    ``weight_loader`` with the shard and expert id. The layer's own ``load_weights`` (the
    Transformers backend's path, given the same mapping) calls the layer's ``weight_loader``
    instead."""
    from volta_core.vllm.quantization import routed_experts_class

    cls = routed_experts_class()
    # (param_name, weight_name, expert_id, shard_id), names under the model's ``experts`` child.
    mapping = cls.make_expert_params_mapping(
        torch.nn.Module(),
        ckpt_gate_proj_name=CKPT_NAMES["gate"],
        ckpt_down_proj_name=CKPT_NAMES["down"],
        ckpt_up_proj_name=CKPT_NAMES["up"],
        num_experts=num_experts,
    )
    layer = cls(num_experts=num_experts, quant_config=quant_config, expert_mapping=mapping, **args)

    def load_weights(weights: Iterable[tuple[str, Any]]) -> Iterator[str]:
        # What the model's load_weights does for an expert weight (qwen3_moe.py, qwen3_5.py).
        for name, loaded_weight in weights:
            name = f"{layer.layer_name}.{name}"  # the prefix ends in ``experts``
            for param_name, weight_name, expert_id, shard_id in mapping:
                if weight_name not in name:
                    continue
                mapped = name.replace(weight_name, param_name)
                param = getattr(layer, mapped.removeprefix(f"{layer.layer_name}."))
                if param.weight_loader(
                    param,
                    loaded_weight,
                    mapped,
                    shard_id=shard_id,
                    expert_id=expert_id,
                    return_success=True,
                ):
                    yield mapped
                    break

    return MoELayer(layer, layer.runner, load_weights, layer.load_weights)


def _moe_factory_layer(quant_config: Any, num_experts: int, **args: Any) -> MoELayer:
    """vLLM 0.32-0.33: ``FusedMoEFactory`` builds a runner that owns the ``RoutedExperts``
    layer (the checkpoint names are the layer's own, ``ckpt_names``); models load through the
    runner's ``load_weights``, which hands the names to the layer's."""
    from vllm.model_executor.layers.fused_moe import FusedMoEFactory

    runner = FusedMoEFactory(
        num_experts=num_experts,
        quant_config=quant_config,
        ckpt_names=(CKPT_NAMES["gate"], CKPT_NAMES["down"], CKPT_NAMES["up"]),
        **args,
    )
    experts = runner.routed_experts
    return MoELayer(experts, runner, runner.load_weights, experts.load_weights)


def _layer_runner_step(layer: MoELayer, x: torch.Tensor, logits: torch.Tensor) -> Any:
    """0.19's ``DefaultMoERunner._apply_quant_method`` (``apply(layer=, x=, topk_weights=,
    topk_ids=, shared_experts_input=)``) and 1Cat-vLLM's ``MoERunner._apply_quant_method``
    (the same and ``shared_experts=``)."""
    return layer.runner._apply_quant_method(layer.experts, x, logits, None)


def _runner_step_0_32(layer: MoELayer, x: torch.Tensor, logits: torch.Tensor) -> Any:
    """0.32's ``MoERunner._apply_quant_method``: ``RoutedExperts.forward_modular``, which calls
    ``apply(..., shared_experts=, shared_experts_input=)``."""
    return layer.runner._apply_quant_method(x, logits, None)


@dataclass(frozen=True)
class MoEFamily:
    """How a vLLM family builds a fused-MoE layer and runs its quant method after routing."""

    build: Callable[..., MoELayer]
    runner_step: Callable[[MoELayer, torch.Tensor, torch.Tensor], Any]


#: Each family's (``volta_core.vllm.families.Family.name``).
MOE_FAMILIES: dict[str, MoEFamily] = {
    "vLLM 0.19": MoEFamily(_fused_moe_layer, _layer_runner_step),
    "1Cat-vLLM 1.2-1.3": MoEFamily(_fused_moe_layer, _layer_runner_step),
    "vLLM 0.32-0.33": MoEFamily(_moe_factory_layer, _runner_step_0_32),
}


def _moe_family() -> MoEFamily:
    from volta_core.vllm.families import family

    return MOE_FAMILIES[family().name]


def build_moe(quant_config: Any, *, num_experts: int, prefix: str, **args: Any) -> MoELayer:
    """A vLLM fused-MoE layer of the installed family, its experts quantized by
    ``quant_config``; ``args`` are the keyword arguments every family's constructor takes
    (``top_k``, ``hidden_size``, ``intermediate_size``, ``params_dtype``, ``activation``...)."""
    from vllm.config import get_current_vllm_config

    # A model registers each MoE layer by name once; the tests build the same one again.
    get_current_vllm_config().compilation_config.static_forward_context.pop(prefix, None)
    return _moe_family().build(quant_config, num_experts, prefix=prefix, **args)


def load_moe(layer: MoELayer, tensors: Mapping[str, torch.Tensor], by_layer: bool = False) -> Any:
    """vLLM's loader with a model's checkpoint names (as the family's models load them, or
    ``by_layer`` the routed-experts layer's own ``load_weights``), then the post-load hook;
    the routed-experts layer."""
    list((layer.layer_load_weights if by_layer else layer.load_weights)(list(tensors.items())))
    experts = layer.experts
    experts.quant_method.process_weights_after_loading(experts)
    return experts


def apply_routed(
    layer: MoELayer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """The routed experts' output as the family's runner computes it in a forward pass: its
    step that routes and hands the choice to the quant method's ``apply`` (with the arguments
    that family passes), the router's choice being ``topk_weights`` / ``topk_ids``."""
    logits = torch.zeros(x.shape[0], layer.experts.global_num_experts, dtype=x.dtype)

    def select_experts(
        *, hidden_states: torch.Tensor, router_logits: torch.Tensor, **_: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert hidden_states is x
        assert router_logits is logits
        return topk_weights, topk_ids

    with mock.patch.object(layer.runner.router, "select_experts", select_experts):
        shared, routed = _moe_family().runner_step(layer, x, logits)
    assert shared is None
    assert isinstance(routed, torch.Tensor), type(routed)
    return routed


def run_two_ranks(script: str, env: dict[str, str], args: Sequence[str] = ()) -> list[str]:
    """Run ``script RANK 2 INIT_FILE *args`` as two processes (a gloo tensor-parallel group of
    two) and return each rank's output, after checking both exited cleanly and printed
    ``TP-OK``."""
    init = tempfile.mktemp()
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(rank), "2", init, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for rank, (p, text) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"rank {rank} failed:\n{text[-3000:]}"
        assert "TP-OK" in text, text[-3000:]
    return outputs
