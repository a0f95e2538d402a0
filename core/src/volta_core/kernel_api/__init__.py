"""The host's kernel-side plugin API: what every Volta kernel plugin shares.

* the dispatch contract (:class:`Choice`, :class:`KernelCost`, :class:`StageCost`,
  :data:`V100_RATES`, :func:`stage_ranges`...): which kernel runs a call and what it costs,
  answered once per plugin and read by its launcher, its gates, the plan and the estimate;
  torch- and triton-free, so the ``vllm-volta`` command and the plugins' hooks import it;
* the FP8 KV-cache element codec (:func:`encode_fp8`, :func:`decode_fp8` and their tile forms),
  Triton device functions, so a cache's codes do not depend on which plugin wrote them;
* arrival counters and zeroed accumulators for split reductions done in one launch, and the
  split-K serial reduction over them as Triton device functions (:func:`accumulate_splits`,
  :func:`take_sums`, :func:`store_out`), so every plugin's split-K sums its splits one way;
* :func:`device_facts`, the compute capability and SM count a launch is planned for;
* CUDA C++ kernels compiled at first use by NVRTC (:func:`load_cuda_kernel`,
  :func:`compile_cubin`, :func:`compile_ptx`), cached on disk and launched on torch's stream;
  they need the core's ``cuda`` extra, imported only when first used; :class:`CudaBuilds`, the
  one rule for when a plugin's CUDA build runs and when its Triton path serves instead;
  :data:`SM70_PRELUDE`, the device helpers those kernels share (``mma_m8n8k4``, ``pack_half2``,
  ``h2f``, ``ex2``, the ``u8``/``u16``/``u32`` typedefs, the split-K epilogue
  ``splitk_mma_epilogue`` and its arrival ``splitk_arrive``), put in front of a kernel's source
  by :func:`with_prelude`;
* the timing of a GPU call as vLLM runs it (:func:`time_cuda_graph`, :func:`time_cuda`,
  :func:`rotation_count`) and the ceilings it is judged against (:func:`measure_copy_bandwidth`,
  :func:`measure_read_bandwidth`, :func:`measure_matmul`), torch imported inside, which the
  ``vllm-volta bench`` command and the devkit's benchmark harness share; and
  :class:`BenchCase` and :class:`BenchCall`, how a plugin has that command time one
  stage's kernel.

The codec and the split-K functions import triton, so each module is loaded on first use of one
of its names (PEP 562): importing this package imports neither torch nor triton. Developer
tooling (the SM70 compile gate, the benchmark harness, test helpers) lives in the separate
``vllm-volta-devkit`` distribution.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from volta_core.cuda_toolkit import CudaToolkitUnavailable, nvrtc_version
from volta_core.host.bench_case import BenchCall, BenchCase
from volta_core.host.dispatch import (
    V100_RATES,
    Choice,
    DeviceRates,
    KernelCost,
    LaunchCost,
    StageCost,
    Unit,
    Workload,
    kernel_paths,
    stage_of,
    stage_ranges,
    token_stage,
)
from volta_core.kernel_api._builds import CudaBuilds
from volta_core.kernel_api._counters import MIN_COUNTERS, arrival_counters, zeroed_accumulators
from volta_core.kernel_api._device_facts import (
    INTERPRETER_FACTS,
    DeviceFacts,
    device_facts,
    interpreting,
)
from volta_core.kernel_api._fp8_codes import FP8_FORMAT_CODES
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
from volta_core.kernel_api._prelude import SM70_PRELUDE, with_prelude
from volta_core.kernel_api._timing import (
    COPY_BYTES,
    L2_MULTIPLE,
    MATMUL_N,
    Timing,
    l2_bytes,
    measure_copy_bandwidth,
    measure_fp16_matmul,
    measure_matmul,
    measure_read_bandwidth,
    rotation_count,
    time_cuda,
    time_cuda_graph,
)

if TYPE_CHECKING:
    from volta_core.kernel_api._fp8 import (
        decode_fp8,
        dequantize_tile,
        encode_fp8,
        quantize_tile,
    )
    from volta_core.kernel_api._keys import settle_cache_keys
    from volta_core.kernel_api._splitk import accumulate_splits, store_out, take_sums

#: Names whose module imports triton, loaded when first asked for.
_TRITON_NAMES = {
    **dict.fromkeys(("decode_fp8", "dequantize_tile", "encode_fp8", "quantize_tile"), "_fp8"),
    **dict.fromkeys(("accumulate_splits", "store_out", "take_sums"), "_splitk"),
    "settle_cache_keys": "_keys",
}


def __getattr__(name: str) -> Any:
    module = _TRITON_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "COPY_BYTES",
    "FP8_FORMAT_CODES",
    "INTERPRETER_FACTS",
    "L2_MULTIPLE",
    "MATMUL_N",
    "MIN_COUNTERS",
    "SM70_PRELUDE",
    "V100_RATES",
    "BenchCall",
    "BenchCase",
    "Choice",
    "CudaBuilds",
    "CudaCompileError",
    "CudaKernel",
    "CudaToolkitUnavailable",
    "DeviceFacts",
    "DeviceRates",
    "KernelCost",
    "LaunchCost",
    "NvrtcBuild",
    "StageCost",
    "Timing",
    "Unit",
    "Workload",
    "accumulate_splits",
    "arrival_counters",
    "compile_cubin",
    "compile_ptx",
    "cuda_cache_dir",
    "decode_fp8",
    "dequantize_tile",
    "device_facts",
    "encode_fp8",
    "interpreting",
    "kernel_paths",
    "l2_bytes",
    "load_cuda_kernel",
    "measure_copy_bandwidth",
    "measure_fp16_matmul",
    "measure_matmul",
    "measure_read_bandwidth",
    "nvrtc_build",
    "nvrtc_version",
    "quantize_tile",
    "rotation_count",
    "settle_cache_keys",
    "stage_of",
    "stage_ranges",
    "store_out",
    "take_sums",
    "time_cuda",
    "time_cuda_graph",
    "token_stage",
    "with_prelude",
    "zeroed_accumulators",
]
