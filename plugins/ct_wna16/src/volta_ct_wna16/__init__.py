"""vllm-volta plugin: compressed-tensors weight-only int4/int8 linear layers on Volta.

Importing the package imports neither torch, triton nor vllm; the kernels (:mod:`.kernels`), the
load-time preparation (:mod:`.layout`) and the vLLM method (:mod:`.linear`) are imported only
when a layer uses them.
"""

__version__ = "0.2.1"
