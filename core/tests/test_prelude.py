"""``volta_core.kernel_api.SM70_PRELUDE``: the one text of the device helpers the plugins' SM70
CUDA kernels share (the split-K epilogue of their tensor-core GEMMs among them), and
:func:`~volta_core.kernel_api.with_prelude`, which puts it in front of a kernel's source. Needs
neither torch nor triton; the NVRTC checks skip without a CUDA 12 NVRTC (the core's ``cuda``
extra)."""

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
    "h2f": r"__device__\s+__forceinline__\s+float\s+h2f\s*\(\s*u16 h\s*\)\s*\{",
    "splitk_arrive": (
        r"__device__\s+__forceinline__\s+bool\s+splitk_arrive\s*\(\s*int\s*\*\s*counters\s*,"
        r"\s*int tile\s*,\s*int\s*&\s*last\s*\)\s*\{"
    ),
    "splitk_mma_epilogue": (
        r"template\s*<\s*int kGroups\s*,\s*int kBlocks\s*,\s*typename Store\s*>\s*"
        r"__device__\s+__forceinline__\s+void\s+splitk_mma_epilogue\s*\(\s*"
        r"const float\s*\(\s*&\s*acc\s*\)\s*\[kGroups\]\s*\[kBlocks\]\s*\[8\]\s*,"
        r"\s*float\s*\*\s*ws\s*,\s*int\s*\*\s*counters\s*,\s*int\s*&\s*last\s*,"
        r"\s*const u16\s*\*\s*bias\s*,\s*int m\s*,\s*int n\s*,\s*int tok0\s*,\s*int n_warp\s*,"
        r"\s*Store store\s*\)\s*\{"
    ),
}

#: What each helper compiles to (PTX ISA: mma.m8n8k4 with .f16 inputs, cvt .rn, ex2.approx.ftz,
#: cvt to f32; the split-K arrival: a fence, a barrier and the counter's atomic add; the
#: epilogue: the partials' fp32 atomic adds and the sums' exchange with zero).
PTX_INSTRUCTIONS = {
    "mma_m8n8k4": ("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32",),
    "pack_half2": ("cvt.rn.f16.f32",),
    "ex2": ("ex2.approx.ftz.f32",),
    "h2f": ("cvt.f32.f16",),
    "splitk_arrive": ("membar.gl", "bar.sync", "atom.global.add.u32"),
    "splitk_mma_epilogue": ("atom.global.add.f32", "atom.global.exch.b32"),
}

#: A kernel that uses every helper, so each one's instruction is in its PTX: one warp's 8x8
#: product, its accumulators through the split-K epilogue (one group of 32 outputs, one block
#: of 8 tokens), stored as fp16 pairs.
USES_EVERY_HELPER = """\
extern "C" __global__ void prelude_probe(const u32* in, float* out, u32* packed, u8* small,
                                         float* ws, int* counters, const u16* bias, int m,
                                         int n) {
  __shared__ int last;
  float d[1][1][8] = {{{0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}}};
  mma_m8n8k4(d[0][0], in[0], in[1], in[2], in[3]);
  for (int i = 0; i < 8; ++i) out[threadIdx.x * 8 + i] = ex2(d[0][0][i]);
  small[threadIdx.x] = (u8)(u16)in[threadIdx.x];
  splitk_mma_epilogue(d, ws, counters, last, bias, m, n, blockIdx.x * 8, blockIdx.y * 32,
                      [&](int tok, int col, float v0, float v1, bool ok0, bool ok1) {
                        if (ok0 && ok1) packed[(tok * n + col) / 2] = pack_half2(v0, v1);
                      });
}
"""


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


@pytest.mark.parametrize("helper", DEFINITIONS)
def test_the_prelude_defines_each_helper_exactly_once(helper: str) -> None:
    code = _strip_comments(SM70_PRELUDE)
    assert len(re.findall(DEFINITIONS[helper], code)) == 1, helper
    # and nothing else of that name: one declaration (a type, then the name), no overload beside
    # it; a call (``!splitk_arrive(...)``, ``+= h2f(...)``) is no declaration
    assert len(re.findall(rf"\b(?!return\b)\w+\s+{helper}\s*[;(]", code)) == 1, helper


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
    for helper, instructions in PTX_INSTRUCTIONS.items():
        for instruction in instructions:
            assert instruction in ptx, (helper, instruction)


def test_the_split_k_epilogue_orders_its_arrival() -> None:
    """The serial split-K rule's order in the probe's PTX: every partial's atomic add, then
    the fence and the barrier before the counter's one increment; the last arriver's fence
    after the barrier that publishes the count, before it exchanges the sums for zeros."""
    ptx = _ptx(with_prelude(USES_EVERY_HELPER), "prelude_probe")
    body = ptx[ptx.index(".entry prelude_probe") :]

    def first(instruction: str) -> int:
        return body.index(instruction)

    def last(instruction: str) -> int:
        return body.rindex(instruction)

    assert last("atom.global.add.f32") < first("membar.gl") < first("atom.global.add.u32")
    assert first("atom.global.add.u32") < last("membar.gl") < first("atom.global.exch.b32")
    assert body.count("atom.global.add.u32") == 1
    assert body.count("membar.gl") == 2


def test_the_prelude_may_be_included_twice() -> None:
    _ptx(with_prelude(SM70_PRELUDE + USES_EVERY_HELPER), "prelude_probe")


def test_compile_errors_count_the_kernel_files_own_lines() -> None:
    source = 'extern "C" __global__ void prelude_probe() {\n  no_such_name = 1;\n}\n'
    with pytest.raises(CudaCompileError, match=r"prelude_probe\.cu\(2\): error"):
        _ptx(with_prelude(source), "prelude_probe")
