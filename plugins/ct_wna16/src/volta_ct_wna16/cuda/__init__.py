"""The GEMM on Volta's tensor cores: CUDA C++ (``wna16_mma.cu``, inline PTX ``mma.m8n8k4``)
compiled at first use by NVRTC (:func:`volta_core.kernel_api.load_cuda_kernel`).

Triton's ``tl.dot`` runs on the FMA units on SM70 (triton-lang/triton#5066), 15.7 TFLOP/s where
the V100's tensor cores give 125. The source ships as package data, never a binary: its builds
differ in NVRTC options (:func:`volta_ct_wna16.launch.mma_options`), the same for the launcher
(:mod:`.mma`) and the SM70 compile gate (:func:`volta_ct_wna16.gate_configs.cuda_builds`).
Importing this package reads the source and imports neither torch nor cuda-bindings.
"""

from __future__ import annotations

from importlib.resources import files

from volta_core.kernel_api import with_prelude

#: The kernel's symbol (``extern "C"``) and its CUDA C++ source, behind the core's SM70 prelude
#: (:func:`volta_core.kernel_api.with_prelude`): the text the launcher and the gate compile.
KERNEL = "wna16_mma"
SOURCE = with_prelude(files(__name__).joinpath("wna16_mma.cu").read_text())
