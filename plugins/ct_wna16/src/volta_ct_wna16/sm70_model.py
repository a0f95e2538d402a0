"""The SM70 time model: how long a V100 needs at least for one product on each path.

No V100 is at hand, so choices that depend on its speed, and the benchmark's SM70 column, use
this model rather than a measurement. Each path takes the larger of its bytes at the V100's
900 GB/s and its arithmetic at the rate of the units it runs on (NVIDIA Tesla V100 GPU
Architecture whitepaper: 125 TFLOP/s on tensor cores, 15.7 TFLOP/s fp32 FMA):

* the tensor-core GEMM (:mod:`volta_ct_wna16.cuda`, ``HMMA`` in its sm_70 SASS, proven by the
  compile gate): the products its blocks run, tokens padded to the block's rows, outputs to
  its columns and inputs to its k-tile, at 125 TFLOP/s. Split-K atomics are not counted (at
  most a few percent of the bytes);
* the Triton dot and FMA paths: the product at 15.7 TFLOP/s (``tl.dot`` runs on the FMA units
  on SM70, triton-lang/triton#5066);
* dequantize-then-cuBLAS: the dequantization writes ``dequant(W).T`` in fp16 and cuBLAS reads it
  back, its product at 125 TFLOP/s.

Bytes are the weights as the path reads them (``weight_bytes``: packed words, scales, zero
points), the activations and the fp16 output. Torch-free: the tables choose with it.
"""

from __future__ import annotations

from volta_ct_wna16.launch import DEQUANT_MATMUL, MMA, Launch, mma_k_tile

#: V100 (SXM2) figures, from NVIDIA's Tesla V100 GPU Architecture whitepaper.
V100_BANDWIDTH = 900e9
V100_FMA_FLOPS = 15.7e12
V100_TENSOR_FLOPS = 125e12


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def io_bytes(m: int, n: int, k: int) -> int:
    """fp16 activations read and fp16 outputs written."""
    return 2 * m * k + 2 * m * n


def fma_seconds(m: int, n: int, k: int, weight_bytes: int) -> float:
    """A Triton path (dot tile, FMA tile or GEMV): bytes, or the product on the FMA units."""
    return max((weight_bytes + io_bytes(m, n, k)) / V100_BANDWIDTH, 2 * m * n * k / V100_FMA_FLOPS)


def dequant_cublas_seconds(m: int, n: int, k: int, weight_bytes: int) -> float:
    """Dequantize (read the weights, write ``n * k`` fp16), then cuBLAS on tensor cores."""
    dequant = (weight_bytes + 2 * n * k) / V100_BANDWIDTH
    gemm = max((2 * n * k + io_bytes(m, n, k)) / V100_BANDWIDTH, 2 * m * n * k / V100_TENSOR_FLOPS)
    return dequant + gemm


def mma_flops(m: int, n: int, k: int, launch: Launch, bits: int) -> int:
    """The floating-point operations the tensor-core GEMM's blocks run (padding included)."""
    rows = _cdiv(m, launch.block_m) * launch.block_m
    cols = _cdiv(n, launch.block_n) * launch.block_n
    inputs = _cdiv(k, mma_k_tile(bits)) * mma_k_tile(bits)
    return 2 * rows * cols * inputs


def mma_seconds(m: int, n: int, k: int, launch: Launch, bits: int, weight_bytes: int) -> float:
    """The tensor-core GEMM: bytes, or its padded product at the tensor-core rate."""
    return max(
        (weight_bytes + io_bytes(m, n, k)) / V100_BANDWIDTH,
        mma_flops(m, n, k, launch, bits) / V100_TENSOR_FLOPS,
    )


def seconds(m: int, n: int, k: int, launch: Launch, bits: int, weight_bytes: int) -> float:
    """The model's time for ``launch`` (any path) on an ``n x k`` layer at ``m`` tokens."""
    if launch.path == MMA:
        return mma_seconds(m, n, k, launch, bits, weight_bytes)
    if launch.path == DEQUANT_MATMUL:
        return dequant_cublas_seconds(m, n, k, weight_bytes)
    return fma_seconds(m, n, k, weight_bytes)
