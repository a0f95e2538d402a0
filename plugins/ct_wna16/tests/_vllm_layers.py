"""Real vLLM layers quantized through the host's adapter and loaded like a model does.

Shared by ``test_vllm_linear.py`` (one rank, in process), ``tp_worker.py`` (two ranks) and
``test_moe.py``. Layers come from vLLM's own classes; their quant method comes from the
adapter's ``compressed-tensors`` config override asking the host, which asks this plugin; each
checkpoint tensor goes through vLLM's own loader (a linear parameter's ``weight_loader`` with
the shard id a model's ``load_weights`` passes, the MoE layer's ``load_weights`` with a model's
checkpoint names); then vLLM's ``process_weights_after_loading`` hook runs.

The one place that knows how each vLLM family builds a layer is :func:`build_moe` (linear
layers are built the same way in every family).
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from ct_wna16_checkpoints import Checkpoint

from volta_core.device import Device
from volta_core.host.manager import VoltaPluginManager
from volta_ct_wna16 import plugin


@contextlib.contextmanager
def vllm_process(rank: int = 0, world: int = 1, init_file: str | None = None) -> Iterator[None]:
    """A vLLM config and the distributed groups (gloo on CPU), torn down on exit.

    Torn down so that nothing of it outlives its tests: a current vLLM config left set would
    change what later tests in the same process see (the adapter reads it).
    """
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


def engine_config(raw: dict[str, Any], capability: tuple[int, int] = (7, 0)) -> Any:
    """The adapter's config for the checkpoint's ``quant_method`` (compressed-tensors, AWQ,
    GPTQ), with a host holding only this plugin."""
    from volta_core.vllm.quantization import make_quantization_overrides

    manager = VoltaPluginManager(strict=True)
    manager.register(plugin, "ct_wna16", distribution="vllm-volta-ct-wna16", version="0.1.0")
    overrides = make_quantization_overrides(manager, lambda: Device(capability))
    method = str(raw.get("quant_method", "compressed-tensors"))
    return overrides[method].from_config(copy.deepcopy(raw))


def build(kind: str, sizes: list[int], k: int, raw: dict[str, Any], bias: bool) -> Any:
    """A vLLM layer of ``kind``: column, row, merged (gate_up) or qkv (head size 16)."""
    from vllm.model_executor.layers import linear

    cfg = engine_config(raw)
    common = {"bias": bias, "params_dtype": torch.float16, "quant_config": cfg}
    if kind == "column":
        return linear.ColumnParallelLinear(k, sizes[0], prefix="model.layers.0.mlp.up", **common)
    if kind == "row":
        return linear.RowParallelLinear(
            k, sizes[0], prefix="model.layers.0.mlp.down_proj", **common
        )
    if kind == "merged":
        return linear.MergedColumnParallelLinear(
            k, sizes, prefix="model.layers.0.mlp.gate_up_proj", **common
        )
    head = 16
    return linear.QKVParallelLinear(
        k,
        head,
        sizes[0] // head,
        sizes[1] // head,
        prefix="model.layers.0.self_attn.qkv_proj",
        **common,
    )


def shard_ids(kind: str) -> list[Any]:
    return {"column": [None], "row": [None], "merged": [0, 1], "qkv": ["q", "k", "v"]}[kind]


def load(layer: Any, shards: list[Checkpoint], biases: list[torch.Tensor] | None) -> None:
    """Feed each shard's tensors to the parameters' loaders, then finish loading."""
    kind = {
        "ColumnParallelLinear": "column",
        "RowParallelLinear": "row",
        "MergedColumnParallelLinear": "merged",
        "QKVParallelLinear": "qkv",
    }[type(layer).__name__]
    for i, (shard, ckpt) in enumerate(zip(shard_ids(kind), shards, strict=True)):
        named = dict(ckpt.tensors)
        if biases is not None:
            named["bias"] = biases[i]
        for name, tensor in named.items():
            param = getattr(layer, name)
            args = () if shard is None else (shard,)
            param.weight_loader(param, tensor, *args)
    # What vLLM's process_weights_after_loading does for each module with a quant method.
    layer.quant_method.process_weights_after_loading(layer)


@dataclass(frozen=True)
class MoELayer:
    """A built MoE layer: ``experts`` is vLLM's routed-experts layer (the one holding the quant
    method and the weights). Both loaders take a model's checkpoint names relative to the
    layer's prefix (``3.down_proj.weight_scale``): ``load_weights`` loads as the family's MoE
    models (Qwen3, Qwen3.5) do, ``layer_load_weights`` is the routed-experts layer's own
    ``load_weights``."""

    experts: Any
    load_weights: Callable[[Iterable[tuple[str, Any]]], Iterable[str]]
    layer_load_weights: Callable[[Iterable[tuple[str, Any]]], Iterable[str]]


#: The checkpoint's names of an expert's projections, as vLLM's MoE models pass them.
CKPT_NAMES = {"gate": "gate_proj", "down": "down_proj", "up": "up_proj"}


def _fused_moe_layer(quant_config: Any, num_experts: int, **args: Any) -> MoELayer:
    """vLLM 0.19 and 1Cat-vLLM: the routed-experts class (``FusedMoE``; 1Cat's
    ``RoutedExperts`` is the same class) is the layer. Its models (Qwen3/Qwen3.5 MoE...) load
    the experts themselves: each checkpoint name is matched against the layer class's
    ``make_expert_params_mapping`` and handed to the parameter's ``weight_loader`` with the
    shard and expert id. The layer's own ``load_weights`` (the Transformers backend's path,
    given the same mapping) calls the layer's ``weight_loader`` instead."""
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

    return MoELayer(layer, load_weights, layer.load_weights)


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
    return MoELayer(experts, runner.load_weights, experts.load_weights)


#: How each family builds a fused-MoE layer (``volta_core.vllm.families.Family.name``).
MOE_BUILDERS: dict[str, Callable[..., MoELayer]] = {
    "vLLM 0.19": _fused_moe_layer,
    "1Cat-vLLM 1.2-1.3": _fused_moe_layer,
    "vLLM 0.32-0.33": _moe_factory_layer,
}


def build_moe(quant_config: Any, *, num_experts: int, prefix: str, **args: Any) -> MoELayer:
    """A vLLM fused-MoE layer of the installed family, its experts quantized by
    ``quant_config``; ``args`` are the keyword arguments every family's constructor takes
    (``top_k``, ``hidden_size``, ``intermediate_size``, ``params_dtype``, ``activation``...)."""
    from vllm.config import get_current_vllm_config

    from volta_core.vllm.families import family

    # A model registers each MoE layer by name once; the tests build the same one again.
    get_current_vllm_config().compilation_config.static_forward_context.pop(prefix, None)
    builder = MOE_BUILDERS[family().name]
    return builder(quant_config, num_experts, prefix=prefix, **args)


def run_two_ranks(script: str, env: dict[str, str]) -> list[str]:
    """Run ``script RANK 2 INIT_FILE`` as two processes (a gloo tensor-parallel group of two)
    and return each rank's output, after checking both exited cleanly and printed ``TP-OK``."""
    init = tempfile.mktemp()
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(rank), "2", init],
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
