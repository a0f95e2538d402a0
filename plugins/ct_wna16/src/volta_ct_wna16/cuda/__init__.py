"""The GEMMs on Volta's tensor cores: CUDA C++ (``wna16_mma.cu`` for the dense layers,
``wna16_moe_mma.cu`` for the routed experts, both behind ``mma_common.cuh``; inline PTX
``mma.m8n8k4``) compiled at first use by NVRTC (:func:`volta_core.kernel_api.load_cuda_kernel`).

Triton's ``tl.dot`` runs on the FMA units on SM70 (triton-lang/triton#5066), 15.7 TFLOP/s where
the V100's tensor cores give 125. The sources ship as package data, never a binary: their builds
differ in NVRTC options (:func:`volta_ct_wna16.launch.mma_options`), the same for the launchers
(:mod:`.mma`, :mod:`.moe_mma`) and the SM70 compile gate
(:func:`volta_ct_wna16.gate_configs.cuda_builds`). Importing this package reads the sources and
imports neither torch nor cuda-bindings.
"""

from __future__ import annotations

from importlib.resources import files

from volta_core.kernel_api import with_prelude


def _source(kernel_file: str) -> str:
    """The core's SM70 prelude, the GEMMs' shared helpers, then ``kernel_file``, whose NVRTC
    error lines count its own lines (``#line``)."""
    here = files(__name__)
    common = here.joinpath("mma_common.cuh").read_text()
    kernel = here.joinpath(kernel_file).read_text()
    return with_prelude(f'{common}#line 1 "{kernel_file}"\n{kernel}')


#: The dense GEMM's symbol (``extern "C"``) and its CUDA C++ source: the text the launcher and
#: the gate compile.
KERNEL = "wna16_mma"
SOURCE = _source("wna16_mma.cu")

#: The routed experts' GEMM's symbol and source.
MOE_KERNEL = "wna16_moe_mma"
MOE_SOURCE = _source("wna16_moe_mma.cu")
