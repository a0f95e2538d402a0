"""Real vLLM linear layers quantized by this plugin's method and loaded like a model does.

Shared by ``test_vllm_linear.py`` (one rank, in process) and ``tp_worker.py`` (two ranks).
Layers come from vLLM's own classes (column, row, merged gate/up, QKV). Their quant config is
vLLM's real config class for the checkpoint's method (``Fp8Config`` / ``CompressedTensorsConfig``,
made by its own ``from_config``, told the model's fused modules and, when a test passes one,
mapped by a model's ``WeightsMapper``), whose linear layers get the plugin's factory
(``volta_fp8w.linear:make_linear_method``) called as the host's adapter calls it: the checkpoint's
config, the layer, and that config object as ``engine_config``. Each checkpoint tensor goes
through vLLM's own loader (a parameter's ``weight_loader`` with the shard id a model's
``load_weights`` passes); then vLLM's ``process_weights_after_loading`` hook runs.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

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
