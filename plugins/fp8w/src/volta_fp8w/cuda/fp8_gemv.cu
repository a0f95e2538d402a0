// out[i] = sum_j x[j] * e4m3(w[i, j]) * s[i / block_n, j / block_k] (+ bias[i]) for one token:
// the decode step's GEMV, bound by the weights' bytes (one a weight). Compiled behind
// volta_core.kernel_api.with_prelude (u8/u16/u32, h2f, splitk_arrive) and fp8_decode.cuh
// (e4m3x4).
//
// Build options (-D): WARPS warps a block; ROWS weight rows a warp; LOADS 16-byte loads of each
// row a lane issues before it uses them (LOADS * 512 inputs a warp step). A warp reads ROWS rows
// side by side, each lane 16 consecutive codes of every row per load (a warp's load of a row is
// 512 contiguous bytes, whole 32-byte sectors), decodes them in registers and multiplies them in
// fp32 by its 16 activations (fp16, read once a step for all ROWS rows); the row's scale block
// holds the lane's 16 inputs (block_k is a multiple of 32), so its scale is one FFMA per load,
// not per weight. After the last step a butterfly of shuffles sums the 32 lanes' partials; lane
// 0 stores the row (times 2^8, the decode's fold, plus the bias). The grid is (row blocks, 1,
// splits): split z reads inputs [z * per_split, (z + 1) * per_split), and with more than one
// the splits add their sums into ws and the last to arrive stores the rows (the prelude's
// serial split-K rule, splitk_arrive).
//
// The launcher (volta_fp8w.cuda.gemv) guarantees: k below 2^24; k, per_split, the weights' row
// stride and their and the activations' base addresses multiples of 16 bytes; the grid
// (ceil(n / (WARPS * ROWS)), 1, ceil(k / per_split)); ws and counters zero (with n and
// ceil(n / (WARPS * ROWS)) entries) where it splits.
// Rows past n read row n - 1 and are not stored. A float's products and sums are fp32, never
// fp16 (an fp16 sum of products can overflow where the fp32 one does not).

#if !defined(WARPS) || !defined(ROWS) || !defined(LOADS)
#error "build with -DWARPS -DROWS -DLOADS"
#endif

// Inputs one warp's load of a row covers: 32 lanes of 16 codes.
#define WARP_INPUTS 512

// 16 bytes the kernel reads once: not kept in L1 (the weights stream through; PTX ISA, "ld",
// .nc and L1::no_allocate).
__device__ __forceinline__ uint4 load_stream(const u8* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// sum_i x[i] * 2^-8 * e4m3(code i of q), the 16 codes of one load against their activations.
__device__ __forceinline__ float products16(const uint4 q, const float (&x)[16]) {
  const u32 words[4] = {q.x, q.y, q.z, q.w};
  float p = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    u32 lo, hi;
    e4m3x4(words[i], lo, hi);
    p = fmaf(h2f((u16)(lo & 0xFFFFu)), x[4 * i], p);
    p = fmaf(h2f((u16)(lo >> 16)), x[4 * i + 1], p);
    p = fmaf(h2f((u16)(hi & 0xFFFFu)), x[4 * i + 2], p);
    p = fmaf(h2f((u16)(hi >> 16)), x[4 * i + 3], p);
  }
  return p;
}

// kk / block_k for an input kk that is a multiple of 16 below 2^24 and a block_k that is a
// multiple of 32, from inv_block_k = fl(1 / block_k): (kk + 8) / block_k is at least 8 / block_k
// from an integer, and the float product's error is below 2^-23 of it, under 2 / block_k, so
// truncation gives the exact quotient (three instructions where an integer division takes about
// twenty).
__device__ __forceinline__ int scale_column(int kk, float inv_block_k) {
  return (int)((float)(kk + 8) * inv_block_k);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32) fp8w_gemv(
    const u16* __restrict__ x, const u8* __restrict__ w, const float* __restrict__ s,
    const u16* __restrict__ bias, u16* __restrict__ out, float* ws, int* counters, int n, int k,
    int ldw, int lds_n, int lds_k, int block_n, float inv_block_k, int per_split) {
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * ROWS;
  const u8* w_row[ROWS];
  const float* s_row[ROWS];
  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = min(row0 + r, n - 1);
    w_row[r] = w + (size_t)row * ldw;
    s_row[r] = s + (row / block_n) * lds_n;
    acc[r] = 0.f;
  }
  const int k_begin = blockIdx.z * per_split;
  const int k_end = min(k, k_begin + per_split);
  for (int k0 = k_begin + lane * 16; k0 < k_end; k0 += LOADS * WARP_INPUTS) {
    uint4 q[LOADS][ROWS];
#pragma unroll
    for (int u = 0; u < LOADS; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
        q[u][r] = k0 + u * WARP_INPUTS < k_end ? load_stream(w_row[r] + k0 + u * WARP_INPUTS)
                                               : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int u = 0; u < LOADS; ++u) {
      const int kk = k0 + u * WARP_INPUTS;
      if (kk >= k_end) break;
      const uint4 xa = *reinterpret_cast<const uint4*>(x + kk);
      const uint4 xb = *reinterpret_cast<const uint4*>(x + kk + 8);
      const u32 pairs[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
      float xf[16];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        xf[2 * i] = h2f((u16)(pairs[i] & 0xFFFFu));
        xf[2 * i + 1] = h2f((u16)(pairs[i] >> 16));
      }
      const int kb = scale_column(kk, inv_block_k) * lds_k;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r] = fmaf(products16(q[u][r], xf), s_row[r][kb], acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], o);
  const bool split = gridDim.z > 1;
  if (split) {
    __shared__ int last;
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
      if (lane == 0 && row0 + r < n) atomicAdd(&ws[row0 + r], acc[r]);
    if (!splitk_arrive(counters, blockIdx.x, last)) return;
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
      if (lane == 0 && row0 + r < n) acc[r] = atomicExch(&ws[row0 + r], 0.f);
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = row0 + r;
    if (lane == 0 && row < n) {
      float v = acc[r] * 256.f;
      if (bias != nullptr) v += h2f(bias[row]);
      u16 h;
      asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
      out[row] = h;
    }
  }
  if (split && threadIdx.x == 0) counters[blockIdx.x] = 0;
}
