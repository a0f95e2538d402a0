// The SM70 CUDA prelude: the device helpers the plugins' Volta CUDA C++ kernels share, defined
// once. volta_core.kernel_api.with_prelude puts this text in front of a kernel's source, then
// `#line 1`, so NVRTC's error lines still count the kernel file's own lines; a kernel source
// defines none of these names itself. Inline PTX and CUDA built-ins (atomics, fences, barriers)
// only, no #include: NVRTC has no include path.
// The mma is `asm volatile`, so the compiler never drops or merges the warp-wide .sync
// instruction; the other asm helpers are pure functions of their operands and stay plain `asm`.

#ifndef VOLTA_SM70_PRELUDE_CUH
#define VOLTA_SM70_PRELUDE_CUH

// Unsigned 8/16/32-bit integers, the .u8/.u16/.u32 of "h" and "r" asm operands (PTX ISA, "Fundamental Types").
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

// d += A.B: A row-major (a0, a1), B column-major (b0, b1), f16 in, f32 d (PTX ISA, "Matrix Fragments for mma.m8n8k4 with .f16 floating point type").
__device__ __forceinline__ void mma_m8n8k4(float (&d)[8], u32 a0, u32 a1, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9}, {%10, %11}, "
      "{%0, %1, %2, %3, %4, %5, %6, %7};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a0), "r"(a1), "r"(b0), "r"(b1));
}

// Two floats as an f16 pair, lo in bits 0-15, each rounded to nearest even (PTX ISA, "cvt", .rn).
__device__ __forceinline__ u32 pack_half2(float lo, float hi) {
  u16 a, b;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(a) : "f"(lo));
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(hi));
  return (u32)a | ((u32)b << 16);
}

// 2^x, approximate, denormal results flushed to zero: one MUFU.EX2, no range fix-up (PTX ISA, "ex2").
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// An f16 (its bits) as a float, exactly (PTX ISA, "cvt").
__device__ __forceinline__ float h2f(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// Split-K's serial reduction, in the launch that computes the splits: CUTLASS's serial split-K
// (kSplitKSerial, cutlass/gemm/kernel/gemm.h: one semaphore word per output tile, a block's
// writes fenced before one of its threads signals, and the tile's final partition resets the
// word to zero for subsequent grids), without the turn-taking: each of the gridDim.z splits
// adds its fp32 partial tile atomically, in any order, into accumulators that are zero, then
// arrives once on the tile's counter; the block that arrives last (it reads gridDim.z - 1)
// reads the sums, writes zeros back, writes the output and resets the counter. Counters and
// accumulators are zero again after every launch (volta_core.kernel_api.arrival_counters,
// zeroed_accumulators), so the next one, a CUDA graph replay included, needs no memset.

// A block's arrival on counter `tile` once its threads' atomic adds are issued: fence, barrier,
// one atomic increment by thread 0, published to the block through `last` (a __shared__ int).
// True in the last block to arrive, after a fence, so that its reads follow every split's adds.
__device__ __forceinline__ bool splitk_arrive(int* counters, int tile, int& last) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[tile], 1) == (int)gridDim.z - 1;
  __syncthreads();
  if (!last) return false;
  __threadfence();
  return true;
}

// The split-K epilogue of a block of mma_m8n8k4 products, on a grid of (token blocks, output
// blocks, splits): output tile blockIdx.y * gridDim.x + blockIdx.x, split blockIdx.z. The
// fragments are laid out as both GEMMs lay them out: a warp's four quad pairs (lanes 4p..4p+3
// with 4p+16..4p+19) take outputs 8p..8p+7 of each of kGroups groups of 32 from n_warp on, for
// kBlocks blocks of 8 tokens from tok0 on; accumulator i of a lane is token (lane & 1) + (i & 2)
// + 4 * (lane >> 4) of its 8-token block and output (i & 4) + (lane & 2) + (i & 1) of its pair's
// 8 (PTX ISA, "Matrix Fragments for mma.m8n8k4", the f32 accumulators), so i and i + 1 (i even)
// are adjacent outputs of one token. With more than one split the splits sum into ws [m, n] by
// the rule above (the sums read with atomicExch, which puts the zeros back) and every block but
// the tile's last returns. Then each adjacent pair of outputs inside [m, n] gets the bias added
// (fp16 [n], or none when null) and store(tok, col, v0, v1, ok0, ok1) writes it: outputs col and
// col + 1 of token tok, okX false for one at or past n. A kernel calls this as its last
// statement. (The template parameters are not named J or TB: kernels build with -DJ.)
template <int kGroups, int kBlocks, typename Store>
__device__ __forceinline__ void splitk_mma_epilogue(const float (&acc)[kGroups][kBlocks][8],
                                                    float* ws, int* counters, int& last,
                                                    const u16* bias, int m, int n, int tok0,
                                                    int n_warp, Store store) {
  const int lane = threadIdx.x & 31;
  const int pair = (lane >> 2) & 3;
  const bool split = gridDim.z > 1;
  const int tile = blockIdx.y * gridDim.x + blockIdx.x;
  if (split) {
#pragma unroll
    for (int j = 0; j < kGroups; ++j)
#pragma unroll
      for (int b = 0; b < kBlocks; ++b)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int tok = tok0 + b * 8 + (lane & 1) + (i & 2) + ((lane >> 4) << 2);
          const int col = n_warp + j * 32 + pair * 8 + (i & 4) + (lane & 2) + (i & 1);
          if (tok < m && col < n) atomicAdd(&ws[tok * n + col], acc[j][b][i]);
        }
    if (!splitk_arrive(counters, tile, last)) return;
  }
#pragma unroll
  for (int j = 0; j < kGroups; ++j)
#pragma unroll
    for (int b = 0; b < kBlocks; ++b)
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const int tok = tok0 + b * 8 + (lane & 1) + (i & 2) + ((lane >> 4) << 2);
        const int col = n_warp + j * 32 + pair * 8 + (i & 4) + (lane & 2);
        if (tok >= m) continue;
        float v0 = acc[j][b][i], v1 = acc[j][b][i + 1];
        const bool ok0 = col < n, ok1 = col + 1 < n;
        if (split) {
          if (ok0) v0 = atomicExch(&ws[tok * n + col], 0.f);
          if (ok1) v1 = atomicExch(&ws[tok * n + col + 1], 0.f);
        }
        if (bias != nullptr) {
          if (ok0) v0 += h2f(bias[col]);
          if (ok1) v1 += h2f(bias[col + 1]);
        }
        store(tok, col, v0, v1, ok0, ok1);
      }
  if (split && threadIdx.x == 0) counters[tile] = 0;
}

#endif  // VOLTA_SM70_PRELUDE_CUH
