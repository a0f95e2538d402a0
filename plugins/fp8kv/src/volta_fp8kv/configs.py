"""Launch configurations: the one table the wrappers launch from and the SM70 gate checks.

Pure Python (no torch, no triton), so the ``volta_kernel_configs`` hook lists exactly what the
wrappers in :mod:`volta_fp8kv.ops` would launch without importing a kernel. The kernels are
memory-bound, so a tile is as many bytes in flight as the register file allows without spills:
at most 1024 elements and 8 tokens a program on SM70, 2048 and 16 from SM80 (the tile sweep of
docs/perf/fp8kv/PERFORMANCE_HISTORY.md#first_session; 4096 elements, or 32 tokens of 64,
spilled at sm_90).
"""

from __future__ import annotations

import itertools

from volta_core import Device, KernelConfig
from volta_core.kernel_api import FP8_FORMAT_CODES

#: The padded head sizes (next power of two of ``max(head_size_k, head_size_v)``) configured:
#: 64 up to 512 (Gemma 4's global layers use 512). Each comes ``FULL`` (both head sizes equal
#: the pad: unmasked, vectorized rows) and masked (head sizes such as 80 or 96, or K != V).
HEAD_PADS: tuple[int, ...] = (64, 128, 256, 512)

#: Kernel name -> import path of the ``@triton.jit`` function.
KERNELS = {
    "cache_write": "volta_fp8kv.kernels.cache_write:cache_write_kernel",
    "gather": "volta_fp8kv.kernels.gather:gather_kernel",
}

#: The cache formats this plugin writes, with each one's ``FMT`` constexpr: 0 stores fp16 values
#: unchanged, the FP8 formats take the codec's own codes (the host's
#: :data:`volta_core.kernel_api.FP8_FORMAT_CODES`, which the codec reads).
FORMAT_CODES: dict[str, int] = {"float16": 0, **FP8_FORMAT_CODES}

_SIGNATURES = {
    "cache_write": (
        ("key_ptr", "*fp16"),
        ("value_ptr", "*fp16"),
        ("cache_ptr", "CACHE"),
        ("slot_ptr", "*i64"),
        ("k_scale_ptr", "*fp32"),
        ("v_scale_ptr", "*fp32"),
        *(
            (name, "i32")
            for name in (
                "num_tokens",
                "num_slots",
                "block_size",
                "head_size_k",
                "head_size_v",
                "stride_key_t",
                "stride_key_h",
                "stride_value_t",
                "stride_value_h",
                "stride_cache_b",
                "stride_cache_h",
                "stride_cache_n",
                "stride_scale",
            )
        ),
    ),
    "gather": (
        ("cache_ptr", "CACHE"),
        ("key_out_ptr", "*fp16"),
        ("value_out_ptr", "*fp16"),
        ("block_table_ptr", "*i32"),
        ("seq_lens_ptr", "*i32"),
        ("cu_seqlens_ptr", "*i32"),
        ("k_scale_ptr", "*fp32"),
        ("v_scale_ptr", "*fp32"),
        *(
            (name, "i32")
            for name in (
                "num_blocks",
                "block_size",
                "head_size_k",
                "head_size_v",
                "stride_table_s",
                "stride_cache_b",
                "stride_cache_h",
                "stride_cache_n",
                "stride_key_out_t",
                "stride_key_out_h",
                "stride_value_out_t",
                "stride_value_out_h",
                "stride_scale",
            )
        ),
    ),
}


#: Integer arguments that are multiples of 16 at every launch vLLM makes (blocks of 16k,
#: head sizes of 16k, so the cache's slot count and every cache and key/value stride); the JIT
#: specializes them, and the gate compiles them so as well as unspecialized (``gate_variants``).
_DIVISIBLE = {
    "cache_write": (
        "num_slots",
        "block_size",
        "head_size_k",
        "head_size_v",
        "stride_key_t",
        "stride_key_h",
        "stride_value_t",
        "stride_value_h",
        "stride_cache_b",
        "stride_cache_h",
        "stride_cache_n",
    ),
    "gather": (
        "block_size",
        "head_size_k",
        "head_size_v",
        "stride_cache_b",
        "stride_cache_h",
        "stride_cache_n",
        "stride_key_out_t",
        "stride_key_out_h",
        "stride_value_out_t",
        "stride_value_out_h",
    ),
}


