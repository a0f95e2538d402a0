"""The CUDA-source runtime (``volta_core.kernel_api``): NVRTC compiles, the on-disk cache, the
errors a kernel plugin falls back on, and launches on the GPU.

The CPU tests need NVRTC 12 and cuda-bindings (the core's ``cuda`` extra, in the devkit's
``test`` extra) and no GPU; the ``gpu`` tests launch the example ``mma.m8n8k4`` GEMM on the
current device, built for it and from its compute_70 PTX.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from volta_core.kernel_api import (  # noqa: E402
    CudaCompileError,
    CudaToolkitUnavailable,
    _nvrtc,
    compile_cubin,
    compile_ptx,
    load_cuda_kernel,
    nvrtc_version,
)
from volta_devkit.cuda_example import KERNEL, SOURCE, mma_gemm, mma_gemm_reference  # noqa: E402
from volta_devkit.testing import assert_rel_close, poison_  # noqa: E402

try:
    NVRTC_MISSING = ""
    nvrtc_version()
except CudaToolkitUnavailable as exc:
    NVRTC_MISSING = str(exc)
needs_nvrtc = pytest.mark.skipif(bool(NVRTC_MISSING), reason=NVRTC_MISSING)

TINY = 'extern "C" __global__ void tiny(float* x) { x[threadIdx.x] = 1.0f; }'
BROKEN = textwrap.dedent(
    """\
    extern "C" __global__ void broken(float* x) {
      x[0] = undefined_thing;
      x[1] = other_bad;
    }
    """
)
# fp32 accumulation of exact fp16 products: the error is fp32 rounding of the sums.
GEMM_TOL = 1e-5


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(_nvrtc.CACHE_ENV, str(tmp_path / "cuda"))
    return tmp_path / "cuda"


@pytest.fixture
def count_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the target of every NVRTC compile the cache asks for."""
    built: list[str] = []
    real = _nvrtc.nvrtc_build

    def counting(source, name, target, options=()):
        built.append(target)
        return real(source, name, target, options)

    monkeypatch.setattr(_nvrtc, "nvrtc_build", counting)
    return built


def test_cache_key_changes_with_everything_that_changes_the_image() -> None:
    base = _nvrtc.cache_key(TINY, ["-DX=1"], "sm_70", (12, 9))
    assert base == _nvrtc.cache_key(TINY, ["-DX=1"], "sm_70", (12, 9))
    others = {
        _nvrtc.cache_key(TINY + " ", ["-DX=1"], "sm_70", (12, 9)),
        _nvrtc.cache_key(TINY, ["-DX=2"], "sm_70", (12, 9)),
        _nvrtc.cache_key(TINY, [], "sm_70", (12, 9)),
        _nvrtc.cache_key(TINY, ["-DX=1"], "sm_90", (12, 9)),
        _nvrtc.cache_key(TINY, ["-DX=1"], "compute_70", (12, 9)),
        _nvrtc.cache_key(TINY, ["-DX=1"], "sm_70", (12, 8)),
    }
    assert base not in others
    assert len(others) == 6


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_nvrtc.CACHE_ENV, "/somewhere/else")
    assert _nvrtc.cuda_cache_dir() == Path("/somewhere/else")
    monkeypatch.delenv(_nvrtc.CACHE_ENV)
    assert _nvrtc.cuda_cache_dir() == Path.home() / ".cache" / "vllm-volta" / "cuda"


@needs_nvrtc
def test_a_cache_hit_does_not_recompile(cache_dir: Path, count_builds: list[str]) -> None:
    first = compile_cubin(TINY, "tiny", "sm_70")
    assert first.startswith(b"\x7fELF")
    assert count_builds == ["sm_70"]
    assert compile_cubin(TINY, "tiny", "sm_70") == first
    assert count_builds == ["sm_70"]
    assert len(list(cache_dir.glob("*.cubin"))) == 1
    compile_cubin(TINY, "tiny", "sm_70", ["-DUNUSED=1"])
    compile_cubin(TINY, "tiny", "sm_80")
    assert count_builds == ["sm_70", "sm_70", "sm_80"]
    # A damaged entry (not an ELF file) is rebuilt and replaced, not loaded.
    damaged = cache_dir / f"{_nvrtc.cache_key(TINY, (), 'sm_70', nvrtc_version())}.cubin"
    damaged.write_bytes(b"garbage")
    assert compile_cubin(TINY, "tiny", "sm_70") == first
    assert count_builds[-1] == "sm_70"
    assert len(count_builds) == 4
    assert damaged.read_bytes() == first


