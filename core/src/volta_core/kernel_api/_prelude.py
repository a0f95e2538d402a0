"""The SM70 CUDA prelude: the device helpers every plugin's Volta CUDA C++ kernel shares.

``sm70_prelude.cuh`` (package data beside this module) defines, once, the ``u8``/``u16``/``u32``
typedefs, ``mma_m8n8k4`` (``mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32``), ``pack_half2``,
``h2f`` (``cvt.f32.f16``) and ``ex2`` (``ex2.approx.ftz.f32``), and the split-K serial reduction
of the tensor-core GEMMs (CUTLASS's serial split-K, ``kSplitKSerial`` in
``cutlass/gemm/kernel/gemm.h``, as an arrival count): ``splitk_arrive`` (fence, barrier, one
increment of the tile's counter; true in the last block to arrive) and ``splitk_mma_epilogue``
(the ``mma_m8n8k4`` accumulators added atomically into the zeroed accumulators, the last
arriver's read-back with zeros written back, the bias, the counter's reset; the kernel gives
the output's store). A plugin's kernel source uses them without defining them,
and whatever compiles it (the launcher through :class:`~volta_core.kernel_api.CudaBuilds`, the
SM70 compile gate) compiles :func:`with_prelude` of it, so every compile sees the same text.
Reading it imports neither torch nor triton.
"""

from __future__ import annotations

from importlib.resources import files

#: The prelude's CUDA C++ text (``volta_core/kernel_api/sm70_prelude.cuh``).
SM70_PRELUDE: str = (
    files("volta_core.kernel_api").joinpath("sm70_prelude.cuh").read_text(encoding="utf-8")
)


def with_prelude(source: str) -> str:
    """``source`` behind the prelude: :data:`SM70_PRELUDE` (which ends with a newline), then
    ``#line 1``, so NVRTC's error lines (``k.cu(3): error: ...``) count ``source``'s own lines,
    then ``source``."""
    return f"{SM70_PRELUDE}#line 1\n{source}"
