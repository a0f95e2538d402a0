"""The SM70 compile gate for CUDA-source kernels: prove one fits a V100 without having one.

NVRTC 12.x compiles CUDA C++ for sm_70 on a machine with no GPU (CUDA 13 dropped sm_70). The
gate compiles one kernel configuration with ``--ptxas-options=-v`` (spill and stack figures
from ptxas's report in NVRTC's log), reads the kernel's registers and static shared memory from
the cubin itself (its ELF sections), and disassembles it for an opcode histogram with a
disassembler that reads sm_70 (:mod:`volta_devkit.disassembler`).

A configuration passes when it compiles, spills nothing, needs at most 96 KB of shared memory
(static plus the declared dynamic bytes), its block fits the register file, and, when it claims
tensor cores, its SASS holds ``HMMA``. Every failure, a compile error or a missing toolkit
included, is a line in :attr:`GateReport.problems`: the gate never raises for a bad kernel.
The report is the Triton gate's :class:`~volta_devkit.gate.GateReport`, with ``num_warps`` the
block's warps and ``num_stages`` 1.
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

from volta_core import CudaKernelConfig
from volta_core.kernel_api import (
    CudaCompileError,
    CudaToolkitUnavailable,
    nvrtc_build,
    nvrtc_version,
)
from volta_devkit.disassembler import DisassemblerUnavailable, disassemble, sass_histogram
from volta_devkit.gate import MAX_SHARED_BYTES, GateReport

# The register file a block draws on at compute capability 7.0: 64K 32-bit registers per SM
# and per block, allocated per warp in units of 256 (CUDA C++ Programming Guide, "Compute
# Capabilities" table; the CUDA Occupancy Calculator's allocation granularity).
REGISTERS_PER_BLOCK = 65536
_WARP_REGISTER_UNIT = 256
MAX_BLOCK_THREADS = 1024

_ELFCLASS64 = 2
_SHT_SYMTAB = 2
_EIFMT_SVAL = 4
_EIATTR_REGCOUNT = 0x2F
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


class CubinKernel(NamedTuple):
    """What a cubin records of one kernel: registers per thread and static shared bytes."""

    registers: int
    static_shared_bytes: int


def cubin_kernel(cubin: bytes, kernel: str) -> CubinKernel | None:
    """Read ``kernel``'s registers and static shared memory from a cubin's ELF sections, or
    None when the cubin has no such kernel.

    The register count is the ``EIATTR_REGCOUNT`` attribute of the ``.nv.info`` section (symbol
    index, count); the static shared memory the size of section ``.nv.shared.<kernel>``. Both
    are what ``cuobjdump -res-usage`` prints as ``REG`` and ``SHARED``, and ``nvdisasm`` names
    the attribute it shows; ``.nv.info`` entries are a format byte, an attribute byte and
    either a 16-bit size and that many bytes (format 4) or a 16-bit value.
    """
    if cubin[:4] != b"\x7fELF" or cubin[4] != _ELFCLASS64:
        raise ValueError("not a 64-bit ELF cubin")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    # name, type, flags, addr, offset, size, link, info, align, entsize
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(count)]

    def string(table: int, offset: int) -> str:
        start = sections[table][4] + offset
        return cubin[start : cubin.index(b"\0", start)].decode()

    by_name = {string(names_index, s[0]): s for s in sections}
    symtab = next((s for s in sections if s[1] == _SHT_SYMTAB), None)
    info = by_name.get(".nv.info")
    if f".text.{kernel}" not in by_name or symtab is None or info is None:
        return None
    symbols = {
        i: string(symtab[6], struct.unpack_from("<I", cubin, symtab[4] + i * 24)[0])
        for i in range(symtab[5] // 24)
    }
    registers = None
    data = cubin[info[4] : info[4] + info[5]]
    at = 0
    while at + 4 <= len(data):
        fmt, attr, size = struct.unpack_from("<BBH", data, at)
        payload = data[at + 4 : at + 4 + size] if fmt == _EIFMT_SVAL else b""
        if attr == _EIATTR_REGCOUNT and len(payload) == 8:
            symbol, value = struct.unpack("<II", payload)
            if symbols.get(symbol) == kernel:
                registers = value
        at += 4 + len(payload)
    if registers is None:
        return None
    shared = by_name.get(f".nv.shared.{kernel}")
    return CubinKernel(registers, shared[5] if shared else 0)


def ptxas_spills(log: str, kernel: str) -> tuple[int, int, int] | None:
    """``(stack frame, spill stores, spill loads)`` bytes ptxas reported for entry ``kernel``
    and the functions it calls (summed), from NVRTC's log; None if the log has no report."""
    parts = _ENTRY.split(log)
    # split() alternates text and captured names: [before, name1, text1, name2, text2, ...]
    sections = {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}
    found = _SPILLS.findall(sections.get(kernel, ""))
    if not found:
        return None
    stack, stores, loads = (sum(int(f[i]) for f in found) for i in range(3))
    return stack, stores, loads


