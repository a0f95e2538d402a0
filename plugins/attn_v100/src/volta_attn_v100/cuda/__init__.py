"""Attention on Volta's tensor cores: CUDA C++ with inline PTX ``mma.m8n8k4``, shipped as package
data and compiled at first use by NVRTC (:func:`volta_core.kernel_api.load_cuda_kernel`).

Triton's ``tl.dot`` runs on the FMA units on SM70 (triton-lang/triton#5066), 15.7 TFLOP/s where
the V100's tensor cores give 125 (NVIDIA Tesla V100 GPU Architecture whitepaper). Each source's
builds differ in NVRTC options made here from the launch tables, the same for the launchers
(:mod:`.prefill`) and the SM70 compile gate (:func:`volta_attn_v100.gate_configs.cuda_builds`).
Importing this package reads the sources and imports neither torch nor cuda-bindings.
"""

from __future__ import annotations

from importlib.resources import files

from volta_attn_v100.tables import CudaPrefillTile

#: The prefill kernel's symbol (``extern "C"``) and its CUDA C++ source.
PREFILL_KERNEL = "volta_prefill_mma"
PREFILL_SOURCE = files(__name__).joinpath("prefill.cu").read_text()


def prefill_options(head_size: int, kv_fp8: bool, tile: CudaPrefillTile) -> tuple[str, ...]:
    """The NVRTC options of one prefill build (``prefill.cu``'s ``-D`` list)."""
    return (
        f"-DHEAD={head_size}",
        f"-DBLOCK_N={tile.block_n}",
        f"-DWARPS={tile.num_warps}",
        f"-DKV_FP8={int(kv_fp8)}",
    )


def prefill_shared_bytes(head_size: int, tile: CudaPrefillTile) -> int:
    """Dynamic shared memory one prefill block takes (``prefill.cu``'s ``SMEM_BYTES``, which the
    kernel checks against what it was given): Q, K and V^T tiles and each warp's P, every row
    padded by 8 halves, V^T's head rows to whole 32-column products."""
    pad = 8
    value_rows = -(-head_size // 32) * 32
    halves = (
        tile.block_m * (head_size + pad)
        + tile.block_n * (head_size + pad)
        + value_rows * (tile.block_n + pad)
        + tile.block_m * (tile.block_n + pad)
    )
    return 2 * halves


#: The decode kernel's symbol (``extern "C"``) and its CUDA C++ source (:mod:`.decode`).
DECODE_KERNEL = "volta_decode_mma"
DECODE_SOURCE = files(__name__).joinpath("decode.cu").read_text()


def decode_options(
    head_size: int, kv_fp8: bool, num_warps: int, min_blocks: int
) -> tuple[str, ...]:
    """The NVRTC options of one decode build (``decode.cu``'s ``-D`` list): head size, KV dtype,
    warps per block and the blocks per SM its registers are bounded for."""
    return (
        f"-DHEAD={head_size}",
        f"-DKV_FP8={int(kv_fp8)}",
        f"-DWARPS={num_warps}",
        f"-DMIN_BLOCKS={min_blocks}",
    )
