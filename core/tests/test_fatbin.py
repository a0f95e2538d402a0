"""The ``.nv_fatbin`` reader on real ELF files built here by NVIDIA's own tools.

- ``nvcc`` (CUDA 13, part of the machine image) builds shared objects for sm_75/sm_80, plain
  and with every image compressed: libraries that cannot run on a V100.
- Triton's bundled ``ptxas`` (CUDA 12.x, from the ``kernels`` extra) assembles an sm_70 cubin,
  ``fatbinary`` (CUDA 13) wraps it with its PTX, and the C compiler puts that fat binary in a
  shared object's ``.nv_fatbin`` section, where nvcc would: a library that runs on a V100.

Triton's ``cuobjdump`` (CUDA 12.8) lists the same files as the oracle. A test whose tool is
absent skips, naming it; CI's image has all of them.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from volta_core.doctor import checks as doctor
from volta_core.doctor import fatbin

KERNEL_CU = "__global__ void volta_probe(float *x) { x[threadIdx.x] *= 2.0f; }\n"


def _tool_dir() -> Path | None:
    for root in doctor.package_dirs("triton"):
        path = root / "backends" / "nvidia" / "bin"
        if path.is_dir():
            return path
    return None


def cuda12_ptxas() -> Path | None:
    """Triton's bundled ptxas when it is a CUDA 12.x one (CUDA 13 cannot target sm_70)."""
    tools = _tool_dir()
    ptxas = tools / "ptxas" if tools else None
    if ptxas is None or not ptxas.is_file():
        return None
    return ptxas if doctor.ptxas_release(ptxas).startswith("12.") else None


def _need(tool: str | Path | None, what: str) -> str:
    if tool is None:
        pytest.skip(f"{what} is not available")
    return str(tool)


def _run(*argv: str | Path) -> None:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{argv[0]} failed: {done.stderr or done.stdout}"


def build_nvcc_library(directory: Path, name: str, *flags: str) -> Path:
    """A shared object compiled by nvcc from a one-kernel .cu file with ``flags``."""
    nvcc = _need(shutil.which("nvcc"), "nvcc (CUDA toolkit)")
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"{name}.cu"
    source.write_text(KERNEL_CU)
    library = directory / f"{name}.so"
    _run(nvcc, "-shared", "-Xcompiler", "-fPIC", *flags, source, "-o", library)
    return library


def build_sm70_library(directory: Path, name: str = "volta70") -> Path:
    """A shared object whose ``.nv_fatbin`` holds an sm_70 cubin and compute_70 PTX."""
    ptxas = _need(cuda12_ptxas(), "a CUDA 12.x ptxas (Triton's bundled one)")
    fatbinary = _need(shutil.which("fatbinary"), "fatbinary (CUDA toolkit)")
    cc = _need(shutil.which("cc") or shutil.which("gcc"), "a C compiler")
    directory.mkdir(parents=True, exist_ok=True)
    ptx, cubin, fat = (directory / f"{name}.{ext}" for ext in ("ptx", "cubin", "fatbin"))
    ptx.write_text(doctor.PROBE_PTX)
    _run(ptxas, "-arch=sm_70", ptx, "-o", cubin)
    _run(
        fatbinary,
        "--64",
        f"--create={fat}",
        f"--image3=kind=elf,sm=70,file={cubin}",
        f"--image3=kind=ptx,sm=70,file={ptx}",
    )
    source = directory / f"{name}.c"
    source.write_text(
        '__asm__(".section .nv_fatbin,\\"a\\"\\n.balign 8\\n'
        f'.incbin \\"{fat}\\"\\n.previous\\n");\n'
        "int volta_probe_host(void) { return 70; }\n"
    )
    library = directory / f"{name}.so"
    _run(cc, "-shared", "-fPIC", source, "-o", library)
    return library


