"""The SM70 compile gate for CUDA sources catches what would break on a V100 and passes what
would run, on a machine without a GPU: NVRTC 12 builds sm_70, the figures come from the cubin
and ptxas's report, the opcodes from a disassembler that reads sm_70.

The cubin figures are checked against ``cuobjdump -res-usage`` (CUDA 12.8, bundled with Triton
3.6), an independent reader of the same bytes.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("triton")

from volta_core import CudaKernelConfig
from volta_core.kernel_api import (
    CudaToolkitUnavailable,
    NvrtcBuild,
    nvrtc_build,
    nvrtc_version,
)
from volta_devkit import cuda_gate
from volta_devkit.cuda_example import sm70_gate_configs
from volta_devkit.cuda_gate import (
    block_registers,
    check_cuda_config,
    cubin_kernel,
    ptxas_spills,
)
from volta_devkit.disassembler import nvidia_tool
from volta_devkit.gate import MAX_SHARED_BYTES, assert_gate_passes

try:
    nvrtc_version()
except CudaToolkitUnavailable as exc:
    pytest.skip(f"needs NVRTC 12: {exc}", allow_module_level=True)

# 64 live fp32 values per thread: about 168 registers, or spills when capped at 32.
WIDE = r"""
extern "C" __global__ void wide(const float* __restrict__ x, float* __restrict__ y, int n) {
  float v[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) v[i] = x[threadIdx.x + i * n];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) s += v[i] * v[63 - i] * (float)i;
  for (int i = 0; i < 64; ++i) y[threadIdx.x + i * n] = v[i] * s;
}
"""

STAGED = r"""
extern "C" __global__ void staged(const float* x, float* y) {
  __shared__ float tile[1024];
  extern __shared__ float more[];
  tile[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  more[threadIdx.x] = tile[1023 - threadIdx.x];
  y[threadIdx.x] = more[threadIdx.x];
}
"""

BROKEN = 'extern "C" __global__ void broken(float* x) { x[0] = not_declared; }'


@pytest.fixture(scope="session")
def example_report():
    (cfg,) = sm70_gate_configs()
    return cfg, check_cuda_config(cfg)


def _res_usage(cubin: bytes) -> dict[str, int]:
    """``cuobjdump -res-usage``'s REG and SHARED for the one function in ``cubin``."""
    tool = nvidia_tool("cuobjdump")
    if tool is None:
        pytest.skip("no cuobjdump (Triton's wheel carries it)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        out = subprocess.run(
            [str(tool), "-res-usage", str(path)], capture_output=True, text=True, check=True
        ).stdout
    return {key: int(value) for key, value in re.findall(r"\b(REG|SHARED):(\d+)", out)}


def test_the_example_mma_gemm_passes_at_sm70_on_tensor_cores(example_report) -> None:
    cfg, report = example_report
    assert_gate_passes(report)
    assert report.name == cfg.name
    assert report.num_warps == 4
    assert report.n_regs is not None
    assert 0 < report.n_regs <= 255
    assert report.n_spills == 0
    assert report.shared_bytes == 0
    # One mma.m8n8k4 with fp32 accumulators is four HMMA.884 steps in Volta's SASS.
    hmma = report.sass_histogram.get("HMMA", 0)
    assert hmma >= 4
    assert hmma % 4 == 0
    assert "FFMA" not in report.sass_histogram


def test_the_figures_are_those_of_the_cubin(example_report) -> None:
    cfg, report = example_report
    build = nvrtc_build(cfg.source, cfg.kernel, "sm_70", cuda_gate._verbose_ptxas())
    assert _res_usage(build.image) == {"REG": report.n_regs, "SHARED": 0}
    assert f"Used {report.n_regs} registers" in build.log


# An sm_90 cubin's shared section also holds the 1 KB a Hopper block reserves for the system
# (cuobjdump counts it too; ptxas's report says 4096).
@pytest.mark.parametrize(("arch", "shared"), [("sm_70", 4096), ("sm_80", 4096), ("sm_90", 5120)])
def test_cubin_registers_and_shared_memory_match_cuobjdump(arch: str, shared: int) -> None:
    build = nvrtc_build(STAGED, "staged", arch)
    found = cubin_kernel(build.image, "staged")
    assert found is not None
    assert found.static_shared_bytes == shared
    assert _res_usage(build.image) == {"REG": found.registers, "SHARED": shared}
    assert cubin_kernel(build.image, "other") is None
    with pytest.raises(ValueError, match="ELF"):
        cubin_kernel(b"not a cubin at all", "staged")


def test_static_and_dynamic_shared_memory_are_judged_together() -> None:
    fits = CudaKernelConfig("staged", STAGED, "staged", 1024, dynamic_shared_bytes=88 * 1024)
    report = check_cuda_config(fits)
    assert_gate_passes(report)
    assert report.shared_bytes == 4096 + 88 * 1024
    over = check_cuda_config(replace(fits, dynamic_shared_bytes=MAX_SHARED_BYTES))
    assert over.shared_bytes == 4096 + MAX_SHARED_BYTES
    (problem,) = over.problems
    assert f"over the {MAX_SHARED_BYTES} B a Volta block can have" in problem


def test_spills_are_caught() -> None:
    fits = CudaKernelConfig("wide", WIDE, "wide", 256)
    assert_gate_passes(check_cuda_config(fits))
    capped = check_cuda_config(replace(fits, options=("--maxrregcount=32",)))
    assert capped.n_regs == 32
    assert capped.n_spills is not None
    assert capped.n_spills > 0
    assert capped.sass_histogram.get("STL", 0) > 0  # the spill stores, seen in the SASS
    (problem,) = capped.problems
    assert problem.startswith(f"spills registers: {capped.n_spills} B of spill stores")


def test_a_block_that_cannot_fit_the_register_file_is_caught() -> None:
    report = check_cuda_config(CudaKernelConfig("wide", WIDE, "wide", 1024))
    assert report.n_regs is not None
    assert report.n_regs * 1024 > 65536
    (problem,) = report.problems
    assert "a block of 1024 threads" in problem
    assert "cannot launch" in problem
    empty = check_cuda_config(CudaKernelConfig("w", WIDE, "wide", 0))
    assert "1 to 1024 threads" in empty.problems[0]


def test_register_allocation_rounds_each_warp_up() -> None:
    assert block_registers(32, 1024) == 32 * 1024
    assert block_registers(33, 32) == 1280  # 33 x 32 = 1056 rounded up to 5 units of 256
    assert block_registers(255, 256) == 65536
    assert block_registers(64, 33) == 2 * 64 * 32  # a partial warp takes a whole warp's share


def test_claiming_tensor_cores_without_hmma_is_a_problem() -> None:
    claiming = CudaKernelConfig("wide", WIDE, "wide", 256, claims_tensor_cores=True)
    report = check_cuda_config(claiming)
    assert report.sass_histogram.get("FFMA", 0) > 0
    (problem,) = report.problems
    assert "claims tensor cores but its sm_70 SASS has no HMMA" in problem


def test_m8n8k4_has_no_hmma_at_sm90(example_report) -> None:
    # The PTX ISA ("mma" notes) says m8n8k4 is optimized for sm_70 and may be much slower
    # elsewhere: Hopper has no HMMA.884, so the same source runs on the H100 without tensor
    # cores and only the sm_70 build proves them.
    cfg, _ = example_report
    report = check_cuda_config(cfg, capability=90)
    assert report.n_spills == 0
    assert "HMMA" not in report.sass_histogram
    (problem,) = report.problems
    assert "has no HMMA" in problem


def test_compile_errors_and_missing_kernels_are_problems_not_raises() -> None:
    broken = check_cuda_config(CudaKernelConfig("broken", BROKEN, "broken", 32))
    (problem,) = broken.problems
    assert problem.startswith("does not compile for sm_70: NVRTC could not compile broken for ")
    assert 'identifier "not_declared" is undefined' in problem
    misnamed = check_cuda_config(CudaKernelConfig("x", WIDE, "not_there", 32))
    (problem,) = misnamed.problems
    assert "no kernel 'not_there'" in problem


def test_a_missing_toolkit_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(*args, **kwargs) -> NvrtcBuild:
        raise CudaToolkitUnavailable('cuda-bindings is not installed: pip install "x[cuda]"')

    monkeypatch.setattr(cuda_gate, "nvrtc_build", unavailable)
    report = check_cuda_config(CudaKernelConfig("wide", WIDE, "wide", 256))
    (problem,) = report.problems
    assert "cuda-bindings is not installed" in problem


def test_ptxas_report_is_read_per_entry() -> None:
    log = (
        "ptxas info    : Compiling entry function 'a' for 'sm_70'\n"
        "ptxas info    : Function properties for a\n"
        "    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Compiling entry function 'b' for 'sm_70'\n"
        "ptxas info    : Function properties for helper\n"
        "    16 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Function properties for b\n"
        "    0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
    )
    assert ptxas_spills(log, "a") == (8, 0, 0)
    assert ptxas_spills(log, "b") == (16, 12, 16)
    assert ptxas_spills(log, "c") is None
