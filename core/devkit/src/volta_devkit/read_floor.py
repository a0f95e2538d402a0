"""The read floor: the time of the simplest one-launch kernel that streams N bytes from HBM.

The benchmark harness judges memory-bound kernels against the device's copy bandwidth, measured
with a 1 GiB copy. A decode GEMV reads far less (ct_wna16's 5120x5120 4-bit layer is 13.5 MB),
and a read that small has fixed costs a 1 GiB copy hides: the launch inside a CUDA graph, the
first loads' latency, the tail where the last programs finish alone. :func:`read_floor` times,
in the same run and with the same graph timing the plugins' decode cases use
(:func:`volta_devkit.bench.time_cuda_graph`), a kernel that does nothing but read the same
number of bytes, so that "ours over the floor" separates the part of a gap a kernel could
remove from the part no kernel can.

:func:`stream_read_kernel` splits the words evenly over a few programs per SM; each program
xors its words into one int32 (stored, so the compiler cannot drop the loads). The host tries
a small set of tile sizes, pipeline depths and grid sizes, checks every candidate's output
against a torch computation of the same reduction (a wrong floor would be worse than none), and
keeps the fastest.

torch is imported inside the functions (core imports without it); triton at module level, as
the other kernel modules do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from volta_core import KernelConfig

if TYPE_CHECKING:
    import torch

#: Word tiles (int32 words per loop iteration) the host tries.
BLOCKS = (512, 1024, 2048)
#: Software-pipelining depths of the read loop the host tries (SM80+; SM70 ignores them).
STAGES = (3, 4)
#: Programs per SM the host tries.
PROGRAMS_PER_SM = (2, 4, 8)
#: Warps per program.
NUM_WARPS = 4
#: A program's share is a multiple of this many words (64 bytes: whole 32-byte DRAM sectors,
#: 16-byte aligned for vector loads, and the JIT's divisible-by-16 specialization applies).
WORD_ALIGN = 16
#: The kernel indexes words in int32.
MAX_WORDS = 2**31 - 1


@triton.jit
def stream_read_kernel(
    src_ptr,
    out_ptr,
    n_words,
    words_per_program,
    BLOCK: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Program ``p`` xors words ``[p * words_per_program, min(n_words, (p + 1) * ...))`` into
    ``out_ptr[p]``: nothing but the loads, one xor per word and one store per program."""
    pid = tl.program_id(0)
    start = pid * words_per_program
    end = start + tl.minimum(words_per_program, n_words - start)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for base in tl.range(start, end, BLOCK, num_stages=NUM_STAGES):
        idx = base + offs
        acc ^= tl.load(src_ptr + idx, mask=idx < end, other=0)
    tl.store(out_ptr + pid, tl.xor_sum(acc, axis=0))


@dataclass(frozen=True)
class Candidate:
    """One launch configuration the host tries."""

    block: int
    num_warps: int
    num_stages: int
    programs_per_sm: int


@dataclass(frozen=True)
class ReadFloor:
    """The fastest candidate: median milliseconds per read of ``nbytes`` inside a CUDA graph.

    ``gbps`` is ``nbytes / median_ms`` (1e9 B/GB, bytes read only, no write counted).
    ``tried`` holds every candidate with its median, fastest first.
    """

    median_ms: float
    nbytes: int
    gbps: float
    best: Candidate
    programs: int
    words_per_program: int
    tried: tuple[tuple[Candidate, float], ...]


