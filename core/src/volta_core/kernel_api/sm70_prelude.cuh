// The SM70 CUDA prelude: the device helpers the plugins' Volta CUDA C++ kernels share, defined
// once. volta_core.kernel_api.with_prelude puts this text in front of a kernel's source, then
// `#line 1`, so NVRTC's error lines still count the kernel file's own lines; a kernel source
// defines none of these names itself. Inline PTX only, no #include: NVRTC has no include path.
// The mma is `asm volatile`, so the compiler never drops or merges the warp-wide .sync
// instruction; the other helpers are pure functions of their operands and stay plain `asm`.

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

#endif  // VOLTA_SM70_PRELUDE_CUH
