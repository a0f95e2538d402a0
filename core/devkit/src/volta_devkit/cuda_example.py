"""The CUDA-source worked example: an fp16 GEMM on Volta's tensor cores (``mma.m8n8k4``).

Triton gives SM70 no tensor cores (``tl.dot`` lowers to FMA there, triton-lang/triton#5066);
CUDA C++ with inline PTX ``mma.sync.aligned.m8n8k4`` reaches them, compiled at first use by
NVRTC (``volta_core.kernel_api.load_cuda_kernel``). This kernel proves that toolkit: the SM70
gate (``volta_devkit.cuda_gate``) finds ``HMMA.884`` in its sm_70 SASS on a machine without a
GPU, and the GPU test runs the same source on the H100, built for sm_90 (where m8n8k4 is
emulated) and from its compute_70 PTX JIT-compiled by the driver.

``C[M, N] = A[M, K] @ W[N, K]^T`` with fp16 inputs and fp32 accumulation and output, the
layout of a linear layer. A block of four warps computes a 32 x 32 tile; each warp a 16 x 16
piece of it with the four 8 x 8 x 4 products one ``mma.m8n8k4`` runs, one per quad pair of
lanes. Operands are read straight from global memory (no shared-memory staging): the kernel
shows the instruction, it is not tuned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from volta_core import CudaKernelConfig

if TYPE_CHECKING:
    import torch

KERNEL = "volta_mma_gemm_f16"

#: Threads per block (four warps) and the block's output tile edge.
BLOCK_THREADS = 128
TILE = 32

#: The grid's second dimension, which counts row tiles, stops at 65535 blocks (CUDA C++
#: Programming Guide, "Compute Capabilities" table).
MAX_GRID_Y = 65535

# Fragment layouts are those of the PTX ISA, "Matrix Fragments for mma.m8n8k4 with .f16
# floating point type": A row-major, B column-major, fp32 C/D. fp16 values travel as their raw
# 16 bits, so the source needs no header (NVRTC ships no cuda_fp16.h by default).
SOURCE = r"""
// Four fp16 of `row` from column k0 on, packed low to high into two .f16x2 registers; zero past
// the matrix edge (fp16 +0 is the bit pattern 0).
__device__ __forceinline__ void load_fragment(
    const unsigned short* __restrict__ p, int row, int rows, int k0, int k, int ld,
    unsigned int out[2]) {
  unsigned int v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = (row < rows && k0 + i < k) ? p[(long long)row * ld + k0 + i] : 0u;
  }
  out[0] = v[0] | (v[1] << 16);
  out[1] = v[2] | (v[3] << 16);
}

extern "C" __global__ void __launch_bounds__(128) volta_mma_gemm_f16(
    const unsigned short* __restrict__ a, const unsigned short* __restrict__ w,
    float* __restrict__ c, int m, int n, int k, int lda, int ldw, int ldc) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  // Lanes 0-3 with 16-19 run product 0, 4-7 with 20-23 product 1, and so on.
  const int pair = (lane >> 2) & 3;
  const int high = lane >> 4;
  const int row0 = blockIdx.y * 32 + (warp >> 1) * 16 + (pair >> 1) * 8;
  const int col0 = blockIdx.x * 32 + (warp & 1) * 16 + (pair & 1) * 8;
  // The row of A and the column of B (a row of W) this lane holds.
  const int own = (lane & 3) + high * 4;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < k; k0 += 4) {
    unsigned int fa[2], fb[2];
    load_fragment(a, row0 + own, m, k0, k, lda, fa);
    load_fragment(w, col0 + own, n, k0, k, ldw, fb);
    asm("mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9}, {%10, %11}, "
        "{%0, %1, %2, %3, %4, %5, %6, %7};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]),
          "+f"(acc[4]), "+f"(acc[5]), "+f"(acc[6]), "+f"(acc[7])
        : "r"(fa[0]), "r"(fa[1]), "r"(fb[0]), "r"(fb[1]));
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = row0 + (lane & 1) + (i & 2) + high * 4;
    const int col = col0 + (i & 4) + (lane & 2) + (i & 1);
    if (row < m && col < n) c[(long long)row * ldc + col] = acc[i];
  }
}
"""


def mma_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    ptx_arch: str | None = None,
) -> torch.Tensor:
    """``a @ w.T`` in fp32 for fp16 ``a`` [M, K] and ``w`` [N, K] on one CUDA device.

    :param out: a contiguous fp32 [M, N] tensor to write into; a new one if None.
    :param ptx_arch: build PTX for this architecture (``"compute_70"``) and let the driver
        JIT-compile it, instead of a cubin for the device's own architecture.
    :raises ValueError: naming the offending argument, before any launch.
    """
    import torch

    from volta_core.kernel_api import load_cuda_kernel

    if a.dim() != 2 or w.dim() != 2:
        raise ValueError(f"a and w must be 2-D, got {tuple(a.shape)} and {tuple(w.shape)}")
    if a.dtype != torch.float16 or w.dtype != torch.float16:
        raise ValueError(f"a and w must be float16, got {a.dtype} and {w.dtype}")
    if a.shape[1] != w.shape[1]:
        raise ValueError(f"a [M, K] and w [N, K] must share K, got {a.shape[1]} and {w.shape[1]}")
    if a.device != w.device or a.device.type != "cuda":
        raise ValueError(f"a and w must be on one CUDA device, got {a.device} and {w.device}")
    if (a.shape[1] > 1 and a.stride(1) != 1) or (w.shape[1] > 1 and w.stride(1) != 1):
        raise ValueError("a and w must be contiguous along K")
    if max(*a.shape, *w.shape, a.stride(0), w.stride(0)) >= 2**31:
        raise ValueError("sizes and strides must fit 32-bit ints")
    if _cdiv(a.shape[0], TILE) > MAX_GRID_Y:
        raise ValueError(f"at most {MAX_GRID_Y * TILE} rows of a, got {a.shape[0]}")
    m, k = a.shape
    n = w.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=torch.float32, device=a.device)
    elif out.shape != (m, n) or out.dtype != torch.float32 or out.device != a.device:
        raise ValueError(
            f"out must be float32 [{m}, {n}] on {a.device}, got {out.dtype} "
            f"{list(out.shape)} on {out.device}"
        )
    elif not out.is_contiguous():
        raise ValueError("out must be contiguous")
    if out.numel() == 0:
        return out
    kernel = load_cuda_kernel(SOURCE, KERNEL, device=a.device, ptx_arch=ptx_arch)
    kernel.launch(
        (_cdiv(n, TILE), _cdiv(m, TILE)), BLOCK_THREADS,
        a, w, out, m, n, k, max(a.stride(0), 1), max(w.stride(0), 1), n,
    )  # fmt: skip
    return out


def _cdiv(x: int, y: int) -> int:
    """``ceil(x / y)`` for positive ``y``."""
    return -(-x // y)


def mma_gemm_reference(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The float64 reference the kernel is checked against."""
    return a.double() @ w.double().T


def sm70_gate_configs() -> list[CudaKernelConfig]:
    """The configuration a V100 would build: one source, one launch shape."""
    return [
        CudaKernelConfig(
            name="mma_gemm_f16",
            source=SOURCE,
            kernel=KERNEL,
            block_threads=BLOCK_THREADS,
            claims_tensor_cores=True,
        )
    ]
