"""vllm-volta plugin: compressed-tensors weight-only int4/int8 linear layers on Volta.

Importing the package imports neither torch, triton nor vllm; the kernels (:mod:`.kernels`, and
on a V100 the CUDA tensor-core GEMM of :mod:`.cuda`), the load-time preparation (:mod:`.layout`)
and the vLLM methods (:mod:`.linear`, :mod:`.moe`) are imported only when a layer uses them.
Launch choices, in layers that import only those below them: the limits the plugin declares
(:mod:`.limits`), the launch parameters per device family as data (:mod:`.tables`), what follows
from one launch (:mod:`.launch`), and :mod:`.dispatch`, the one answer to which kernel runs a
call, every build shipped for a device and what a launch costs, which the launcher, the gate
configurations (:mod:`.gate_configs`) and the plan's hooks (:mod:`.plugin`) read.
"""

__version__ = "0.10.1"
