"""What the sm_70 gate must find in a build of the plugin's ``mma.m8n8k4`` GEMMs (the dense
layers' and the routed experts'): the products on HMMA, one FFMA an accumulator, no fp16
multiply, no spills, and room on an SM for the blocks the launch plans."""

from __future__ import annotations

from typing import Any

from volta_devkit.cuda_gate import MAX_BLOCK_THREADS, REGISTERS_PER_BLOCK, block_registers
from volta_devkit.gate import MAX_SHARED_BYTES, assert_gate_passes
from volta_fp8w.tables import Launch

#: An ``mma.m8n8k4`` with f32 accumulators is four ``HMMA.884`` steps in sm_70 SASS
#: (``STEP0`` to ``STEP3``, each a quarter of the 8x8 outputs).
HMMA_PER_MMA = 4

#: Accumulators of one m8n8k4 product per lane (an 8x8 fp32 tile over 8 lanes of a quad pair).
ACC_PER_MMA = 8

#: What a Volta SM holds besides registers (CUDA C++ Programming Guide, "Compute Capabilities"):
#: 2048 resident threads.
THREADS_PER_SM = 2048


def tile_mmas(launch: Launch, groups: int) -> int:
    """``m8n8k4`` products of one k-tile of a warp: ``block_k / 4`` input steps, each for every
    8-row block and every one of the warp's ``groups`` of 32 outputs."""
    return (launch.block_k // 4) * (launch.block_m // 8) * groups


def assert_tensor_core_build(report: Any, launch: Launch, groups: int) -> None:
    """``report`` (the gate's, of ``launch``'s build with ``groups`` output groups a warp)
    shows no spills and no stack, the k-tile loop's body once (exactly :func:`tile_mmas`
    products of four HMMA steps), one FFMA an accumulator (the scale flush), no fp16 multiply
    (none per weight), and registers and shared memory that let an SM hold the launch's
    ``programs_per_sm`` blocks."""
    assert_gate_passes(report)
    assert report.n_spills == 0, report.describe()
    assert report.stack_bytes == 0, report.describe()
    hist = report.sass_histogram
    assert hist.get("HMMA", 0) == HMMA_PER_MMA * tile_mmas(launch, groups), hist
    assert hist.get("FFMA", 0) == ACC_PER_MMA * (launch.block_m // 8) * groups, hist
    assert "HMUL2" not in hist, hist
    assert "HFMA2" not in hist, hist
    threads = launch.num_warps * 32
    assert threads <= MAX_BLOCK_THREADS
    held = min(
        REGISTERS_PER_BLOCK // block_registers(report.n_regs, threads),
        THREADS_PER_SM // threads,
        MAX_SHARED_BYTES // report.shared_bytes,
    )
    assert held >= launch.programs_per_sm, (report.n_regs, report.shared_bytes, held)
