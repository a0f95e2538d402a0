"""CUDA C++ kernels compiled at first use by NVRTC, cached on disk, launched on torch's stream.

A kernel plugin ships CUDA C++ source (inline PTX such as ``mma.sync.aligned.m8n8k4`` included)
and no binary: :func:`load_cuda_kernel` compiles it with NVRTC for the device's architecture
(``sm_70`` on a V100), keeps the cubin under :func:`cuda_cache_dir` keyed by source, options,
architecture and NVRTC version (as Triton keys its cache), loads it into torch's context and
returns a :class:`CudaKernel` that launches on torch's current stream, so a launch inside
``torch.cuda.graph`` capture is captured. The cache trusts nobody else: it is created mode 0700,
refused (:class:`CudaCacheUntrusted`, Triton serves) when it or an entry is not the user's own
or others may write it, and each entry is checked against the SHA-256 stored beside it (a
damaged one is rebuilt).

NVRTC comes from ``nvidia-cuda-nvrtc-cu12`` and is driven through ``cuda-bindings`` 12.x (the
core's ``cuda`` extra): CUDA 13's NVRTC cannot target sm_70 (CUDA 13.0 release notes). Without
them, or with an NVRTC that cannot build the asked architecture, every entry point raises
:class:`CudaToolkitUnavailable`, which a plugin catches to keep its Triton path. A compile
failure is a :class:`CudaCompileError` naming the kernel, the architecture and NVRTC's first
error. :func:`compile_cubin`, :func:`compile_ptx` and :func:`nvrtc_build` need no GPU (the SM70
compile gate runs them in CI).

Kernels are looked up by their symbol, so declare them ``extern "C" __global__``. cuda-bindings
and torch are imported inside the functions: importing ``volta_core.kernel_api`` loads neither.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from volta_core.cuda_toolkit import (
    INSTALL_HINT,
    CudaToolkitUnavailable,
    checked_nvrtc_call,
    nvrtc_module,
    nvrtc_version,
)
from volta_core.kernel_api._device_facts import device_facts

if TYPE_CHECKING:
    import torch

#: The environment variable that moves the cubin cache.
CACHE_ENV = "VLLM_VOLTA_CUDA_CACHE"

#: Where cubins are kept unless :data:`CACHE_ENV` says otherwise.
DEFAULT_CACHE_DIR = "~/.cache/vllm-volta/cuda"

#: Part of every cache key: raise it when what a key stores changes meaning.
_CACHE_FORMAT = 1

#: The suffix of the file beside each cache entry that holds its SHA-256 (hex).
DIGEST_SUFFIX = ".sha256"

# Dynamic shared memory above 48 KB per block needs the kernel's opt-in attribute (CUDA C++
# Programming Guide, "Compute Capability 7.x", shared memory).
_DEFAULT_DYNAMIC_SHARED = 48 * 1024

_CUBIN_TARGET = re.compile(r"sm_(\d+)[af]?")
_PTX_TARGET = re.compile(r"compute_(\d+)[af]?")
_ARCH_OPTION = re.compile(r"^(?:--gpu-architecture|-arch)\b")
# NVRTC's, the front end's and ptxas's error lines: "k.cu(2): error: ...", "ptxas error   : ...".
_ERROR_LINE = re.compile(r"\berror\s*:", re.IGNORECASE)

_logger = logging.getLogger(__name__)


class CudaCompileError(RuntimeError):
    """NVRTC refused the source. The message names the kernel, the architecture and the log's
    first error; :attr:`log` holds the whole log."""

    def __init__(self, name: str, target: str, log: str) -> None:
        self.name = name
        self.target = target
        self.log = log
        super().__init__(f"NVRTC could not compile {name} for {target}: {_first_error(log)}")


@dataclass(frozen=True)
class NvrtcBuild:
    """One NVRTC compile: ``image`` is the cubin, or the PTX text's bytes; ``log`` NVRTC's log
    (warnings, and ptxas's resource report when asked with ``--ptxas-options=-v``)."""

    image: bytes
    log: str


def _first_error(log: str) -> str:
    """The first error line of an NVRTC log (its first line if none says ``error``)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.search(line)]
    if errors:
        return errors[0]
    return lines[0] if lines else "(empty log)"


# -- NVRTC --------------------------------------------------------------------------------


def _arch_number(target: str) -> int:
    """``70`` for ``sm_70`` or ``compute_70``; :class:`ValueError` for anything else."""
    match = _CUBIN_TARGET.fullmatch(target) or _PTX_TARGET.fullmatch(target)
    if match is None:
        raise ValueError(f"target {target!r} is not an architecture (sm_XY or compute_XY)")
    return int(match.group(1))


def _unsupported_target(version: tuple[int, int], supported: Sequence[int], target: str) -> str:
    """Why an NVRTC building only ``supported`` cannot build ``target``."""
    listed = ", ".join(f"sm_{a}" for a in sorted(supported))
    why = " (CUDA 13 dropped Volta, sm_70)" if version[0] >= 13 else ""
    return (
        f"NVRTC {version[0]}.{version[1]} cannot build {target}{why}; it builds {listed}. "
        f"CUDA-source kernels need a CUDA 12 NVRTC: {INSTALL_HINT}"
    )


def nvrtc_build(source: str, name: str, target: str, options: Sequence[str] = ()) -> NvrtcBuild:
    """Compile ``source`` once, uncached: a cubin for ``sm_XY``, PTX for ``compute_XY``.

    :param name: the kernel (or program) name, used for the program's file name and errors.
    :param options: NVRTC options other than the architecture (``-DTILE=64``,
        ``--use_fast_math``, ``--ptxas-options=-v``...).
    :raises CudaToolkitUnavailable: no usable NVRTC, or it cannot build ``target``.
    :raises CudaCompileError: NVRTC refused the source.
    """
    arch = _arch_number(target)
    ptx = target.startswith("compute_")
    options = list(options)
    if any(_ARCH_OPTION.match(o) for o in options):
        raise ValueError("pass the architecture as target, not as an option")
    nvrtc = nvrtc_module()
    (supported,) = checked_nvrtc_call(
        nvrtc.nvrtcGetSupportedArchs(), nvrtc, "nvrtcGetSupportedArchs"
    )
    if arch not in supported:
        raise CudaToolkitUnavailable(_unsupported_target(nvrtc_version(), supported, target))
    (program,) = checked_nvrtc_call(
        nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []),
        nvrtc,
        "nvrtcCreateProgram",
    )
    try:
        flags = [f"--gpu-architecture={target}".encode(), *(o.encode() for o in options)]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
        (size,) = checked_nvrtc_call(
            nvrtc.nvrtcGetProgramLogSize(program), nvrtc, "nvrtcGetProgramLogSize"
        )
        log = b" " * size
        checked_nvrtc_call(nvrtc.nvrtcGetProgramLog(program, log), nvrtc, "nvrtcGetProgramLog")
        text = log.rstrip(b"\0").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CudaCompileError(name, target, text or status.name)
        get_size, get = (
            (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
            if ptx
            else (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
        )
        (size,) = checked_nvrtc_call(get_size(program), nvrtc, "reading the compiled size")
        image = b" " * size
        checked_nvrtc_call(get(program, image), nvrtc, "reading the compiled image")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return NvrtcBuild(image.rstrip(b"\0") if ptx else image, text)


# -- the cache ----------------------------------------------------------------------------


def cuda_cache_dir() -> Path:
    """Where compiled images are kept: ``$VLLM_VOLTA_CUDA_CACHE``, else
    ``~/.cache/vllm-volta/cuda``. Used only while it and every entry are this user's own and
    writable by nobody else (:class:`CudaCacheUntrusted`)."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


def cache_key(source: str, options: Sequence[str], target: str, version: tuple[int, int]) -> str:
    """The hex digest a compiled image is stored under: everything that changes the image."""
    payload = json.dumps(
        {
            "format": _CACHE_FORMAT,
            "source": source,
            "options": list(options),
            "target": target,
            "nvrtc": list(version),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


class CudaCacheUntrusted(CudaToolkitUnavailable):
    """The cubin cache could have been written by someone else (its directory or an entry is
    not the user's own, or others may write it): its kernels are not loaded, and Triton serves."""


#: Permission bits that let others write: group and world write.
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _untrusted(info: os.stat_result, what: str) -> str | None:
    """Why a cache directory or entry with status ``info`` is not trusted, or None."""
    if info.st_uid != os.geteuid():
        return f"{what} is owned by uid {info.st_uid}, not by this user ({os.geteuid()})"
    if info.st_mode & _OTHERS_WRITE:
        return f"{what} is writable by its group or by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _refuse(directory: Path, why: str) -> CudaCacheUntrusted:
    return CudaCacheUntrusted(
        f"the CUDA kernel cache {directory} is not used: {why}; a cubin another user could plant "
        f"there would run on the GPU. Point {CACHE_ENV} at a folder only you can write "
        "(it is created mode 0700), or chmod go-w it and remove what others own"
    )


def _cache_directory() -> Path | None:
    """The cache directory, created mode 0700; None when it cannot be created (then nothing is
    cached: a recompile, never a failure).

    :raises CudaCacheUntrusted: it exists but is not this user's own or others may write it.
    """
    directory = cuda_cache_dir()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(directory)
    except OSError as exc:
        _logger.warning("cannot create the CUDA kernel cache %s: %s", directory, exc)
        return None
    if not stat.S_ISDIR(info.st_mode):
        raise _refuse(directory, "it is not a directory")
    why = _untrusted(info, "the directory")
    if why is not None:
        raise _refuse(directory, why)
    return directory


def _read_trusted(path: Path, directory: Path) -> bytes | None:
    """The bytes of cache file ``path``, None when there is none. Opened without following a
    link and checked on the open descriptor, so what is checked is what is read.

    :raises CudaCacheUntrusted: a link, not a regular file, not this user's, or others may
        write it.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(directory, f"{path.name} is a symbolic link") from None
        _logger.warning("cannot read the CUDA kernel cache entry %s: %s", path, exc)
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(directory, f"{path.name} is not a regular file")
        why = _untrusted(info, path.name)
        if why is not None:
            raise _refuse(directory, why)
        os.set_blocking(fd, True)
        return handle.read()


def _cached_build(source: str, name: str, target: str, options: Sequence[str]) -> bytes:
    """The image from the cache when its entry is verified, else built by NVRTC and stored.

    Each entry ``<key>.cubin`` (or ``.ptx``) has its SHA-256 beside it (``<key>.cubin.sha256``);
    an entry whose digest is missing or differs (damaged, cut short) is rebuilt and replaced.
    """
    ptx = target.startswith("compute_")
    key = cache_key(source, options, target, nvrtc_version())
    directory = _cache_directory()
    if directory is None:
        return nvrtc_build(source, name, target, options).image
    path = directory / f"{key}.{'ptx' if ptx else 'cubin'}"
    digest_path = path.with_name(path.name + DIGEST_SUFFIX)
    stored = _read_trusted(path, directory)
    digest = _read_trusted(digest_path, directory)
    if stored is not None and digest is not None:
        if hashlib.sha256(stored).hexdigest().encode() == digest.strip():
            return stored
        _logger.warning("the CUDA kernel cache entry %s is damaged; rebuilding it", path)
    image = nvrtc_build(source, name, target, options).image
    _store(path, image)
    _store(digest_path, hashlib.sha256(image).hexdigest().encode())
    return image


def _store(path: Path, data: bytes) -> None:
    """Write ``data`` whole or not at all: a new file of mode 0600 under a random name
    (``O_EXCL``, never through a link), renamed over ``path``. A cache that cannot be written
    costs a recompile next time, never a failed launch."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    except OSError as exc:
        _logger.warning("cannot write the CUDA kernel cache %s: %s", path, exc)
        return
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        _logger.warning("cannot write the CUDA kernel cache %s: %s", path, exc)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def compile_cubin(source: str, name: str, arch: str, options: Sequence[str] = ()) -> bytes:
    """The cubin of ``source`` for ``arch`` (``sm_70``), from the cache or NVRTC; no GPU needed."""
    if not _CUBIN_TARGET.fullmatch(arch):
        raise ValueError(f"a cubin is built for an sm_XY architecture, not {arch!r}")
    return _cached_build(source, name, arch, tuple(options))


def compile_ptx(
    source: str, name: str, arch: str = "compute_70", options: Sequence[str] = ()
) -> str:
    """The PTX of ``source`` for ``arch`` (``compute_70``), from the cache or NVRTC; no GPU
    needed. A driver JIT-compiles it for its own GPU when it is loaded."""
    if not _PTX_TARGET.fullmatch(arch):
        raise ValueError(f"PTX is built for a compute_XY architecture, not {arch!r}")
    return _cached_build(source, name, arch, tuple(options)).decode()


# -- loading and launching ----------------------------------------------------------------


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise CudaToolkitUnavailable(
            f"cuda-bindings is not installed ({exc}); CUDA-source kernels need it: {INSTALL_HINT}"
        ) from exc
    return driver


def _driver_checked(result: Any, driver: Any, what: str) -> tuple[Any, ...]:
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(status)
        raise RuntimeError(f"{what} failed: {name.decode() if name else status}")
    return tuple(values)


def _make_context_current(driver: Any, index: int) -> None:
    """Make device ``index``'s primary context (the one torch uses) current on this thread,
    where no context is: a thread torch has not run CUDA work on yet has none."""
    _driver_checked(driver.cuInit(0), driver, "cuInit")  # idempotent; torch may not have yet
    (context,) = _driver_checked(driver.cuCtxGetCurrent(), driver, "cuCtxGetCurrent")
    if int(context) != 0:
        return
    (device,) = _driver_checked(driver.cuDeviceGet(index), driver, "cuDeviceGet")
    (primary,) = _driver_checked(
        driver.cuDevicePrimaryCtxRetain(device), driver, "cuDevicePrimaryCtxRetain"
    )
    _driver_checked(driver.cuCtxSetCurrent(primary), driver, "cuCtxSetCurrent")


Dims = int | tuple[int, ...]


def _dims(value: Dims, what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, int) or d < 0 for d in dims):
        raise ValueError(f"{what} must be 1 to 3 non-negative ints, got {value!r}")
    return (*dims, *(1,) * (3 - len(dims)))  # type: ignore[return-value]


_INT32 = (-(2**31), 2**31 - 1)


def _kernel_params(
    args: Sequence[Any], device_index: int
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Values and C types of kernel arguments, as cuda-bindings' ``cuLaunchKernel`` takes them.

    A tensor passes its data pointer (it must be on device ``device_index``), ``None`` a null
    pointer, a bool a C ``bool``, an int a 32-bit ``int``, a float a 32-bit ``float`` (Triton's
    defaults); a ctypes scalar (``ctypes.c_int64(n)``, ``ctypes.c_double(x)``) passes as its
    own type, for the other widths.
    """
    import torch

    values: list[Any] = []
    types: list[Any] = []
    # Exact types first: a launch packs a handful of these per call, on the host's hot path.
    for i, arg in enumerate(args):
        kind = type(arg)
        if kind is int and _INT32[0] <= arg <= _INT32[1]:
            values.append(arg)
            types.append(ctypes.c_int32)
        elif kind is float:
            values.append(arg)
            types.append(ctypes.c_float)
        elif isinstance(arg, torch.Tensor):
            if arg.get_device() != device_index:  # -1 for a CPU tensor
                raise ValueError(
                    f"kernel argument {i} is a tensor on {arg.device}, not on cuda:{device_index}"
                )
            values.append(arg.data_ptr())
            types.append(ctypes.c_void_p)
        elif arg is None:
            values.append(0)
            types.append(ctypes.c_void_p)
        elif kind is bool:
            values.append(arg)
            types.append(ctypes.c_bool)
        elif isinstance(arg, int):
            raise OverflowError(
                f"kernel argument {i} ({arg}) is not a 32-bit int; pass ctypes.c_int64(value) "
                "for a 64-bit parameter"
            )
        elif isinstance(arg, ctypes._SimpleCData):
            values.append(arg.value)
            types.append(kind)
        else:
            raise TypeError(
                f"kernel argument {i} is a {kind.__name__}; pass a CUDA tensor, None, a bool, "
                "an int, a float or a ctypes scalar"
            )
    return tuple(values), tuple(types)


class CudaKernel:
    """One kernel of a module loaded on one CUDA device; :meth:`launch` runs it on torch's
    current stream of that device."""

    def __init__(self, name: str, target: str, image: bytes, device_index: int) -> None:
        import torch

        self.name = name
        self.target = target
        self.device_index = device_index
        self._driver = driver = _driver()
        with torch.cuda.device(device_index):
            _make_context_current(driver, device_index)
            # NUL-terminated, as the driver reads PTX text; a cubin ignores the extra byte.
            data = ctypes.create_string_buffer(image)
            (self._module,) = _driver_checked(
                driver.cuModuleLoadData(ctypes.addressof(data)),
                driver,
                f"loading {name} ({target})",
            )
            (self._function,) = _driver_checked(
                driver.cuModuleGetFunction(self._module, name.encode()),
                driver,
                f'finding kernel {name} (declare it extern "C" __global__)',
            )
        self._dynamic_shared_limit = _DEFAULT_DYNAMIC_SHARED

    def launch(self, grid: Dims, block: Dims, *args: Any, shared_mem: int = 0) -> None:
        """Launch on torch's current stream of the kernel's device (captured inside a CUDA
        graph). A grid with a zero dimension launches nothing.

        :param grid: blocks, 1 to 3 dimensions.
        :param block: threads per block, 1 to 3 dimensions, at most 1024 in all.
        :param args: the kernel's arguments (see :func:`_kernel_params`).
        :param shared_mem: bytes of dynamic shared memory per block.
        """
        import torch

        gx, gy, gz = _dims(grid, "grid")
        bx, by, bz = _dims(block, "block")
        if not 1 <= bx * by * bz <= 1024:
            raise ValueError(f"a block has 1 to 1024 threads, got {bx * by * bz}")
        if shared_mem < 0:
            raise ValueError(f"shared_mem must be non-negative, got {shared_mem}")
        params = _kernel_params(args, self.device_index)
        if gx * gy * gz == 0:
            return
        if torch.cuda.current_device() == self.device_index:
            self._launch((gx, gy, gz), (bx, by, bz), shared_mem, params)
        else:
            with torch.cuda.device(self.device_index):
                self._launch((gx, gy, gz), (bx, by, bz), shared_mem, params)

    def _launch(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        params: tuple[tuple[Any, ...], tuple[Any, ...]],
    ) -> None:

        driver = self._driver
        ready = _threads.__dict__.setdefault("contexts", set())
        if self.device_index not in ready:
            _make_context_current(driver, self.device_index)
            ready.add(self.device_index)
        if shared_mem > self._dynamic_shared_limit:
            _driver_checked(
                driver.cuFuncSetAttribute(
                    self._function,
                    driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared_mem,
                ),
                driver,
                f"allowing {shared_mem} B of dynamic shared memory for {self.name}",
            )
            self._dynamic_shared_limit = shared_mem
        stream = _current_stream(self.device_index)
        (status,) = driver.cuLaunchKernel(
            self._function, *grid, *block, shared_mem, stream, params, 0
        )
        if status != driver.CUresult.CUDA_SUCCESS:
            _driver_checked((status,), driver, f"launching {self.name}")


def _current_stream(device_index: int) -> int:
    """The handle of torch's current stream on the device: through the raw accessor Triton's
    launcher uses where torch has it (no Stream object per launch), else the public API."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device_index))
    return int(torch.cuda.current_stream(device_index).cuda_stream)


# The devices whose context this thread has made current (once per thread and device).
_threads = threading.local()


_loaded: dict[tuple[str, str, tuple[str, ...], str, int], CudaKernel] = {}
_lock = threading.Lock()


def load_cuda_kernel(
    source: str,
    name: str,
    *,
    options: Sequence[str] = (),
    device: torch.device | None = None,
    ptx_arch: str | None = None,
) -> CudaKernel:
    """Compile (or take from the cache) and load kernel ``name`` of ``source`` on ``device``.

    Built as a cubin for the device's own architecture; with ``ptx_arch`` (``"compute_70"``) as
    PTX for that architecture instead, which the driver JIT-compiles at load: the path a V100
    build starts from, run on a newer GPU. Loaded kernels are kept per process: call this
    outside CUDA-graph capture first (a warm-up), since loading a module is not a stream
    operation.

    :raises CudaToolkitUnavailable: no CUDA 12 NVRTC or cuda-bindings.
    :raises CudaCompileError: NVRTC refused the source.
    :raises ValueError: ``device`` is not a CUDA device.
    """
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    if device.type != "cuda":
        raise ValueError(f"CUDA-source kernels run on CUDA devices, not on {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if ptx_arch is None:
        major, minor = device_facts(torch.device("cuda", index)).capability
        target = f"sm_{major}{minor}"
    elif _PTX_TARGET.fullmatch(ptx_arch):
        target = ptx_arch
    else:
        raise ValueError(f"ptx_arch must be a compute_XY architecture, got {ptx_arch!r}")
    key = (source, name, tuple(options), target, index)
    with _lock:
        kernel = _loaded.get(key)
        if kernel is None:
            if target.startswith("compute_"):
                image = compile_ptx(source, name, target, options).encode()
            else:
                image = compile_cubin(source, name, target, options)
            kernel = CudaKernel(name, target, image, index)
            _loaded[key] = kernel
    return kernel