@needs_nvrtc
def test_an_unwritable_cache_costs_a_recompile_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count_builds: list[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv(_nvrtc.CACHE_ENV, str(blocker / "cuda"))
    assert compile_cubin(TINY, "tiny", "sm_70").startswith(b"\x7fELF")
    assert compile_cubin(TINY, "tiny", "sm_70").startswith(b"\x7fELF")
    assert count_builds == ["sm_70", "sm_70"]


@needs_nvrtc
def test_ptx_for_compute_70_holds_the_volta_mma(cache_dir: Path) -> None:
    ptx = compile_ptx(SOURCE, KERNEL, "compute_70")
    assert ".target sm_70" in ptx
    assert "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32" in ptx
    assert f".entry {KERNEL}(" in ptx
    assert list(cache_dir.glob("*.ptx"))


def test_targets_are_checked_before_compiling() -> None:
    with pytest.raises(ValueError, match="sm_XY"):
        compile_cubin(TINY, "tiny", "compute_70")
    with pytest.raises(ValueError, match="compute_XY"):
        compile_ptx(TINY, "tiny", "sm_70")
    with pytest.raises(ValueError, match="not an architecture"):
        _nvrtc.nvrtc_build(TINY, "tiny", "volta")
    with pytest.raises(ValueError, match="not as an option"):
        _nvrtc.nvrtc_build(TINY, "tiny", "sm_70", ["--gpu-architecture=sm_80"])


@needs_nvrtc
def test_a_compile_error_names_the_kernel_the_arch_and_the_first_error(cache_dir: Path) -> None:
    with pytest.raises(CudaCompileError) as info:
        compile_cubin(BROKEN, "broken", "sm_70")
    message = str(info.value)
    assert message.startswith("NVRTC could not compile broken for sm_70: ")
    assert 'identifier "undefined_thing" is undefined' in message
    assert "other_bad" not in message  # only the first error, not the deprecation warning either
    assert "deprecated" not in message
    assert "other_bad" in info.value.log
    assert (info.value.name, info.value.target) == ("broken", "sm_70")
    assert not list(cache_dir.glob("*"))  # nothing cached for a failure


@needs_nvrtc
def test_an_architecture_nvrtc_cannot_build_is_a_toolkit_problem() -> None:
    with pytest.raises(
        CudaToolkitUnavailable, match=r"cannot build sm_30.*vllm-volta-core\[cuda\]"
    ):
        compile_cubin(TINY, "tiny", "sm_30")


def test_cuda_13_nvrtc_is_refused_for_volta_with_what_to_install() -> None:
    message = _nvrtc._unsupported_target((13, 0), [75, 80, 90, 100, 120], "sm_70")
    assert "NVRTC 13.0 cannot build sm_70" in message
    assert "CUDA 13 dropped Volta" in message
    assert 'pip install "vllm-volta-core[cuda]"' in message


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **env},
        timeout=120,
    )


TRY_COMPILE = """
from volta_core.kernel_api import CudaToolkitUnavailable, compile_cubin
try:
    compile_cubin('extern "C" __global__ void k() {}', "k", "sm_70")
except CudaToolkitUnavailable as exc:
    print("UNAVAILABLE:", exc)
"""


def test_missing_cuda_bindings_is_one_clear_error(tmp_path: Path) -> None:
    # A regular package named `cuda` first on the path hides the installed cuda-bindings, as
    # an environment without them would.
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "__init__.py").write_text("")
    pythonpath = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    run = _python(TRY_COMPILE, PYTHONPATH=pythonpath)
    assert run.returncode == 0, run.stderr
    assert "UNAVAILABLE: cuda-bindings is not installed" in run.stdout
    assert 'pip install "vllm-volta-core[cuda]"' in run.stdout


@needs_nvrtc
def test_a_missing_nvrtc_library_is_one_clear_error() -> None:
    # cuda-bindings finds libnvrtc through cuda.pathfinder; here it finds none, as where the
    # nvidia-cuda-nvrtc-cu12 wheel is not installed.
    run = _python(
        textwrap.dedent(
            """
            import cuda.pathfinder as pathfinder

            def not_found(name):
                raise pathfinder.DynamicLibNotFoundError(f'Failure finding "lib{name}.so": absent')

            pathfinder.load_nvidia_dynamic_lib = not_found
            """
        )
        + TRY_COMPILE
    )
    assert run.returncode == 0, run.stderr
    assert "UNAVAILABLE: NVRTC could not be loaded (DynamicLibNotFoundError" in run.stdout
    assert 'pip install "vllm-volta-core[cuda]"' in run.stdout