def launch_plan(n_words: int, sm_count: int, programs_per_sm: int) -> tuple[int, int]:
    """``(programs, words_per_program)``: ``n_words`` split as evenly as the alignment allows.

    Every program but possibly the last reads the same number of words, a multiple of
    :data:`WORD_ALIGN`, so each SM gets the same bytes (no tail of half-idle SMs) and every
    program starts 64-byte aligned.
    """
    if n_words <= 0 or sm_count <= 0 or programs_per_sm <= 0:
        raise ValueError(
            f"n_words, sm_count and programs_per_sm must be positive, got {n_words}, "
            f"{sm_count}, {programs_per_sm}"
        )
    share = -(-n_words // (sm_count * programs_per_sm))
    words_per_program = -(-share // WORD_ALIGN) * WORD_ALIGN
    return -(-n_words // words_per_program), words_per_program


def xor_per_program(words: torch.Tensor, words_per_program: int) -> torch.Tensor:
    """The torch computation of the kernel's output: the xor of each program's words, int32.

    Works on any device: the words are zero-padded (xor's identity) to whole programs and
    folded in halves until one column is left.
    """
    import torch

    flat = words.reshape(-1)
    programs = -(-flat.numel() // words_per_program)
    table = torch.zeros(programs * words_per_program, dtype=torch.int32, device=flat.device)
    table[: flat.numel()] = flat
    table = table.view(programs, words_per_program)
    while table.shape[1] > 1:
        if table.shape[1] % 2:
            table = torch.nn.functional.pad(table, (0, 1))
        half = table.shape[1] // 2
        table = table[:, :half] ^ table[:, half:]
    return table[:, 0].contiguous()


def kernel_configs() -> list[KernelConfig]:
    """Every launch configuration :func:`read_floor` tries, for the compile gate."""
    return [
        KernelConfig(
            name=f"stream_read_b{block}_w{NUM_WARPS}_s{stages}",
            kernel="volta_devkit.read_floor:stream_read_kernel",
            signature={
                "src_ptr": "*i32",
                "out_ptr": "*i32",
                "n_words": "i32",
                "words_per_program": "i32",
            },
            constexprs={"BLOCK": block, "NUM_STAGES": stages},
            num_warps=NUM_WARPS,
            num_stages=stages,
            divisible_by_16=("n_words", "words_per_program"),
        )
        for block in BLOCKS
        for stages in STAGES
    ]


def check_sources(srcs: Sequence[torch.Tensor]) -> int:
    """The common byte count of ``srcs``; :class:`ValueError` naming the problem otherwise.

    Called before any launch: the tensors must be non-empty, contiguous, of one byte size that
    is a multiple of 4 (they are read as int32 words) and on one device.
    """
    if not srcs:
        raise ValueError("read_floor needs at least one source tensor, got none")
    nbytes = srcs[0].numel() * srcs[0].element_size()
    for i, src in enumerate(srcs):
        size = src.numel() * src.element_size()
        if not src.is_contiguous():
            raise ValueError(f"srcs[{i}] must be contiguous")
        if size != nbytes:
            raise ValueError(f"srcs[{i}] has {size} bytes, srcs[0] has {nbytes}: sizes must match")
        if src.device != srcs[0].device:
            raise ValueError(f"srcs[{i}] is on {src.device}, srcs[0] on {srcs[0].device}")
    if nbytes == 0 or nbytes % 4:
        raise ValueError(f"sources must hold a positive multiple of 4 bytes, got {nbytes}")
    if nbytes // 4 > MAX_WORDS:
        raise ValueError(f"sources of more than {MAX_WORDS} int32 words are not supported")
    return nbytes


def _launcher(
    candidate: Candidate, out: torch.Tensor, n_words: int, programs: int, words_per_program: int
) -> Callable[[torch.Tensor], None]:
    """A one-argument launch of ``candidate`` (the source varies, for L2 rotation)."""

    def launch(src: torch.Tensor) -> None:
        stream_read_kernel[(programs,)](
            src, out, n_words, words_per_program,
            BLOCK=candidate.block, NUM_STAGES=candidate.num_stages,
            num_warps=candidate.num_warps,
        )  # fmt: skip

    return launch


def read_floor(
    srcs: Sequence[torch.Tensor],
    *,
    programs_per_sm: Sequence[int] = PROGRAMS_PER_SM,
    blocks: Sequence[int] = BLOCKS,
    stages: Sequence[int] = STAGES,
) -> ReadFloor:
    """Time :func:`stream_read_kernel` over ``srcs`` for each candidate and return the fastest.

    Pass several same-sized CUDA tensors (together several times the L2 size, as
    :func:`volta_devkit.bench.rotation_count` counts) so successive calls in the graph
    read from HBM, not L2. Each candidate's output is checked against :func:`xor_per_program`
    once before it is timed; a mismatch raises :class:`RuntimeError`. ``blocks`` and ``stages``
    choose among :data:`BLOCKS` and :data:`STAGES` only, the launches :func:`kernel_configs`
    declares to the compile gate. Bad arguments raise :class:`ValueError` before any launch.
    """
    import torch

    from volta_devkit.bench import time_cuda_graph

    nbytes = check_sources(srcs)
    if not programs_per_sm or any(p <= 0 for p in programs_per_sm):
        raise ValueError(f"programs_per_sm must be positive values, got {tuple(programs_per_sm)}")
    if not blocks or not set(blocks) <= set(BLOCKS):
        raise ValueError(f"blocks must be among the gated {BLOCKS}, got {tuple(blocks)}")
    if not stages or not set(stages) <= set(STAGES):
        raise ValueError(f"stages must be among the gated {STAGES}, got {tuple(stages)}")
    if srcs[0].device.type != "cuda":
        raise ValueError(f"read_floor times CUDA tensors, got one on {srcs[0].device}")
    words = [src.view(-1).view(torch.int32) for src in srcs]
    n_words = nbytes // 4
    sm_count = torch.cuda.get_device_properties(srcs[0].device).multi_processor_count
    out = torch.empty(sm_count * max(programs_per_sm), dtype=torch.int32, device=srcs[0].device)

    tried: list[tuple[Candidate, float]] = []
    plans: dict[int, tuple[int, int]] = {}
    for per_sm in programs_per_sm:
        programs, words_per_program = launch_plan(n_words, sm_count, per_sm)
        plans[per_sm] = programs, words_per_program
        expected = xor_per_program(words[0], words_per_program)
        for block in blocks:
            for depth in stages:
                candidate = Candidate(block, NUM_WARPS, depth, per_sm)
                launch = _launcher(candidate, out, n_words, programs, words_per_program)
                out[:programs] = ~expected  # differs everywhere: an unwritten entry shows
                launch(words[0])
                if not torch.equal(out[:programs], expected):
                    raise RuntimeError(f"stream_read_kernel {candidate} read the wrong words")
                timing = time_cuda_graph(launch, [(w,) for w in words])
                tried.append((candidate, timing.median_ms))
    tried.sort(key=lambda item: item[1])
    best, median_ms = tried[0]
    programs, words_per_program = plans[best.programs_per_sm]
    return ReadFloor(
        median_ms=median_ms,
        nbytes=nbytes,
        gbps=nbytes / (median_ms * 1e-3) / 1e9,
        best=best,
        programs=programs,
        words_per_program=words_per_program,
        tried=tuple(tried),
    )
