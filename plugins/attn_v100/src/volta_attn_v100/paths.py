"""Which kernel runs a layer's prefill and decode on a device, for ``vllm-volta plan``.

From the rules the launcher applies (:func:`volta_attn_v100.tables.takes_cuda_prefill` and
:func:`~volta_attn_v100.tables.takes_cuda_decode`, which :mod:`volta_attn_v100.ops` calls per
launch); decode is walked over every query length a decode launch takes (1 to
:data:`volta_attn_v100.limits.MAX_DECODE_QUERY_LEN`, MTP included) and grouped into ranges.
Torch-free: the plugin's hooks import it.
"""

from __future__ import annotations

from volta_attn_v100.limits import MAX_DECODE_QUERY_LEN
from volta_attn_v100.tables import takes_cuda_decode, takes_cuda_prefill
from volta_core import AttentionLayer, KernelPath, canonical_kv_dtype

#: The CUDA kernels on Volta's tensor cores (``cuda/prefill.cu``, ``cuda/decode.cu``).
TENSOR_CORES = "tensor cores (CUDA, mma.m8n8k4)"
#: The Triton kernels: tensor cores from SM80, the FMA units on SM70 (triton-lang/triton#5066).
TRITON = "Triton"


def _path(stage: str, tensor_cores: bool) -> KernelPath:
    if tensor_cores:
        return KernelPath(stage, TENSOR_CORES, needs_nvrtc=True, fallback=TRITON)
    return KernelPath(stage, TRITON)


def _decode_stage(first: int, last: int) -> str:
    if first == last:
        return f"decode, {first} query token" + ("s" if first > 1 else "")
    return f"decode, {first}-{last} query tokens"


def attention_paths(layer: AttentionLayer, capability: tuple[int, int]) -> list[KernelPath]:
    """The prefill's kernel and the decode's per range of query lengths, for ``layer``."""
    kv_dtype = canonical_kv_dtype(layer.kv_cache_dtype, layer.dtype)
    group = layer.num_heads // max(1, layer.num_kv_heads)
    paths = [_path("prefill", takes_cuda_prefill(capability, layer.head_size, kv_dtype))]
    chosen = [
        takes_cuda_decode(capability, layer.head_size, kv_dtype, group, q_len)
        for q_len in range(1, MAX_DECODE_QUERY_LEN + 1)
    ]
    first = 1
    for q_len in range(1, MAX_DECODE_QUERY_LEN + 1):
        if q_len < MAX_DECODE_QUERY_LEN and chosen[q_len] == chosen[q_len - 1]:
            continue
        paths.append(_path(_decode_stage(first, q_len), chosen[q_len - 1]))
        first = q_len + 1
    return paths
