"""The FP8 codec's format codes (its ``FMT`` constexpr), by KV-cache dtype: one table that the
codec's Triton functions, the cache writers and the attention kernels all read. Torch- and
triton-free."""

from __future__ import annotations

#: ``FMT`` of :func:`volta_core.kernel_api.quantize_tile` and ``dequantize_tile`` per fp8 dtype.
FP8_FORMAT_CODES: dict[str, int] = {"fp8_e5m2": 1, "fp8_e4m3": 2}
