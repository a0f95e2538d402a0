"""A plugin's CUDA-source builds: each loaded once per device, never inside CUDA-graph capture.

A kernel plugin that ships CUDA C++ keeps a Triton path for where it cannot run. The rule for
when it can is the same for every such kernel, so it lives here once: a build (NVRTC options) is
compiled and loaded the first time a device asks for it (NVRTC's cubins are cached on disk by
:func:`volta_core.kernel_api.load_cuda_kernel`); a missing toolkit or a compile error leaves the
Triton path to serve, logged once per kernel, or raises under ``VLLM_VOLTA_STRICT=1``. Loading a
module is not a stream operation and cannot be captured, so a build first asked for during
CUDA-graph capture is left to the Triton path too: plugins load their layers' builds when the
layers are set up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from volta_core.cuda_toolkit import CudaToolkitUnavailable
from volta_core.host.records import strict_mode
from volta_core.kernel_api._nvrtc import CudaCompileError, CudaKernel, load_cuda_kernel

if TYPE_CHECKING:
    import torch

_logger = logging.getLogger("volta_core.kernel_api")

#: What loads a build: :func:`volta_core.kernel_api.load_cuda_kernel`'s signature.
Loader = Callable[..., CudaKernel]

_Key = tuple[int, tuple[str, ...], "str | None"]


def _index(device: torch.device) -> int:
    import torch

    return int(device.index if device.index is not None else torch.cuda.current_device())


class CudaBuilds:
    """The builds of one CUDA-source kernel (``source``, its ``extern "C"`` function ``kernel``).

    :param what: the plugin and the kernel, as the fallback warning and errors name them
        (``"attn_v100: the tensor-core decode"``).
    :param loader: what compiles and loads a build (:func:`load_cuda_kernel`; tests pass one
        that fails as a machine without NVRTC would).
    """

    def __init__(self, what: str, source: str, kernel: str, loader: Loader = load_cuda_kernel):
        self.what = what
        self.source = source
        self.kernel = kernel
        self.loader = loader
        self._loaded: dict[_Key, CudaKernel | None] = {}
        self._logged = False

    def ready(self, device: torch.device, options: Sequence[str]) -> bool:
        """Whether the build of ``options`` runs on CUDA ``device`` (its own cubin); loaded now
        if it was not asked for before, outside CUDA-graph capture.

        :raises CudaToolkitUnavailable: no CUDA 12 NVRTC, with ``VLLM_VOLTA_STRICT=1``.
        :raises CudaCompileError: NVRTC refused the build, with ``VLLM_VOLTA_STRICT=1``.
        :raises RuntimeError: first asked for during capture, with ``VLLM_VOLTA_STRICT=1``.
        """
        import torch

        key: _Key = (_index(device), tuple(options), None)
        if key in self._loaded:
            return self._loaded[key] is not None
        if torch.cuda.is_current_stream_capturing():
            why = f"its build {' '.join(options)} was first asked for during CUDA-graph capture"
            if strict_mode():
                raise RuntimeError(f"{self.what} cannot run: {why}")
            self._fall_back(why)
            return False
        try:
            self._loaded[key] = self.loader(
                self.source, self.kernel, options=tuple(options), device=device
            )
        except (CudaToolkitUnavailable, CudaCompileError) as exc:
            if strict_mode():
                raise
            self._loaded[key] = None
            self._fall_back(str(exc))
        return self._loaded[key] is not None

    def loaded(
        self, device: torch.device, options: Sequence[str], ptx_arch: str | None = None
    ) -> CudaKernel | None:
        """The build :meth:`ready` (or :meth:`load`, for ``ptx_arch``) loaded, else None."""
        return self._loaded.get((_index(device), tuple(options), ptx_arch))

    def load(
        self, device: torch.device, options: Sequence[str], ptx_arch: str | None = None
    ) -> CudaKernel:
        """Load the build now, for a caller that asked for this kernel by name (tests,
        benchmarks): a failure raises. ``ptx_arch`` (``"compute_70"``) loads the PTX a V100
        build starts from, JIT-compiled by the driver, instead of the device's cubin."""
        kernel = self.loader(
            self.source, self.kernel, options=tuple(options), device=device, ptx_arch=ptx_arch
        )
        self._loaded[(_index(device), tuple(options), ptx_arch)] = kernel
        return kernel

    def _fall_back(self, why: str) -> None:
        if not self._logged:
            self._logged = True
            _logger.warning("%s cannot run (%s); Triton serves", self.what, why)
