"""The W8A16 GEMM on Volta's tensor cores: CUDA C++ (``fp8_mma.cu``, the prelude's
``mma_m8n8k4``, inline PTX ``mma.sync.aligned.m8n8k4``) compiled at first use by NVRTC
(:class:`volta_core.kernel_api.CudaBuilds`), behind the host's SM70 prelude
(:func:`volta_core.kernel_api.with_prelude`).

Triton's ``tl.dot`` runs on the FMA units on SM70 (triton-lang/triton#5066), 15.7 TFLOP/s where
the V100's tensor cores give 125. The e4m3fn weights are decoded in registers (two integer
operations a weight, exact: :mod:`volta_fp8w.kernels.e4m3`) straight into the products' B
fragments, one scale multiply per output and scale block. The source ships as package data,
never a binary; its builds differ in NVRTC options (:func:`.launch_args.mma_options`), the same
for the launcher (:mod:`.mma`) and the SM70 compile gate (:func:`.launch_args.mma_config`).
Importing this package reads the source and imports neither torch nor cuda-bindings.
"""

from __future__ import annotations

from importlib.resources import files

#: The kernel's symbol (``extern "C"``) and its CUDA C++ source, without the prelude (every
#: compile takes ``with_prelude(SOURCE)``).
KERNEL = "fp8w_mma"
SOURCE = files(__name__).joinpath("fp8_mma.cu").read_text(encoding="utf-8")
