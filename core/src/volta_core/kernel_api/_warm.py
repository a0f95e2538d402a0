"""Compile a plugin's declared kernel builds for a target GPU into the caches the engine reads,
on a machine that need not have that GPU (``vllm-volta warmup``).

Triton: a :class:`~volta_core.KernelConfig` is compiled through its kernel's own JIT
(``JITFunction.warmup``) with stand-ins for the launch's arguments (``MockTensor`` pointers,
which Triton takes as 16-byte aligned, and integers of the declared specialization: a multiple
of 16 for ``divisible_by_16``, else a value neither 1 nor a multiple of 16; an argument a
launch passes as 1 is declared among the ``constexprs``, as the JIT makes it one), under a Triton
driver that only names the target (:func:`_target_driver`, ``GPUTarget("cuda", 70, 32)`` for a
V100). The JIT then builds the same cache key it builds for a launch with such arguments on that
GPU (kernel source and its callees, signature with the alignment and divisibility
specialization, constexprs, ``num_warps``/``num_stages``, target, Triton's version and its
``ptxas``) and ``triton.compile`` stores the result under Triton's cache directory
(``TRITON_CACHE_DIR``, else ``~/.triton/cache``), or finds it there: Triton's compilation
listener says which (``cache_hit``). The JIT is used, not an ``ASTSource`` built by hand as the
SM70 compile gate builds one: the JIT gives every runtime argument an attribute list (an empty
one for a plain integer) and the source's hash covers them, so a hand-built source with only
the divisible arguments listed is another key, which no launch finds.

CUDA sources: a :class:`~volta_core.CudaKernelConfig` is built by :func:`compile_cubin` for
``sm_XY``, which keeps the cubin in the cache the plugins' launchers read
(:func:`cuda_cache_dir`).

Triton and torch are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from volta_core.cuda_toolkit import nvrtc_version
from volta_core.host.types import CudaKernelConfig, KernelConfig
from volta_core.kernel_api._nvrtc import DIGEST_SUFFIX, cache_key, compile_cubin, cuda_cache_dir

#: The suffix of a build compiled without its ``divisible_by_16`` specialization.
ANY_SIZE = "[any-size]"

#: Integer stand-ins: a multiple of 16 (the JIT marks it ``tt.divisibility=16``) and a value
#: that is neither that nor 1 (the JIT turns an integer argument equal to 1 into a constexpr).
_DIVISIBLE, _PLAIN = 16, 17

#: Where each integer type's stand-ins start: the JIT types a Python int by its range.
_INTEGER_BASES = {"i32": 0, "i64": 2**32, "u64": 2**63}

#: Triton pointee types to the torch dtypes a ``MockTensor`` carries.
_POINTEE_DTYPES = {
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "fp64": "float64",
    "i1": "bool",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "fp8e5": "float8_e5m2",
    "fp8e4nv": "float8_e4m3fn",
}


def triton_variants(configs: Iterable[KernelConfig]) -> list[KernelConfig]:
    """Each configuration as declared and, where it names ``divisible_by_16`` arguments that
    the launcher does not enforce, also without that specialization (suffix
    :data:`ANY_SIZE`): the JIT builds the second for a launch whose sizes are not multiples
    of 16, so both run on a device."""
    variants: list[KernelConfig] = []
    for cfg in configs:
        variants.append(cfg)
        if cfg.divisible_by_16 and not cfg.divisibility_enforced:
            variants.append(replace(cfg, name=cfg.name + ANY_SIZE, divisible_by_16=()))
    return variants


def triton_cache_dir() -> Path:
    """Triton's cache directory as Triton reads it now (``TRITON_CACHE_DIR``, else
    ``$TRITON_HOME/.triton/cache``)."""
    from triton import knobs

    return Path(knobs.cache.dir)


class TritonTarget:
    """Compiles configurations for one target through their JITs; made by :func:`triton_target`."""

    def __init__(self, capability: int, device_key: str) -> None:
        self.capability = capability
        self._device_key = device_key
        self._hits: list[bool] = []

    def listen(self, **event: Any) -> None:
        """Triton's compilation listener: records whether the compile was a cache hit."""
        self._hits.append(bool(event["cache_hit"]))

    def cached(self, cfg: KernelConfig) -> bool:
        """Whether Triton's cache holds ``cfg``'s build, found without compiling: the JIT
        specializes the stand-ins as :meth:`warm` has it do, and its ``jit_cache_hook`` (called
        before a compile, which it skips by answering True) looks the key up as
        ``triton.compile`` would."""
        from triton import knobs

        fn = _jit_function(_import(cfg.kernel))
        args, constexprs = _arguments(fn, cfg)
        found: list[bool] = []

        def probe(*, fn: Any, compile: dict[str, Any], **_: Any) -> bool:
            found.append(_in_cache(fn.jit_function, compile, self.capability))
            return True

        previous = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = probe
        try:
            fn.warmup(
                *args,
                grid=(1,),
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
                **constexprs,
            )
        finally:
            knobs.runtime.jit_cache_hook = previous
            fn.device_caches.pop(self._device_key, None)
        if not found:
            raise RuntimeError(f"Triton's JIT did not ask its cache hook about {cfg.name}")
        return found[-1]

    def warm(self, cfg: KernelConfig) -> bool:
        """Compile ``cfg`` into Triton's cache; True when it was already there.

        :raises ValueError: an argument has no type or a type the stand-ins do not cover.
        :raises Exception: whatever Triton raises for a kernel that does not compile.
        """
        fn = _jit_function(_import(cfg.kernel))
        args, constexprs = _arguments(fn, cfg)
        before = len(self._hits)
        # Triton prints a ptxas reproducer on stdout when ptxas fails: the exception is the
        # failure, and stdout stays the report's.
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                fn.warmup(
                    *args,
                    grid=(1,),
                    num_warps=cfg.num_warps,
                    num_stages=cfg.num_stages,
                    **constexprs,
                )
        finally:
            # The JIT keeps a binder and its compiled kernels per device: the target's are
            # dropped, so a real launch in this process never meets them.
            fn.device_caches.pop(self._device_key, None)
        if len(self._hits) == before:
            raise RuntimeError(f"Triton compiled {cfg.name} without telling its listener")
        return self._hits[-1]


