// Shared by the tensor-core GEMMs (wna16_mma.cu, the dense layers; wna16_moe_mma.cu, the
// routed experts): the build options' derived sizes, fp16 pair arithmetic, the in-register
// dequantization of one packed word into B fragments, and the registers one k-tile loads.
// wna16_mma.cu's header says how the weights, fragments and fp16 conversion work. The loader
// (volta_ct_wna16.cuda) puts this text after the core's SM70 prelude and before a kernel file.
#if !defined(BITS) || !defined(HAS_ZP) || !defined(BM) || !defined(WARPS) || !defined(J)
#error "build with -DBITS -DHAS_ZP -DBM -DWARPS -DJ"
#endif

#define THREADS (WARPS * 32)
#define PACK (32 / BITS)
#define KW_TILE 4
#define BK (KW_TILE * PACK)
#define STEPS (PACK / 4)
#define TB (BM / 8)
#define BN (WARPS * 32 * J)
// Rows of staged activations are padded by 8 halves (16 bytes), so the 8 token rows one
// fragment read touches start in different bank pairs.
#define XS_LD (BK + 8)
#define XVECS (BM * BK / 8)
#define XV_PER_THREAD ((XVECS + THREADS - 1) / THREADS)

// u32, u16, mma_m8n8k4, h2f and splitk_mma_epilogue come from the core's SM70 prelude
// (volta_core/kernel_api/sm70_prelude.cuh), which the loader puts in front of this file.

// fp16 pair arithmetic with explicit rounding, which PTX never fuses into another operation.
__device__ __forceinline__ u32 hadd2(u32 a, u32 b) {
  u32 d;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
  u32 d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
  u32 d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
  u32 d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ u16 f2h(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// (a & MASK) | c in one LOP3. Written in C, the AND's and the OR's constants take two LOP3s (one
// holds a single immediate); here c is a register the loop keeps.
template <u32 MASK>
__device__ __forceinline__ u32 and_or(u32 a, u32 c) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(MASK), "r"(c));
  return d;
}

// One word's values as (q - z) * s, fp16 pairs in B-fragment order (2 * STEPS registers): q - z
// is exact, the product rounds once. zc holds 1024 + z, c16 -(64 + z) (both exact in fp16),
// ss the scale and ex 0x64006400 (1024), each in both halves.
__device__ __forceinline__ void dequant(u32 w, u32 zc, u32 c16, u32 ss, u32 ex,
                                        u32 (&f)[2 * STEPS]) {
#if BITS == 4
  const u32 w8 = w >> 8;
  const u32 sixteenth = 0x2C002C00u;  // (1024 + 16 q) / 16 - (64 + z) = q - z, exactly
  f[0] = hmul2(hsub2(and_or<0x000F000Fu>(w, ex), zc), ss);
  f[1] = hmul2(hfma2(and_or<0x00F000F0u>(w, ex), sixteenth, c16), ss);
  f[2] = hmul2(hsub2(and_or<0x000F000Fu>(w8, ex), zc), ss);
  f[3] = hmul2(hfma2(and_or<0x00F000F0u>(w8, ex), sixteenth, c16), ss);
#else
  f[0] = hmul2(hsub2(__byte_perm(w, ex, 0x5150), zc), ss);
  f[1] = hmul2(hsub2(__byte_perm(w, ex, 0x5352), zc), ss);
#endif
}

// What one k-tile needs from global memory, held in registers while the previous tile computes.
struct Tile {
  u32 w[KW_TILE][J];
  u32 s[J];
  u32 z[J];
  uint4 xv[XV_PER_THREAD];
};