def _verbose_ptxas() -> list[str]:
    """NVRTC options for ptxas's resource report. NVRTC 12.9 caches compiles (with a driver
    present) and a cache hit runs no ptxas, so no report: ``--no-cache`` from 12.9 on, as
    NVIDIA/Fuser#4694 does; older NVRTC refuses that option."""
    return ["--ptxas-options=-v", *(["--no-cache"] if nvrtc_version() >= (12, 9) else [])]


def block_registers(registers: int, threads: int) -> int:
    """Registers a block of ``threads`` takes from the register file: each warp's share rounded
    up to the allocation unit."""
    per_warp = -(-registers * 32 // _WARP_REGISTER_UNIT) * _WARP_REGISTER_UNIT
    return per_warp * -(-threads // 32)


def check_cuda_config(cfg: CudaKernelConfig, capability: int = 70) -> GateReport:
    """Compile ``cfg`` for ``sm_<capability>`` with NVRTC and judge it (see the module doc)."""
    report = GateReport(cfg.name, capability, num_warps=-(-cfg.block_threads // 32), num_stages=1)
    arch = f"sm_{capability}"
    try:
        build = nvrtc_build(cfg.source, cfg.kernel, arch, [*cfg.options, *_verbose_ptxas()])
    except (CudaToolkitUnavailable, CudaCompileError) as exc:
        report.problems.append(f"does not compile for {arch}: {exc}")
        return report
    found = cubin_kernel(build.image, cfg.kernel)
    if found is None:
        report.problems.append(
            f'the cubin has no kernel {cfg.kernel!r}; declare it extern "C" __global__'
        )
        return report
    report.n_regs = found.registers
    report.shared_bytes = found.static_shared_bytes + cfg.dynamic_shared_bytes
    spills = ptxas_spills(build.log, cfg.kernel)
    if spills is None:
        report.problems.append(f"NVRTC's log has no ptxas resource report for {cfg.kernel}")
    else:
        report.stack_bytes, report.n_spills, report.n_spill_loads = spills
    try:
        report.sass_histogram = sass_histogram(disassemble(build.image, arch))
    except DisassemblerUnavailable as exc:
        report.problems.append(f"no SASS histogram: {exc}")
    _judge(report, cfg, arch)
    return report


def _judge(report: GateReport, cfg: CudaKernelConfig, arch: str) -> None:
    if report.n_spills:
        report.problems.append(
            f"spills registers: {report.n_spills} B of spill stores and {report.n_spill_loads} B "
            f"of spill loads with {report.n_regs} registers per thread"
        )
    if report.shared_bytes is not None and report.shared_bytes > MAX_SHARED_BYTES:
        report.problems.append(
            f"needs {report.shared_bytes} B of shared memory ({cfg.dynamic_shared_bytes} B of it "
            f"dynamic), over the {MAX_SHARED_BYTES} B a Volta block can have"
        )
    if not 1 <= cfg.block_threads <= MAX_BLOCK_THREADS:
        report.problems.append(
            f"a block has 1 to {MAX_BLOCK_THREADS} threads, not {cfg.block_threads}"
        )
    elif report.n_regs is not None:
        needed = block_registers(report.n_regs, cfg.block_threads)
        if needed > REGISTERS_PER_BLOCK:
            report.problems.append(
                f"a block of {cfg.block_threads} threads at {report.n_regs} registers needs "
                f"{needed} registers, over the {REGISTERS_PER_BLOCK} of the register file: it "
                "cannot launch; use fewer threads or add __launch_bounds__"
            )
    if cfg.claims_tensor_cores and report.sass_histogram and "HMMA" not in report.sass_histogram:
        report.problems.append(
            f"claims tensor cores but its {arch} SASS has no HMMA (it runs on FMA units)"
        )
