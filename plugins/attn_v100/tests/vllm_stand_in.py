"""Stand-ins for the vLLM names ``volta_attn_v100.backend`` imports, where vLLM is not installed.

The GPU machine has torch and Triton but no vLLM (the plugin README's "Not done" list), so a GPU
test of the backend's classes registers these modules first. Each name has the members the
backend and the tests use, with vLLM 0.32's values (``vllm/v1/attention/backend.py``,
``vllm/config/compilation.py``); where vLLM imports, :func:`install` leaves it alone.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

import torch

M = TypeVar("M")


class AttentionType(str, Enum):
    DECODER = "decoder"
    ENCODER = "encoder"
    ENCODER_ONLY = "encoder_only"
    ENCODER_DECODER = "encoder_decoder"


class AttentionCGSupport(Enum):
    ALWAYS = 3
    UNIFORM_BATCH = 2
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    NEVER = 0


class CUDAGraphMode(Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass(frozen=True)
class MultipleOf:
    base: int


class AttentionBackend:
    pass


class AttentionLayer:
    pass


class AttentionImpl(Generic[M]):
    pass


class AttentionMetadataBuilder(Generic[M]):
    def __init__(
        self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.layer_names = layer_names
        self.vllm_config = vllm_config
        self.device = device


@dataclass
class CommonAttentionMetadata:
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor
    seq_lens_cpu_upper_bound: torch.Tensor | None = None


class VllmConfig:
    pass


class AttentionSpec:
    pass


def install() -> None:
    """Register the stand-in modules under vLLM's names unless vLLM itself imports."""
    try:
        import vllm.v1.attention.backend  # noqa: F401
    except ImportError:
        pass
    else:
        return
    members = {
        "vllm": {},
        "vllm.config": {"CUDAGraphMode": CUDAGraphMode, "VllmConfig": VllmConfig},
        "vllm.v1": {},
        "vllm.v1.attention": {},
        "vllm.v1.attention.backend": {
            "AttentionBackend": AttentionBackend,
            "AttentionCGSupport": AttentionCGSupport,
            "AttentionImpl": AttentionImpl,
            "AttentionLayer": AttentionLayer,
            "AttentionMetadataBuilder": AttentionMetadataBuilder,
            "AttentionType": AttentionType,
            "CommonAttentionMetadata": CommonAttentionMetadata,
            "MultipleOf": MultipleOf,
        },
        "vllm.v1.kv_cache_interface": {"AttentionSpec": AttentionSpec},
    }
    for name, attrs in members.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
