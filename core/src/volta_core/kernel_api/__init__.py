"""The host's kernel-side plugin API: what every Volta kernel plugin shares at run time.

* the FP8 KV-cache element codec (:func:`encode_fp8`, :func:`decode_fp8` and their tile forms),
  Triton device functions, so a cache's codes do not depend on which plugin wrote them;
* arrival counters and zeroed accumulators for split reductions done in one launch;
* :func:`device_facts`, the compute capability and SM count a launch is planned for;
* CUDA C++ kernels compiled at first use by NVRTC (:func:`load_cuda_kernel`,
  :func:`compile_cubin`, :func:`compile_ptx`), cached on disk and launched on torch's stream;
  they need the core's ``cuda`` extra, imported only when first used; :class:`CudaBuilds`, the
  one rule for when a plugin's CUDA build runs and when its Triton path serves instead.

Imported only by kernel code (it imports triton): the host itself, the ``vllm-volta`` command
and the vLLM adapter never import it. Developer tooling (the SM70 compile gate, the benchmark
harness, test helpers) lives in the separate ``vllm-volta-devkit`` distribution.
"""

from volta_core.cuda_toolkit import CudaToolkitUnavailable, nvrtc_version
from volta_core.kernel_api._builds import CudaBuilds
from volta_core.kernel_api._counters import MIN_COUNTERS, arrival_counters, zeroed_accumulators
from volta_core.kernel_api._device_facts import (
    INTERPRETER_FACTS,
    DeviceFacts,
    device_facts,
    interpreting,
)
from volta_core.kernel_api._fp8 import decode_fp8, dequantize_tile, encode_fp8, quantize_tile
from volta_core.kernel_api._nvrtc import (
    CudaCompileError,
    CudaKernel,
    NvrtcBuild,
    compile_cubin,
    compile_ptx,
    cuda_cache_dir,
    load_cuda_kernel,
    nvrtc_build,
)

__all__ = [
    "INTERPRETER_FACTS",
    "MIN_COUNTERS",
    "CudaBuilds",
    "CudaCompileError",
    "CudaKernel",
    "CudaToolkitUnavailable",
    "DeviceFacts",
    "NvrtcBuild",
    "arrival_counters",
    "compile_cubin",
    "compile_ptx",
    "cuda_cache_dir",
    "decode_fp8",
    "dequantize_tile",
    "device_facts",
    "encode_fp8",
    "interpreting",
    "load_cuda_kernel",
    "nvrtc_build",
    "nvrtc_version",
    "quantize_tile",
    "zeroed_accumulators",
]
