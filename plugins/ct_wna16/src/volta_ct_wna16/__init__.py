"""vllm-volta plugin: compressed-tensors weight-only int4/int8 linear layers on Volta.

Importing the package imports neither torch, triton nor vllm; the kernels (:mod:`.kernels`, and
on a V100 the CUDA tensor-core GEMM of :mod:`.cuda`), the load-time preparation (:mod:`.layout`)
and the vLLM methods (:mod:`.linear`, :mod:`.moe`) are imported only when a layer uses them.
Launch choices are data: the limits the plugin declares (:mod:`.limits`), one launch's rules
(:mod:`.launch`), the tables per device family (:mod:`.tables`) with the SM70 time model they
choose the tensor cores by (:mod:`.sm70_model`), and the configurations the SM70 gates compile
(:mod:`.gate_configs`).
"""

__version__ = "0.6.2"
