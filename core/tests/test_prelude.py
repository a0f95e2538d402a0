"""``volta_core.kernel_api.SM70_PRELUDE``: the one text of the device helpers the plugins' SM70
CUDA kernels share, and :func:`~volta_core.kernel_api.with_prelude`, which puts it in front of a
kernel's source. Needs neither torch nor triton; the NVRTC checks skip without a CUDA 12 NVRTC
(the core's ``cuda`` extra)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from volta_core.kernel_api import (
    SM70_PRELUDE,
    CudaCompileError,
    CudaToolkitUnavailable,
    nvrtc_build,
    with_prelude,
)

#: Each helper's definition, matched anywhere in a text.
DEFINITIONS = {
    "u8": r"typedef\s+unsigned\s+char\s+u8\s*;",
    "u16": r"typedef\s+unsigned\s+short\s+u16\s*;",
    "u32": r"typedef\s+unsigned\s+int\s+u32\s*;",
    "mma_m8n8k4": (
        r"__device__\s+__forceinline__\s+void\s+mma_m8n8k4\s*\(\s*float\s*\(\s*&\s*d\s*\)\s*\[8\]"
        r"\s*,\s*u32 a0\s*,\s*u32 a1\s*,\s*u32 b0\s*,\s*u32 b1\s*\)\s*\{"
    ),
    "pack_half2": (
        r"__device__\s+__forceinline__\s+u32\s+pack_half2\s*\(\s*float lo\s*,\s*float hi\s*\)"
        r"\s*\{"
    ),
    "ex2": r"__device__\s+__forceinline__\s+float\s+ex2\s*\(\s*float x\s*\)\s*\{",
}

#: What each helper compiles to (PTX ISA: mma.m8n8k4 with .f16 inputs, cvt .rn, ex2.approx.ftz).
PTX_INSTRUCTIONS = {
    "mma_m8n8k4": "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32",
    "pack_half2": "cvt.rn.f16.f32",
    "ex2": "ex2.approx.ftz.f32",
}

#: A kernel that uses every helper, so each one's instruction is in its PTX.
USES_EVERY_HELPER = """\
extern "C" __global__ void prelude_probe(const u32* in, float* out, u32* packed, u8* small) {
  float d[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  mma_m8n8k4(d, in[0], in[1], in[2], in[3]);
  for (int i = 0; i < 8; ++i) out[threadIdx.x * 8 + i] = ex2(d[i]);
  packed[threadIdx.x] = pack_half2(d[0], d[1]);
  small[threadIdx.x] = (u8)(u16)in[threadIdx.x];
}
"""


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


@pytest.mark.parametrize("helper", DEFINITIONS)
def test_the_prelude_defines_each_helper_exactly_once(helper: str) -> None:
    code = _strip_comments(SM70_PRELUDE)
    assert len(re.findall(DEFINITIONS[helper], code)) == 1, helper
    # and nothing else of that name: one definition, no overload beside it
    assert len(re.findall(rf"\b{helper}\b\s*[;(]", code)) == 1, helper


def test_the_prelude_is_guarded_against_a_second_inclusion() -> None:
    lines = [line for line in _strip_comments(SM70_PRELUDE).splitlines() if line.strip()]
    guard = re.fullmatch(r"#ifndef (\w+)", lines[0])
    assert guard is not None, lines[0]
    assert lines[1] == f"#define {guard.group(1)}"
    assert lines[-1].startswith("#endif")
    assert SM70_PRELUDE.endswith("\n")


def test_with_prelude_puts_the_prelude_and_a_line_directive_in_front() -> None:
    source = 'extern "C" __global__ void k() {}\n'
    text = with_prelude(source)
    assert text.startswith(SM70_PRELUDE)
    assert text == f"{SM70_PRELUDE}#line 1\n{source}"
    assert text.endswith(source)


def test_importing_the_kernel_api_imports_neither_torch_nor_triton() -> None:
    code = (
        "import sys, volta_core.kernel_api as k; k.with_prelude(''); "
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]", run.stdout + run.stderr


def _ptx(source: str, name: str) -> str:
    try:
        return nvrtc_build(source, name, "compute_70").image.decode()
    except CudaToolkitUnavailable as exc:
        pytest.skip(f"no CUDA 12 NVRTC: {exc}")


def test_every_helper_compiles_to_its_instruction() -> None:
    ptx = _ptx(with_prelude(USES_EVERY_HELPER), "prelude_probe")
    for helper, instruction in PTX_INSTRUCTIONS.items():
        assert instruction in ptx, helper


def test_the_prelude_may_be_included_twice() -> None:
    _ptx(with_prelude(SM70_PRELUDE + USES_EVERY_HELPER), "prelude_probe")


def test_compile_errors_count_the_kernel_files_own_lines() -> None:
    source = 'extern "C" __global__ void prelude_probe() {\n  no_such_name = 1;\n}\n'
    with pytest.raises(CudaCompileError, match=r"prelude_probe\.cu\(2\): error"):
        _ptx(with_prelude(source), "prelude_probe")
