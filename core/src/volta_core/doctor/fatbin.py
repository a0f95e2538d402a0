"""Which GPU architectures a compiled library carries: its ``.nv_fatbin`` section, read directly.

A CUDA shared object (``libtorch_cuda.so``, vLLM's ``_C.abi3.so``...) keeps its device code in
the ELF section ``.nv_fatbin``: one or more fat-binary containers, each a 16-byte header
(magic ``0xBA55ED50``, version, header size, size of the entries) followed by entries. Every
entry has its own header (kind 1 = PTX, 2 = ELF cubin, i.e. SASS; the architecture number; the
payload size) and its payload. The layout is NVIDIA's ``fatbinary.h`` (``fatBinaryHeader``),
also documented by n-eiling/cuda-fatbin-decompression (``fatbin-decompress.h``); ``cuobjdump
--list-elf --list-ptx`` prints the same list. Only headers are read: a compressed payload is
never decompressed, since its architecture is in the entry header, so even a 1 GB
``libtorch_cuda.so`` is answered with a few thousand small reads.

The rule this module serves (CUDA C++ Programming Guide, "Binary Compatibility" and "PTX
Compatibility"): a GPU of compute capability 7.0 runs SASS built for ``sm_70`` (a cubin for
7.5 or 8.0 does not load), or JIT-compiles PTX built for ``compute_XY`` with XY <= 70.

Pure Python, standard library only, no CUDA needed: it runs on machines without a GPU.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTION = ".nv_fatbin"
KIND_PTX = 1
KIND_ELF = 2
#: Entry flags marking a compressed payload (LZ4 up to CUDA 12, the newer scheme of CUDA 13).
_COMPRESSED_FLAGS = 0x2000 | 0x8000

_ELF_MAGIC = b"\x7fELF"
_FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
# kind, version, header size, payload size, compressed size, (unknown), minor, major, arch,
# name offset, name length, flags; the rest of the entry header is not needed.
_ENTRY_HEADER = struct.Struct("<HHIQIIHHIIIQ")


class FatbinError(ValueError):
    """The file is not an ELF file, or its ``.nv_fatbin`` section is not a fat binary."""


@dataclass(frozen=True)
class FatbinEntry:
    """One code image in a fat binary: SASS (a cubin) or PTX, for one architecture."""

    kind: str
    """``"sass"`` (an ELF cubin), ``"ptx"``, or ``"kind N"`` for anything else (LTO IR...)."""
    arch: int
    """The architecture number: 70 means ``sm_70`` for SASS, ``compute_70`` for PTX."""
    compressed: bool = False
    ptx_isa: str | None = None
    """The PTX ISA version of a PTX entry (``"9.0"``), else None."""

    @property
    def label(self) -> str:
        if self.kind == "ptx":
            return f"compute_{self.arch}"
        if self.kind == "sass":
            return f"sm_{self.arch}"
        return f"{self.kind} arch {self.arch}"


@dataclass(frozen=True)
class CudaArchs:
    """The architectures one library carries."""

    sass: tuple[int, ...]
    ptx: tuple[int, ...]
    entries: int
    compressed: int = 0

    def runs_on(self, capability: int = 70) -> bool:
        """SASS for exactly this capability, or PTX for it or an older one (JIT-compiled)."""
        return capability in self.sass or any(arch <= capability for arch in self.ptx)

    def describe(self) -> str:
        sass = " ".join(f"sm_{a}" for a in self.sass) or "none"
        ptx = " ".join(f"compute_{a}" for a in self.ptx) or "none"
        return f"SASS {sass}; PTX {ptx}"


#: Largest section-name table read (real ones are a few kilobytes).
MAX_NAMES_BYTES = 2**20


def _read(f: BinaryIO, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset``; offsets and sizes come from the file itself, so any that
    reach past its end are refused before seeking (an offset past 2**63 cannot be sought)."""
    end = f.seek(0, os.SEEK_END)
    if offset < 0 or size < 0 or offset + size > end:
        raise FatbinError(f"truncated file: wanted {size} bytes at offset {offset}")
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise FatbinError(f"truncated file: wanted {size} bytes at offset {offset}")
    return data