def _in_cache(fn: Any, compile: dict[str, Any], capability: int) -> bool:
    """Whether ``triton.compile`` would find the build the JIT describes in ``compile`` (its
    cache hook's argument) in Triton's cache: the same key, from the same source, options and
    target, and the same metadata file that marks a finished entry."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    from triton.runtime.cache import get_cache_key, get_cache_manager

    backend = make_backend(GPUTarget("cuda", capability, 32))
    source = ASTSource(fn, compile["signature"], compile["constants"], compile["configs"][0])
    options = json.loads(compile["specialization_data"])["options"]
    options = backend.parse_options(
        {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
        | source.parse_options()
    )
    key = get_cache_key(source, backend, options, get_cache_invalidating_env_vars())
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    name = f"{source.name[:150]}.json"
    group = get_cache_manager(digest).get_group(name) or {}
    return name in group


@contextlib.contextmanager
def triton_target(capability: int) -> Iterator[TritonTarget]:
    """While open, Triton's JIT compiles for ``sm_<capability>`` with no GPU present: the
    active driver only names the target, and the compilation listener reports cache hits.
    Both are restored on exit."""
    from triton import knobs
    from triton.runtime import driver

    key = f"volta-warmup-sm{capability}"
    target = TritonTarget(capability, key)
    # DriverConfig.reset_active would create the default driver, which fails without a GPU:
    # the previous active driver (None until first used) is put back as it was.
    previous_driver = driver._active
    previous_listener = knobs.compilation.listener
    driver.set_active(_target_driver(capability, key))
    knobs.compilation.listener = target.listen
    try:
        yield target
    finally:
        driver._active = previous_driver
        knobs.compilation.listener = previous_listener


def _target_driver(capability: int, device_key: str) -> Any:
    """A Triton driver that names ``sm_<capability>`` and a device key and nothing else: enough
    for the JIT to specialize and compile a kernel (``warmup``), never to load or launch one.
    Defined here so that importing this module does not import Triton."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    target = GPUTarget("cuda", capability, 32)

    class TargetDriver(DriverBase):  # type: ignore[misc]
        @classmethod
        def is_active(cls) -> bool:
            return False

        def get_current_target(self) -> Any:
            return target

        def get_current_device(self) -> str:
            return device_key

        def get_current_stream(self, device: object = None) -> int:
            return 0

        def map_python_to_cpp_type(self, ty: str) -> str:
            raise NotImplementedError("the warmup driver compiles, it never launches")

        def get_active_torch_device(self) -> Any:
            raise NotImplementedError("the warmup driver has no device")

        def get_benchmarker(self) -> Any:
            raise NotImplementedError("the warmup driver has no device")

    return TargetDriver()