def head_pad(head_size_k: int, head_size_v: int) -> int:
    """The ``HEAD_PAD`` constexpr for a layer: the next power of two, at least the smallest
    configured pad (so every launch is a configuration the gate compiled)."""
    size = max(head_size_k, head_size_v, HEAD_PADS[0])
    return 1 << (size - 1).bit_length()


def tile(capability: tuple[int, int], head_pad_: int) -> tuple[int, int]:
    """``(BLOCK_T, num_warps)`` for a device and padded head size (same for both kernels)."""
    if capability < (8, 0):
        # Volta: at most 1024 elements and 8 tokens a program (16 rows of 64 spilled at sm_70).
        return max(1, min(8, 1024 // head_pad_)), 4
    return max(1, min(16, 2048 // head_pad_)), 4


def formats_for(device: Device) -> tuple[str, ...]:
    """Cache formats the kernels are launched with on ``device`` (e4m3 only where it exists)."""
    return ("float16", "fp8_e5m2", "fp8_e4m3") if device.has_fp8_e4m3 else ("float16", "fp8_e5m2")


#: The cache write's launch specializations of its per-call token count and its scale stride
#: (``per_head``, 0 or 1): name suffix -> (compile-time values, arguments divisible by 16). The
#: JIT specializes an integer argument by its value at each launch (``triton/runtime/jit.py``
#: ``create_function_from_signature``, ``native_specialize_impl``): 1 becomes a compile-time
#: constant, a multiple of 16 (0 included) is marked divisible, any other value is plain. So a
#: one-sequence decode step (1 token), a step of 16k tokens (most CUDA-graph sizes, prefill
#: chunks) and any other count are three builds, each with per-tensor scales (stride 0) or per
#: KV head (stride 1): the gate and ``vllm-volta warmup`` compile each that a launch makes.
WRITE_LAUNCHES: dict[str, tuple[dict[str, int], tuple[str, ...]]] = {
    tokens + scales: ({**tokens_constant, **scales_constant}, tokens_divisible + scales_divisible)
    for tokens, (tokens_constant, tokens_divisible) in (
        ("", ({}, ())),
        (",tokens=1", ({"num_tokens": 1}, ())),
        (",tokens=16k", ({}, ("num_tokens",))),
    )
    for scales, (scales_constant, scales_divisible) in (
        ("", ({}, ("stride_scale",))),
        (",per_head", ({"stride_scale": 1}, ())),
    )
}


def kernel_configs(device: Device) -> list[KernelConfig]:
    """Every launch configuration the wrappers would use on ``device``, for the compile gate:
    the gather once per format and head pad, the cache write also once per
    :data:`WRITE_LAUNCHES` specialization."""
    configs = []
    for kernel, path in KERNELS.items():
        launches = WRITE_LAUNCHES if kernel == "cache_write" else {"": ({}, ())}
        for fmt in formats_for(device):
            cache_type = "*fp16" if fmt == "float16" else "*u8"
            signature = {
                name: (cache_type if kind == "CACHE" else kind)
                for name, kind in _SIGNATURES[kernel]
            }
            for pad, full in itertools.product(HEAD_PADS, (True, False)):
                block_t, num_warps = tile(device.capability, pad)
                for suffix, (constant, divisible) in launches.items():
                    configs.append(
                        KernelConfig(
                            name=f"fp8kv.{kernel}[{fmt},head_pad={pad}"
                            f"{'' if full else ',masked'}{suffix}]",
                            kernel=path,
                            signature={k: v for k, v in signature.items() if k not in constant},
                            constexprs={
                                **constant,
                                "FMT": FORMAT_CODES[fmt],
                                "HEAD_PAD": pad,
                                "FULL": full,
                                "BLOCK_T": block_t,
                            },
                            num_warps=num_warps,
                            num_stages=1,
                            divisible_by_16=_DIVISIBLE[kernel] + divisible,
                        )
                    )
    return configs
