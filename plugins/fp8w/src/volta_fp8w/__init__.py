"""vllm-volta plugin: dense FP8 (e4m3) checkpoints on Volta, run weight-only (W8A16).

vLLM's ``fp8`` checkpoints (Qwen's official FP8 releases: e4m3 weights, ``weight_scale_inv`` per
128 x 128 block) and compressed-tensors ``float-quantized`` ones (llm-compressor's FP8: channel,
tensor or block scales) run with fp16 activations; SM70 has no FP8 arithmetic, so the kernels
decode e4m3 in registers with integer operations and multiply one scale per block.

Importing the package imports neither torch, triton nor vllm; the kernels (:mod:`.kernels`, and on
a V100 the CUDA tensor-core GEMM of :mod:`.cuda`), the load-time checks (:mod:`.layout`) and the
vLLM methods (:mod:`.linear`, :mod:`.moe`) are imported only when a layer uses them. Launch
choices, in layers that import only those below them: the limits the plugin declares
(:mod:`.limits`), the launch parameters per device family as data (:mod:`.tables`), what follows
from one launch (:mod:`.launch`), and :mod:`.dispatch`, the one answer to which kernel runs a
call, every build shipped for a device and what a launch costs.
"""

__version__ = "0.4.1"
