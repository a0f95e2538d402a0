"""Finding the CUDA 12 NVRTC that compiles the plugins' CUDA-source kernels.

NVRTC comes from ``nvidia-cuda-nvrtc-cu12`` and is driven through ``cuda-bindings`` 12.x (the
core's ``cuda`` extra); CUDA 13's NVRTC cannot target sm_70 (CUDA 13.0 release notes). This
module only finds and versions it, importing neither torch nor triton, so ``vllm-volta plan``
and ``doctor`` can say whether the tensor-core kernels would build here; compiling and
launching live in :mod:`volta_core.kernel_api`.
"""

from __future__ import annotations

from typing import Any

#: What installs a CUDA 12 NVRTC and its Python bindings.
INSTALL_HINT = 'pip install "vllm-volta-core[cuda]"'


class CudaToolkitUnavailable(RuntimeError):
    """No CUDA 12 NVRTC (or no cuda-bindings) here, or it cannot build the asked architecture;
    the message says what to install. A kernel plugin catches it to keep its Triton path."""


def nvrtc_module() -> Any:
    """``cuda.bindings.nvrtc``, with its library loaded; :class:`CudaToolkitUnavailable` if not."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise CudaToolkitUnavailable(
            f"cuda-bindings is not installed ({exc}); CUDA-source kernels need it and a CUDA 12 "
            f"NVRTC: {INSTALL_HINT}"
        ) from exc
    try:
        nvrtc.nvrtcVersion()
    except RuntimeError as exc:  # cuda.pathfinder's DynamicLibNotFoundError and its kin
        raise CudaToolkitUnavailable(
            f"NVRTC could not be loaded ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
            f"install a CUDA 12 NVRTC: {INSTALL_HINT}"
        ) from exc
    return nvrtc


def checked_nvrtc_call(result: tuple[Any, ...], nvrtc: Any, what: str) -> tuple[Any, ...]:
    """The values after NVRTC's status, or :class:`RuntimeError` naming the call."""
    status, *values = result
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {status.name}")
    return tuple(values)


def nvrtc_version() -> tuple[int, int]:
    """The loaded NVRTC's ``(major, minor)``; :class:`CudaToolkitUnavailable` without one."""
    nvrtc = nvrtc_module()
    major, minor = checked_nvrtc_call(nvrtc.nvrtcVersion(), nvrtc, "nvrtcVersion")
    return int(major), int(minor)


#: The first NVRTC major release without sm_70 (CUDA 13.0 release notes: Volta dropped).
NO_VOLTA_MAJOR = 13


def nvrtc_found() -> tuple[str | None, str]:
    """The NVRTC release (``"12.9"``) that would build the kernels for a V100 here, or None and
    why not (what to install)."""
    try:
        major, minor = nvrtc_version()
    except (CudaToolkitUnavailable, RuntimeError) as exc:
        return None, str(exc)
    if major >= NO_VOLTA_MAJOR:
        return None, (
            f"NVRTC {major}.{minor} cannot target sm_70 (CUDA {NO_VOLTA_MAJOR} dropped Volta); "
            f"install a CUDA 12 NVRTC: {INSTALL_HINT}"
        )
    return f"{major}.{minor}", ""
