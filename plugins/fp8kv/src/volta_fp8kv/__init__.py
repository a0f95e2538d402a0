"""vllm-volta-fp8kv: FP8 KV cache on V100 (SM70), e5m2 with per-tensor and per-head scales.

Importing the package imports no torch or triton: the plugin module (:mod:`volta_fp8kv.plugin`)
and the rules (:mod:`volta_fp8kv.policy`) are pure Python; the kernels and their wrappers
(:mod:`volta_fp8kv.ops`) are imported only by whoever launches them.
"""

__version__ = "0.2.5"
