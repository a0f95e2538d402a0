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
  by :func:`with_prelude`.

The codec and the split-K functions import triton, so each module is loaded on first use of one
of its names (PEP 562): importing this package imports neither torch nor triton. Developer
tooling (the SM70 compile gate, the benchmark harness, test helpers) lives in the separate
``vllm-volta-devkit`` distribution.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from volta_core.cuda_toolkit import CudaToolkitUnavailable, nvrtc_version
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

if TYPE_CHECKING:
    from volta_core.kernel_api._fp8 import (
        decode_fp8,
        dequantize_tile,
        encode_fp8,
        quantize_tile,
    )
    from volta_core.kernel_api._splitk import accumulate_splits, store_out, take_sums

#: Names whose module imports triton, loaded when first asked for.
_TRITON_NAMES = {
    **dict.fromkeys(("decode_fp8", "dequantize_tile", "encode_fp8", "quantize_tile"), "_fp8"),
    **dict.fromkeys(("accumulate_splits", "store_out", "take_sums"), "_splitk"),
}


def __getattr__(name: str) -> Any:
    module = _TRITON_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "FP8_FORMAT_CODES",
    "INTERPRETER_FACTS",
    "MIN_COUNTERS",
    "SM70_PRELUDE",
    "V100_RATES",
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
    "load_cuda_kernel",
    "nvrtc_build",
    "nvrtc_version",
    "quantize_tile",
    "stage_of",
    "stage_ranges",
    "store_out",
    "take_sums",
    "token_stage",
    "with_prelude",
    "zeroed_accumulators",
]
