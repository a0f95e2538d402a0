"""Real vLLM linear layers quantized through the host's adapter and loaded like a model does.

Shared by ``test_vllm_linear.py`` (one rank, in process) and ``tp_worker.py`` (two ranks).
Layers come from vLLM's own classes; their quant method comes from the adapter's
``compressed-tensors`` config override asking the host, which asks this plugin; each checkpoint
tensor goes through the parameter's ``weight_loader`` with the shard id a model's
``load_weights`` passes; then vLLM's ``process_weights_after_loading`` hook runs.
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import torch

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from volta_core.device import Device
from volta_core.manager import VoltaPluginManager
from volta_ct_wna16 import plugin
from volta_ct_wna16.testing import Checkpoint


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
    """The adapter's compressed-tensors config, with a host holding only this plugin."""
    from volta_core.vllm.compat import make_quantization_overrides

    manager = VoltaPluginManager(strict=True)
    manager.register(plugin, "ct_wna16", distribution="vllm-volta-ct-wna16", version="0.1.0")
    overrides = make_quantization_overrides(manager, lambda: Device(capability))
    return overrides["compressed-tensors"].from_config(copy.deepcopy(raw))


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
