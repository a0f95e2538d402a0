// The fused-MoE decode step in one launch, for 4-bit experts and fp16 activations:
//   out[t] = sum_s r[t, s] * W2_e . (SiLU(G_e . x[t]) * (U_e . x[t])),  e = the slot's expert,
// with no program waiting on another. Block (p, jb) takes pair p = t * top_k + s and BJ
// intermediate rows jb * BJ ..: it computes those gate and up rows over the whole input, their
// SiLU product in registers, multiplies it at once by the matching BJ input columns of down and
// adds its [hidden] partial (times the router weight) atomically into the token's fp32 row of
// acc. Down is linear in its input, so the blocks' partials simply add. The token's last block
// to arrive (CUTLASS's serial split-K arrival: fence, barrier, one atomic increment) reads the
// row with atomicExch, which puts the zeros back, stores it in fp16 and resets the counter, so
// a CUDA-graph replay needs no memset.
//
// Build options (-D): HAS_ZP 0/1 (asymmetric zero points), HAS_MAP 0/1 (an expert map),
// MUL_INPUT 0/1 (the router weight scales the input, else the output), G13 and G2 the group
// sizes of gate/up and down (0: one group over the whole input), BJ intermediate rows per block
// (16 or 32), WARPS warps per block, U word rows per lane per batch (its loads issued together).
//
// Weights as volta_ct_wna16.layout prepares them, stacked per expert: w int32 [KW, N] (word kw
// of output n holds inputs 8 kw .. 8 kw + 7 at bits 4 j, offset by 8), scales fp16 [groups, N],
// zero points fp16 [groups, N] (stored values) with HAS_ZP. Gate/up is N = 2 * inter outputs
// over K = hidden inputs, down N = hidden over K = inter.
//
// Per 4-bit weight one LOP3, one subtraction and one fp32 FMA, exact: the field at bits
// OFF .. OFF + 3 of a word, with the fp32 exponent 150 - OFF ORed over it, reads as
// 2^(23 - OFF) + q, so subtracting 2^(23 - OFF) + 8 gives q - 8 (the fields above bit 19 are
// taken from a copy shifted down by 12). Threads own 4 consecutive outputs (one 16-byte load per
// word row) and a lane of word rows; the activations, staged as fp32 in shared memory, serve
// the 4 outputs from one broadcast read.

#if !defined(HAS_ZP) || !defined(HAS_MAP) || !defined(MUL_INPUT) || !defined(G13) || \
    !defined(G2) || !defined(BJ) || !defined(WARPS) || !defined(U)
#error "build with -DHAS_ZP -DHAS_MAP -DMUL_INPUT -DG13 -DG2 -DBJ -DWARPS -DU"
#endif

#define THREADS (WARPS * 32)
// Gate/up: 2 * BJ outputs in quads, the rest of the block's threads along the input.
#define QUADS13 (2 * BJ / 4)
#define LANES (THREADS / QUADS13)
#define ROWS2 (BJ / 8)
// The scale row of word row kw: a division by a constant (a multiply), none for one group.
#define GROUP_OF(kw, G) ((G) ? 8u * (unsigned)(kw) / (unsigned)(G) : 0u)

typedef unsigned int u32;
typedef unsigned short u16;

#if THREADS % QUADS13 != 0 || BJ % 8 != 0
#error "a block's threads must cover its gate/up quads whole, and BJ be whole words of down"
#endif

__device__ __forceinline__ float h2f(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ u16 f2h(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// (a & MASK) | c in one LOP3. Written in C, the AND's and the OR's constants take two LOP3s (one
// holds a single immediate); here c is a register the block keeps.
template <u32 MASK>
__device__ __forceinline__ u32 and_or(u32 a, u32 c) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(MASK), "r"(c));
  return d;
}

// The exponent registers: ex[i] = (150 - 4 i) << 23 for the fields at bits 4 i (i = 0..4).
struct Exps {
  u32 e[5];
};

// q - ZC of the field at bits 4 I of v, exactly (ZC 8 for symmetric weights, 0 with HAS_ZP).
template <int I>
__device__ __forceinline__ float field(u32 v, const Exps& ex) {
  const float base = (float)(1u << (23 - 4 * I)) + (HAS_ZP ? 0.0f : 8.0f);
  return __uint_as_float(and_or<0xFu << (4 * I)>(v, ex.e[I])) - base;
}