def _import(path: str) -> Any:
    """The object ``"package.module:attr.path"`` names."""
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"kernel path {path!r} is not of the form 'package.module:function'")
    obj: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        obj = getattr(obj, attr)
    return obj


def _jit_function(kernel: Any) -> Any:
    """The ``JITFunction`` under ``kernel`` (an autotuner or heuristics wrapper is unwrapped)."""
    from triton.runtime.jit import JITFunction

    fn = kernel
    while not isinstance(fn, JITFunction):
        inner = getattr(fn, "fn", None)
        if inner is None or inner is fn:
            raise TypeError(
                f"{kernel!r} is not a compiled @triton.jit function (TRITON_INTERPRET=1 makes "
                "every kernel an interpreted one)"
            )
        fn = inner
    return fn


def _arguments(fn: Any, cfg: KernelConfig) -> tuple[list[Any], dict[str, Any]]:
    """What the warmup passes the kernel: every runtime argument by position, as a launch
    does (a stand-in of its declared type, or the value the build declares for it: an integer
    a launch passes as 1, which the JIT makes a constant as it does the launch's; left out, the
    arguments after it would shift into its place), and the ``tl.constexpr`` parameters by
    name."""
    unknown = sorted((set(cfg.signature) | set(cfg.constexprs)) - set(fn.arg_names))
    if unknown:
        raise ValueError(f"{cfg.kernel} has no argument(s) {unknown}")
    runtime = [p.name for p in fn.params if not p.is_constexpr]
    missing = [n for n in runtime if n not in cfg.signature and n not in cfg.constexprs]
    if missing:
        raise ValueError(f"{cfg.name} gives no type or constexpr value for {missing}")
    args = [cfg.constexprs[n] if n in cfg.constexprs else _stand_in(cfg, n) for n in runtime]
    return args, {n: v for n, v in cfg.constexprs.items() if n not in runtime}


def _stand_in(cfg: KernelConfig, name: str) -> Any:
    """What stands for argument ``name`` so that the JIT specializes it as the build declares."""
    kind = cfg.signature[name]
    if kind.startswith("*"):
        import torch
        from triton.runtime.jit import MockTensor

        dtype = _POINTEE_DTYPES.get(kind[1:])
        if dtype is None:
            raise ValueError(f"{cfg.name}: pointer type {kind!r} of {name} is not one warmup makes")
        return MockTensor(getattr(torch, dtype))
    if kind in _INTEGER_BASES:
        step = _DIVISIBLE if name in cfg.divisible_by_16 else _PLAIN
        return _INTEGER_BASES[kind] + step
    if kind == "fp32":
        return 1.5
    if kind in ("i1", "u1"):
        return True
    raise ValueError(f"{cfg.name}: argument type {kind!r} of {name} is not one warmup makes")


def cuda_cached(cfg: CudaKernelConfig, capability: int) -> bool:
    """Whether the cubin of ``cfg`` for ``sm_<capability>`` by this NVRTC is in the cache, whole.

    :raises CudaToolkitUnavailable: no NVRTC here.
    """
    key = cache_key(cfg.source, cfg.options, f"sm_{capability}", nvrtc_version())
    path = cuda_cache_dir() / f"{key}.cubin"
    digest = path.with_name(path.name + DIGEST_SUFFIX)
    try:
        image, stored = path.read_bytes(), digest.read_bytes()
    except OSError:
        return False
    return hashlib.sha256(image).hexdigest().encode() == stored.strip()


def warm_cuda(cfg: CudaKernelConfig, capability: int) -> bool:
    """Build ``cfg``'s cubin for ``sm_<capability>`` into the cache; True when it was there.

    :raises CudaToolkitUnavailable: no NVRTC, or one that cannot build the target, or an
        untrusted cache.
    :raises CudaCompileError: NVRTC refused the source.
    """
    cached = cuda_cached(cfg, capability)
    compile_cubin(cfg.source, cfg.kernel, f"sm_{capability}", cfg.options)
    return cached