def test_importing_the_kernel_api_loads_no_cuda_bindings() -> None:
    run = _python(
        "import sys, volta_core.kernel_api\n"
        'print(sorted(m for m in sys.modules if m.startswith(("cuda.bindings", "cuda.core"))))'
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_kernel_arguments_get_their_c_types() -> None:
    values, types = _nvrtc._kernel_params(
        [None, True, 7, -(2**31), 2.5, ctypes.c_int64(2**40), ctypes.c_double(0.1)], 0
    )
    assert values == (0, True, 7, -(2**31), 2.5, 2**40, 0.1)
    assert types == (
        ctypes.c_void_p, ctypes.c_bool, ctypes.c_int32, ctypes.c_int32, ctypes.c_float,
        ctypes.c_int64, ctypes.c_double,
    )  # fmt: skip


def test_bad_kernel_arguments_are_refused_before_a_launch() -> None:
    with pytest.raises(OverflowError, match=r"argument 1 .*ctypes\.c_int64"):
        _nvrtc._kernel_params([0, 2**31], 0)
    with pytest.raises(TypeError, match="argument 0 is a str"):
        _nvrtc._kernel_params(["x"], 0)
    with pytest.raises(ValueError, match="argument 0 is a tensor on cpu, not on cuda:0"):
        _nvrtc._kernel_params([torch.zeros(1)], 0)


def test_cuda_kernels_need_a_cuda_device() -> None:
    with pytest.raises(ValueError, match="CUDA devices, not on cpu"):
        load_cuda_kernel(TINY, "tiny", device=torch.device("cpu"))
    with pytest.raises(ValueError, match="compute_XY"):
        load_cuda_kernel(TINY, "tiny", device=torch.device("cuda", 0), ptx_arch="sm_70")


def test_the_example_launcher_refuses_bad_input_before_a_launch() -> None:
    a = torch.zeros(4, 8, dtype=torch.float16)
    w = torch.zeros(6, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="2-D"):
        mma_gemm(a[0], w)
    with pytest.raises(ValueError, match="float16"):
        mma_gemm(a.float(), w)
    with pytest.raises(ValueError, match="share K"):
        mma_gemm(a, w[:, :4])
    with pytest.raises(ValueError, match="one CUDA device"):
        mma_gemm(a, w)


def test_launch_geometry_is_checked() -> None:
    assert _nvrtc._dims(5, "grid") == (5, 1, 1)
    assert _nvrtc._dims((2, 3), "grid") == (2, 3, 1)
    for bad in ((), (1, 2, 3, 4), (-1,), (1.5,)):
        with pytest.raises(ValueError, match="1 to 3 non-negative ints"):
            _nvrtc._dims(bad, "grid")  # type: ignore[arg-type]


# -- on the GPU ---------------------------------------------------------------------------

GEMM_SHAPES = [(1, 1, 4), (37, 45, 13), (128, 96, 64), (256, 512, 1024), (8, 27648, 512)]


def _operands(m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    a = torch.randn(m, k, generator=gen).half().cuda()
    w = torch.randn(n, k, generator=gen).half().cuda()
    return a, w


@pytest.mark.gpu
@pytest.mark.parametrize("ptx_arch", [None, "compute_70"], ids=["own-arch-cubin", "compute_70-ptx"])
def test_mma_gemm_matches_float64_on_the_gpu(cache_dir: Path, ptx_arch: str | None) -> None:
    for m, n, k in GEMM_SHAPES:
        a, w = _operands(m, n, k)
        out = poison_(torch.empty(m, n, dtype=torch.float32, device="cuda"))
        mma_gemm(a, w, out=out, ptx_arch=ptx_arch)
        torch.cuda.synchronize()
        assert_rel_close(out, mma_gemm_reference(a, w), GEMM_TOL, f"mma_gemm {m}x{n}x{k}")
    kernel = load_cuda_kernel(SOURCE, KERNEL, ptx_arch=ptx_arch)
    major, minor = torch.cuda.get_device_capability()
    assert kernel.target == (ptx_arch or f"sm_{major}{minor}")


@pytest.mark.gpu
def test_mma_gemm_launches_inside_cuda_graph_capture(cache_dir: Path) -> None:
    a, w = _operands(64, 96, 128)
    out = torch.empty(64, 96, dtype=torch.float32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        mma_gemm(a, w, out=out)  # warm-up: compiles and loads outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mma_gemm(a, w, out=out)
    for _ in range(2):
        a.copy_(torch.randn_like(a))
        poison_(out)
        graph.replay()
        torch.cuda.synchronize()
        assert_rel_close(out, mma_gemm_reference(a, w), GEMM_TOL, "mma_gemm graph replay")


DYNAMIC_SHARED = r"""
extern "C" __global__ void reverse_through_shared(const float* x, float* y, int n) {
  extern __shared__ float buffer[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buffer[i] = x[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = buffer[n - 1 - i];
}
"""


@pytest.mark.gpu
def test_dynamic_shared_memory_over_48kb_is_allowed_per_kernel(cache_dir: Path) -> None:
    n = 96 * 1024 // 4  # the whole 96 KB a V100 block can have
    x = torch.randn(n, device="cuda")
    y = poison_(torch.empty_like(x))
    kernel = load_cuda_kernel(DYNAMIC_SHARED, "reverse_through_shared")
    kernel.launch(1, 256, x, y, n, shared_mem=n * 4)
    torch.cuda.synchronize()
    assert torch.equal(y, x.flip(0))


@pytest.mark.gpu
def test_a_tensor_on_another_device_is_refused(cache_dir: Path) -> None:
    kernel = load_cuda_kernel(TINY, "tiny")
    with pytest.raises(ValueError, match="argument 0 is a tensor on cpu"):
        kernel.launch(1, 32, torch.zeros(32))
    kernel.launch(0, 32, None)  # an empty grid launches nothing
