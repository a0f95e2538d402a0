"""The plugin's CUDA C++ kernels, compiled at first use by NVRTC
(:class:`volta_core.kernel_api.CudaBuilds`) behind the host's SM70 prelude
(:func:`volta_core.kernel_api.with_prelude`) and ``fp8_decode.cuh`` (the in-register e4m3
decode): the W8A16 GEMMs on Volta's tensor cores (``fp8_mma.cu`` for the dense layers,
``fp8_moe_mma.cu`` for the routed experts, both behind ``fp8_common.cuh``; the prelude's
``mma_m8n8k4``, inline PTX ``mma.sync.aligned.m8n8k4``), and the one-token GEMV
(``fp8_gemv.cu``, :mod:`.gemv`).

Triton's ``tl.dot`` runs on the FMA units on SM70 (triton-lang/triton#5066), 15.7 TFLOP/s where
the V100's tensor cores give 125. The e4m3fn weights are decoded in registers (two integer
operations a weight, exact: :mod:`volta_fp8w.kernels.e4m3`) straight into the products' B
fragments, one scale multiply per output and scale block. The sources ship as package data,
never a binary; their builds differ in NVRTC options (:func:`.launch_args.mma_options`,
:func:`.launch_args.moe_mma_options`), the same for the launchers (:mod:`.mma`,
:mod:`.moe_mma`) and the SM70 compile gate (:func:`.launch_args.mma_config`,
:func:`.launch_args.moe_mma_config`). Importing this package reads the sources and imports
neither torch nor cuda-bindings.
"""

from __future__ import annotations

from importlib.resources import files


def _source(kernel_file: str, *headers: str) -> str:
    """The decode, ``headers`` (the GEMMs' shared helpers), then ``kernel_file``, whose NVRTC
    error lines count its own lines (``#line``); without the prelude (every compile takes
    ``with_prelude(source)``)."""
    here = files(__name__)
    names = ("fp8_decode.cuh", *headers)
    parts = [here.joinpath(name).read_text(encoding="utf-8") for name in names]
    kernel = here.joinpath(kernel_file).read_text(encoding="utf-8")
    return "".join(parts) + f'#line 1 "{kernel_file}"\n{kernel}'


#: The dense GEMM's symbol (``extern "C"``) and its CUDA C++ source.
KERNEL = "fp8w_mma"
SOURCE = _source("fp8_mma.cu", "fp8_common.cuh")

#: The routed experts' GEMM's symbol and source.
MOE_KERNEL = "fp8w_moe_mma"
MOE_SOURCE = _source("fp8_moe_mma.cu", "fp8_common.cuh")

#: The one-token GEMV's symbol and source.
GEMV_KERNEL = "fp8w_gemv"
GEMV_SOURCE = _source("fp8_gemv.cu")