def cuobjdump_listing(library: Path) -> collections.Counter[tuple[str, int]]:
    """``cuobjdump --list-elf --list-ptx``: how many SASS and PTX images per architecture."""
    tools = _tool_dir()
    cuobjdump = _need(tools / "cuobjdump" if tools else None, "cuobjdump (Triton's)")
    out = subprocess.run(
        [cuobjdump, "--list-elf", "--list-ptx", str(library)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.findall(r"^(ELF|PTX) file\s+\d+: .*\.sm_(\d+)\.(?:cubin|ptx)$", out, re.M)
    return collections.Counter(("sass" if k == "ELF" else "ptx", int(a)) for k, a in found)


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fatbin")


def test_nvcc_library_for_turing_carries_no_sm70(libraries: Path) -> None:
    library = build_nvcc_library(
        libraries, "turing", "-gencode", "arch=compute_75,code=[sm_75,compute_75]"
    )
    archs = fatbin.cuda_archs(library)
    assert archs is not None
    assert (archs.sass, archs.ptx) == ((75,), (75,))
    assert not archs.runs_on(70)
    assert archs.describe() == "SASS sm_75; PTX compute_75"
    ptx = [e for e in fatbin.read_entries(library) or [] if e.kind == "ptx"]
    assert ptx
    assert all(re.fullmatch(r"\d+\.\d+", e.ptx_isa or "") for e in ptx)


def test_compressed_entries_are_read_from_their_headers(libraries: Path) -> None:
    library = build_nvcc_library(
        libraries,
        "compressed",
        "-gencode",
        "arch=compute_75,code=sm_75",
        "-gencode",
        "arch=compute_80,code=[sm_80,compute_80]",
        "-Xfatbin",
        "-compress-all",
    )
    entries = fatbin.read_entries(library)
    assert entries
    assert all(e.compressed for e in entries)
    archs = fatbin.summarize(entries)
    assert (archs.sass, archs.ptx) == ((75, 80), (80,))
    assert archs.compressed == len(entries)
    assert collections.Counter((e.kind, e.arch) for e in entries) == cuobjdump_listing(library)


def test_sm70_library_runs_on_a_v100(libraries: Path) -> None:
    library = build_sm70_library(libraries)
    entries = fatbin.read_entries(library)
    assert entries is not None
    assert {(e.kind, e.arch) for e in entries} == {("sass", 70), ("ptx", 70)}
    assert [e.label for e in entries if e.kind == "sass"] == ["sm_70"]
    assert collections.Counter((e.kind, e.arch) for e in entries) == cuobjdump_listing(library)
    assert fatbin.cuda_archs(library).runs_on(70)  # type: ignore[union-attr]


def test_a_cubin_and_a_program_are_elf_without_a_fat_binary(libraries: Path) -> None:
    assert fatbin.cuda_archs(Path(sys.executable).resolve()) is None
    library = build_sm70_library(libraries, "plain")
    assert fatbin.cuda_archs(library.with_suffix(".cubin")) is None  # the cubin itself


def test_non_elf_and_truncated_files_are_clear_errors(libraries: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.so"
    text.write_text("not a library\n")
    with pytest.raises(fatbin.FatbinError, match="not an ELF file"):
        fatbin.cuda_archs(text)
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    with pytest.raises(fatbin.FatbinError, match="not an ELF file"):
        fatbin.cuda_archs(empty)
    real = Path(sys.executable).resolve().read_bytes()
    cut = tmp_path / "cut.so"
    cut.write_bytes(real[:200])
    with pytest.raises(fatbin.FatbinError, match="truncated"):
        fatbin.cuda_archs(cut)
    elf32 = tmp_path / "elf32.so"
    elf32.write_bytes(real[:4] + b"\x01" + real[5:64])
    with pytest.raises(fatbin.FatbinError, match="32-bit"):
        fatbin.cuda_archs(elf32)


def test_a_damaged_fat_binary_is_an_error_not_a_guess(libraries: Path, tmp_path: Path) -> None:
    library = build_sm70_library(libraries, "damaged")
    data = bytearray(library.read_bytes())
    with library.open("rb") as f:
        offset, _ = fatbin.elf_sections(f)[fatbin.FATBIN_SECTION]
    data[offset : offset + 4] = b"\x01\x02\x03\x04"
    damaged = tmp_path / "damaged.so"
    damaged.write_bytes(bytes(data))
    with pytest.raises(fatbin.FatbinError, match="no fat binary at offset"):
        fatbin.cuda_archs(damaged)


@pytest.mark.parametrize(
    ("sass", "ptx", "runs"),
    [((70,), (), True), ((75, 80), (), False), ((), (60,), True), ((80,), (75,), False)],
)
def test_v100_runs_sm70_sass_or_ptx_for_70_or_older(
    sass: tuple[int, ...], ptx: tuple[int, ...], runs: bool
) -> None:
    assert fatbin.CudaArchs(sass=sass, ptx=ptx, entries=1).runs_on(70) is runs
