"""Attention on Volta's tensor cores: CUDA C++ with inline PTX ``mma.m8n8k4`` (``prefill.cu``,
``decode.cu``), shipped as package data and compiled at first use by NVRTC
(:class:`volta_core.kernel_api.CudaBuilds`); :mod:`.prefill` and :mod:`.decode` load and launch
them.

Triton's ``tl.dot`` runs on the FMA units on SM70 (triton-lang/triton#5066), 15.7 TFLOP/s where
the V100's tensor cores give 125 (NVIDIA Tesla V100 GPU Architecture whitepaper). Each source's
builds differ in NVRTC options made from the launch tables by :mod:`volta_attn_v100.launch`, the
same for the launchers and the SM70 compile gate
(:func:`volta_attn_v100.dispatch.cuda_kernel_configs`); which calls take them is
:func:`volta_attn_v100.dispatch.choose`'s answer. Importing this package imports nothing.
"""