def elf_sections(f: BinaryIO) -> dict[str, tuple[int, int]]:
    """Every ELF section with file contents: ``name -> (file offset, size)``.

    Reads the ELF header and the section header table (ELF64, either byte order); raises
    :class:`FatbinError` for anything that is not a 64-bit ELF file.
    """
    ident = _read_ident(f)
    order = "<" if ident[5] == 1 else ">"
    (shoff,) = struct.unpack(order + "Q", _read(f, 0x28, 8))
    shentsize, shnum, shstrndx = struct.unpack(order + "HHH", _read(f, 0x3A, 6))
    if shoff == 0:
        return {}
    header = struct.Struct(order + "IIQQQQIIQQ")
    if shentsize < header.size:
        raise FatbinError(f"ELF section header size {shentsize} is too small")

    def section(index: int) -> tuple[int, int, int, int, int]:
        name, kind, _flags, _addr, offset, size, link, *_ = header.unpack(
            _read(f, shoff + index * shentsize, header.size)
        )
        return name, kind, offset, size, link

    if shnum == 0 or shstrndx == 0xFFFF:  # more than 0xff00 sections: counts in section 0
        _, _, _, size0, link0 = section(0)
        shnum = shnum or size0
        shstrndx = link0 if shstrndx == 0xFFFF else shstrndx
    if shnum > 1_000_000 or shstrndx >= shnum:
        raise FatbinError("ELF section header table is corrupt")
    rows = [section(i) for i in range(shnum)]
    _, _, str_offset, str_size, _ = rows[shstrndx]
    if str_size > MAX_NAMES_BYTES:
        raise FatbinError(f"ELF section-name table of {str_size} bytes is corrupt")
    names = _read(f, str_offset, str_size)
    sections: dict[str, tuple[int, int]] = {}
    for name_offset, kind, offset, size, _ in rows:
        if kind == 8:  # SHT_NOBITS: no contents in the file
            continue
        end = names.find(b"\0", name_offset)
        name = names[name_offset : end if end >= 0 else None].decode("ascii", "replace")
        sections.setdefault(name, (offset, size))
    return sections


def _read_ident(f: BinaryIO) -> bytes:
    f.seek(0)
    ident = f.read(16)
    if len(ident) < 16 or ident[:4] != _ELF_MAGIC:
        raise FatbinError("not an ELF file")
    if ident[4] != 2:
        raise FatbinError("a 32-bit ELF file (only 64-bit libraries carry CUDA code here)")
    if ident[5] not in (1, 2):
        raise FatbinError(f"ELF file of unknown byte order {ident[5]}")
    return ident


def fatbin_entries(f: BinaryIO, offset: int, size: int) -> list[FatbinEntry]:
    """The entries of every fat-binary container in ``size`` bytes at ``offset``.

    Containers follow each other, sometimes separated by zero padding up to 8-byte alignment.
    """
    entries: list[FatbinEntry] = []
    pos, end = offset, offset + size
    while pos + _FATBIN_HEADER.size <= end:
        magic, _version, header_size, fat_size = _FATBIN_HEADER.unpack(
            _read(f, pos, _FATBIN_HEADER.size)
        )
        if magic == 0:  # padding between containers
            pos += 8
            continue
        if magic != FATBIN_MAGIC:
            raise FatbinError(
                f"no fat binary at offset {pos} (magic {magic:#010x}, expected {FATBIN_MAGIC:#x})"
            )
        if header_size < _FATBIN_HEADER.size:
            raise FatbinError(f"fat binary header size {header_size} at offset {pos} is invalid")
        entry, entries_end = pos + header_size, pos + header_size + fat_size
        if entries_end > end:
            raise FatbinError(f"fat binary at offset {pos} runs past its section")
        while entry + _ENTRY_HEADER.size <= entries_end:
            parsed, entry_header_size, payload_size = _entry(_read(f, entry, _ENTRY_HEADER.size))
            if entry_header_size < _ENTRY_HEADER.size:
                raise FatbinError(f"fat binary entry at offset {entry} has an invalid header")
            entries.append(parsed)
            entry += entry_header_size + payload_size
        pos = entries_end
    return entries


def _entry(raw: bytes) -> tuple[FatbinEntry, int, int]:
    """One entry header: the entry, the header's size and the payload's size."""
    kind, _, header_size, size, _, _, minor, major, arch, _, _, flags = _ENTRY_HEADER.unpack(raw)
    compressed = bool(flags & _COMPRESSED_FLAGS)
    if kind == KIND_PTX:
        entry = FatbinEntry("ptx", arch, compressed, f"{major}.{minor}")
    elif kind == KIND_ELF:
        entry = FatbinEntry("sass", arch, compressed)
    else:
        entry = FatbinEntry(f"kind {kind}", arch, compressed)
    return entry, header_size, size


def _open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for reading without blocking, refused unless a regular file: a FIFO
    named ``*.so`` would block a plain ``open`` forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FatbinError("not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_entries(path: str | Path) -> list[FatbinEntry] | None:
    """Every fat-binary entry of an ELF file; None when it has no ``.nv_fatbin`` section.

    :raises FatbinError: not a regular file, not a 64-bit ELF file, or a corrupt one.
    """
    with _open_regular(path) as f:
        section = elf_sections(f).get(FATBIN_SECTION)
        if section is None:
            return None
        return fatbin_entries(f, *section)


def cuda_archs(path: str | Path) -> CudaArchs | None:
    """The SASS and PTX architectures an ELF file carries; None when it carries no CUDA code."""
    entries = read_entries(path)
    if entries is None:
        return None
    return summarize(entries)


def summarize(entries: list[FatbinEntry]) -> CudaArchs:
    """The distinct architectures of ``entries``, sorted."""
    return CudaArchs(
        sass=tuple(sorted({e.arch for e in entries if e.kind == "sass"})),
        ptx=tuple(sorted({e.arch for e in entries if e.kind == "ptx"})),
        entries=len(entries),
        compressed=sum(e.compressed for e in entries),
    )