// sum_j x_j * (q_j - ZC) over one word's 8 inputs.
__device__ __forceinline__ float word_dot(u32 w, const float (&x)[8], const Exps& ex) {
  const u32 hi = w >> 12;
  float p = x[0] * field<0>(w, ex);
  p = fmaf(x[1], field<1>(w, ex), p);
  p = fmaf(x[2], field<2>(w, ex), p);
  p = fmaf(x[3], field<3>(w, ex), p);
  p = fmaf(x[4], field<4>(w, ex), p);
  p = fmaf(x[5], field<2>(hi, ex), p);
  p = fmaf(x[6], field<3>(hi, ex), p);
  p = fmaf(x[7], field<4>(hi, ex), p);
  return p;
}

__device__ __forceinline__ void load8(const float* s, float (&x)[8]) {
  const float4 a = reinterpret_cast<const float4*>(s)[0];
  const float4 b = reinterpret_cast<const float4*>(s)[1];
  x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
  x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
}

__device__ __forceinline__ uint4 ldg4(const u32* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// Four fp16 values (scales or zero points) of consecutive outputs, as loaded, to fp32.
__device__ __forceinline__ void h4(const uint2 r, float (&v)[4]) {
  v[0] = h2f((u16)(r.x & 0xFFFFu));
  v[1] = h2f((u16)(r.x >> 16));
  v[2] = h2f((u16)(r.y & 0xFFFFu));
  v[3] = h2f((u16)(r.y >> 16));
}

__device__ __forceinline__ uint2 ldg_h4(const u16* p) {
  return __ldg(reinterpret_cast<const uint2*>(p));
}

// One word row of 4 outputs as loaded: the words, their scales and (HAS_ZP) zero points.
struct Row {
  uint4 w;
  uint2 s;
  uint2 z;
};

__device__ __forceinline__ Row load_row(const u32* w, const u16* s, const u16* z) {
  Row r;
  r.w = ldg4(w);
  r.s = ldg_h4(s);
#if HAS_ZP
  r.z = ldg_h4(z);
#else
  r.z = make_uint2(0u, 0u);
#endif
  return r;
}

// acc[c] += s[c] * (sum over the word of output c) for one word row of 4 outputs; z[c] * sum(x)
// removed first with HAS_ZP.
__device__ __forceinline__ void row_dot(const Row& row, const float (&x)[8], const Exps& ex,
                                        float (&acc)[4]) {
  float p[4];
  p[0] = word_dot(row.w.x, x, ex);
  p[1] = word_dot(row.w.y, x, ex);
  p[2] = word_dot(row.w.z, x, ex);
  p[3] = word_dot(row.w.w, x, ex);
#if HAS_ZP
  float z[4];
  h4(row.z, z);
  const float xs = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
#pragma unroll
  for (int c = 0; c < 4; ++c) p[c] = fmaf(-z[c], xs, p[c]);
#endif
  float s[4];
  h4(row.s, s);
#pragma unroll
  for (int c = 0; c < 4; ++c) acc[c] = fmaf(p[c], s[c], acc[c]);
}

extern "C" __global__ void __launch_bounds__(THREADS)
moe_decode_cuda(const u16* __restrict__ x, const u32* __restrict__ w13,
                const u16* __restrict__ s13, const u16* __restrict__ z13,
                const u32* __restrict__ w2, const u16* __restrict__ s2,
                const u16* __restrict__ z2, u16* __restrict__ out,
                const float* __restrict__ rw, const int* __restrict__ ids,
                const int* __restrict__ emap, float* __restrict__ acc,
                unsigned* __restrict__ counters, int pairs, int hidden, int inter, int experts,
                int top_k, int stride_xm, int stride_om, int stride_w13e, int stride_s13e,
                int stride_w2e, int stride_s2e) {
  extern __shared__ float4 xs4[];  // the token's activations, fp32 [hidden]
  __shared__ float red[LANES * 2 * BJ];
  __shared__ float act[BJ];
  __shared__ int last;
  float* xs = reinterpret_cast<float*>(xs4);

  const int tid = threadIdx.x;
  const int p = blockIdx.x;
  const int t = p / top_k;
  const int j0 = blockIdx.y * BJ;
  const int n13 = 2 * inter;
  const int kw13 = hidden / 8;

  int e = ids[p];
#if HAS_MAP
  e = e >= 0 ? emap[e] : -1;
#endif
  e = (e >= 0 && e < experts) ? e : -1;
  float* acc_row = acc + (size_t)t * hidden;

  if (e >= 0) {
    // Loop-invariant exponents from a value the compiler cannot fold, so that each field's AND
    // and OR stay one LOP3 (and_or).
    const u32 live = (u32)(hidden > 0);
    Exps ex;
#pragma unroll
    for (int i = 0; i < 5; ++i) ex.e[i] = live * ((150u - 4u * i) << 23);

    const u32* w13e = w13 + (size_t)e * stride_w13e;
    const u16* s13e = s13 + (size_t)e * stride_s13e;
    const u16* z13e = HAS_ZP ? z13 + (size_t)e * stride_s13e : z13;
    const u32* w2e = w2 + (size_t)e * stride_w2e;
    const u16* s2e = s2 + (size_t)e * stride_s2e;
    const u16* z2e = HAS_ZP ? z2 + (size_t)e * stride_s2e : z2;

    // Down's first rows, loaded now so that they arrive while gate/up computes.
    const int quads2 = hidden / 4;
    Row d0[ROWS2];
#pragma unroll
    for (int r = 0; r < ROWS2; ++r) {
      const int kw = j0 / 8 + r;
      const size_t g = (size_t)GROUP_OF(kw, G2) * hidden + 4 * tid;
      d0[r] = tid < quads2 ? load_row(w2e + (size_t)kw * hidden + 4 * tid, s2e + g, z2e + g)
                           : Row{};
    }

    // Gate/up: quad q's 4 outputs (gate's, then up's), lane l's word rows U at a time, the
    // next U rows loaded before these are used.
    const int q = tid % QUADS13;
    const int lane = tid / QUADS13;
    const int col = (q < QUADS13 / 2 ? 0 : inter) + j0 + 4 * (q % (QUADS13 / 2));
    Row cur[U];
    int b0 = lane * U;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kw = b0 + u;
      const size_t g = (size_t)GROUP_OF(kw, G13) * n13 + col;
      cur[u] = kw < kw13 ? load_row(w13e + (size_t)kw * n13 + col, s13e + g, z13e + g) : Row{};
    }

    // The token's activations into shared memory as fp32.
    const uint4* xrow = reinterpret_cast<const uint4*>(x + (size_t)t * stride_xm);
    for (int i = tid; i < kw13; i += THREADS) {
      const uint4 v = __ldg(xrow + i);
      const u32 h[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        xs[8 * i + 2 * c] = h2f((u16)(h[c] & 0xFFFFu));
        xs[8 * i + 2 * c + 1] = h2f((u16)(h[c] >> 16));
      }
    }
    __syncthreads();

    float a13[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (; b0 < kw13; b0 += LANES * U) {
      Row nxt[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kw = b0 + LANES * U + u;
        const size_t g = (size_t)GROUP_OF(kw, G13) * n13 + col;
        nxt[u] = kw < kw13 ? load_row(w13e + (size_t)kw * n13 + col, s13e + g, z13e + g)
                           : Row{};
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (b0 + u < kw13) {
          float xv[8];
          load8(xs + 8 * (b0 + u), xv);
          row_dot(cur[u], xv, ex, a13);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) cur[u] = nxt[u];
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) red[lane * 2 * BJ + 4 * q + c] = a13[c];
    __syncthreads();

    // The block's SiLU products: gate row j and up row j summed over the lanes.
    const float r = rw[p];
    if (tid < BJ) {
      float g = 0.0f, u = 0.0f;
      for (int l = 0; l < LANES; ++l) {
        g += red[l * 2 * BJ + tid];
        u += red[l * 2 * BJ + BJ + tid];
      }
#if MUL_INPUT
      g *= r;
      u *= r;
#endif
      act[tid] = g / (1.0f + __expf(-g)) * u;
    }
    __syncthreads();

    // Down: 4 outputs a thread, the block's BJ inputs (ROWS2 word rows), added into acc.
    const float out_scale = MUL_INPUT ? 1.0f : r;
    for (int q2 = tid; q2 < quads2; q2 += THREADS) {
      float a2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int rr = 0; rr < ROWS2; ++rr) {
        const int kw = j0 / 8 + rr;
        const size_t g = (size_t)GROUP_OF(kw, G2) * hidden + 4 * q2;
        const Row row =
            q2 == tid ? d0[rr] : load_row(w2e + (size_t)kw * hidden + 4 * q2, s2e + g, z2e + g);
        float xv[8];
        load8(act + 8 * rr, xv);
        row_dot(row, xv, ex, a2);
      }
      float* dst = acc_row + 4 * q2;
#if __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float4*>(dst),
                make_float4(a2[0] * out_scale, a2[1] * out_scale, a2[2] * out_scale,
                            a2[3] * out_scale));
#else
#pragma unroll
      for (int c = 0; c < 4; ++c) atomicAdd(dst + c, a2[c] * out_scale);
#endif
    }
  }

  // Arrival: the token's last block takes the sums.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned total = (unsigned)top_k * gridDim.y;
    last = atomicAdd(counters + t, 1u) == total - 1u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  u16* out_row = out + (size_t)t * stride_om;
  for (int n = tid; n < hidden; n += THREADS) out_row[n] = f2h(atomicExch(acc_row + n, 0.0f));
  if (tid == 0) atomicExch(counters + t, 0u);
}
