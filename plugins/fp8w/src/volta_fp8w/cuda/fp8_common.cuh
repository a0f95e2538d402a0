// Shared by the W8A16 tensor-core GEMMs (fp8_mma.cu, the dense layers; fp8_moe_mma.cu, the
// routed experts): the build options' derived sizes, the registers one k-tile loads and the
// products of one k-tile with their scale flush. fp8_mma.cu's header says how the fragments,
// the decode and the scales work. The loader (volta_fp8w.cuda) puts this text after the host's
// SM70 prelude (u8/u16/u32, mma_m8n8k4, pack_half2) and fp8_decode.cuh, and before a kernel
// file.

#if !defined(BM) || !defined(WARPS) || !defined(J) || !defined(BK) || !defined(MIN_BLOCKS)
#error "build with -DBM -DWARPS -DJ -DBK -DMIN_BLOCKS"
#endif
#if BM % 8 || (BK != 32 && BK != 64 && BK != 128)
#error "BM is a multiple of 8 and BK one of 32, 64, 128"
#endif

#define THREADS (WARPS * 32)
#define TB (BM / 8)
// m8n8k4 products of one k-tile per (row block, output group); 16-byte weight loads of a lane
// per output group and k-tile.
#define STEPS (BK / 4)
#define CHUNKS (BK / 16)
// Rows of staged activations are padded by 8 halves (16 bytes), so the 8 token rows one
// fragment read touches start in different bank pairs.
#define XS_LD (BK + 8)
#define XVECS (BM * BK / 8)
#define XV_PER_THREAD ((XVECS + THREADS - 1) / THREADS)

// 16 bytes of a row that is not 16-byte aligned (an input length not a multiple of 16), byte by
// byte, those at or past `left` (the inputs left in the row) not loaded (zero).
__device__ __noinline__ uint4 bytes16(const u8* p, int left) {
  u32 v[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 16; ++i)
    if (i < left) v[i >> 2] |= (u32)p[i] << (8 * (i & 3));
  return make_uint4(v[0], v[1], v[2], v[3]);
}

// What one k-tile needs from global memory, held in registers while the previous tile computes:
// the lane's weight bytes, the activations it stages and, when the tile ends a scale block, the
// scales (times 2^8) of its four accumulator columns.
struct Tile {
  uint4 w[J][CHUNKS];
  float s[J][4];
  uint4 xv[XV_PER_THREAD];
  bool flush;
};

// The lane's weight bytes of the tile at input k0, one row per output group (16-byte chunks at
// or past k not loaded; with K a multiple of 16 a chunk is all in or all out). Rows past the
// layer's outputs are not loaded: their bytes keep earlier (finite) values, which reach only
// their own outputs, and those are not stored.
__device__ __forceinline__ void load_weights(Tile& t, const u8* const (&w_row)[J],
                                             const bool (&col_ok)[J], int k0, int k,
                                             int aligned) {
#pragma unroll
  for (int j = 0; j < J; ++j) {
    if (!col_ok[j]) continue;
    const u8* row = w_row[j] + k0;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int left = k - k0 - 16 * c;
      if (left <= 0) continue;
      t.w[j][c] =
          aligned ? *reinterpret_cast<const uint4*>(row + 16 * c) : bytes16(row + 16 * c, left);
    }
  }
}

// The scales (times 2^8) of the lane's four accumulator columns per group in scale column kb:
// s_row holds each column's first scale of its block row, -1 past the outputs (scale 0).
__device__ __forceinline__ void load_scales(Tile& t, const float* s, const int (&s_row)[J][4],
                                            int kb) {
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) t.s[j][q] = s_row[j][q] >= 0 ? s[s_row[j][q] + kb] * 256.f : 0.f;
}

// The products of one k-tile: each 4-input step decodes the lane's 4 codes of every group into
// B fragments and multiplies them by every 8-row block of the staged activations (xrow: the
// lane's row `own` of the buffer), into the unscaled partial sums; where the tile ends a scale
// block the partials are added to the accumulators times their scales (one FFMA an output)
// and zeroed.
__device__ __forceinline__ void tile_products(const Tile& t, const u16* xrow,
                                              float (&part)[J][TB][8], float (&acc)[J][TB][8]) {
#pragma unroll
  for (int st = 0; st < STEPS; ++st) {
    u32 f[J][2];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const uint4 q = t.w[j][st / 4];
      const u32 word = st % 4 == 0 ? q.x : st % 4 == 1 ? q.y : st % 4 == 2 ? q.z : q.w;
      e4m3x4(word, f[j][0], f[j][1]);
    }
#pragma unroll
    for (int b = 0; b < TB; ++b) {
      const uint2 a = *reinterpret_cast<const uint2*>(xrow + b * 8 * XS_LD + st * 4);
#pragma unroll
      for (int j = 0; j < J; ++j) mma_m8n8k4(part[j][b], a.x, a.y, f[j][0], f[j][1]);
    }
  }
  if (t.flush) {
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int b = 0; b < TB; ++b)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          acc[j][b][i] = fmaf(part[j][b][i], t.s[j][(i & 1) + ((i & 4) >> 1)], acc[j][b][i]);
          part[j][b][i] = 0.f;
        }
  }
}
