// out[M, N] = x[M, K] . W[N, K]^T (+ bias) on Volta's tensor cores, W an e4m3fn checkpoint's
// weights decoded in registers: inline PTX mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32
// (the prelude's mma_m8n8k4; PTX ISA, "Matrix multiply-accumulate operation using mma
// instruction", m8n8k4), fp32 accumulation, fp16 output. Compiled behind
// volta_core.kernel_api.with_prelude, which defines u8/u16/u32, mma_m8n8k4, pack_half2, h2f
// and splitk_mma_epilogue.
//
// Build options (-D): BM tokens per block (a multiple of 8); WARPS warps per block; J output
// groups of 32 per warp (a block covers BN = WARPS * 32 * J outputs); BK inputs per k-tile (32,
// 64 or 128), a divisor of the layer's scale block (the launcher checks); MIN_BLOCKS the blocks
// an SM must hold at once (__launch_bounds__: ptxas keeps the registers to that).
//
// Weights as volta_fp8w.layout prepares them: w uint8 [N, K], the e4m3fn codes, rows contiguous
// along K; s float32 [ceil(N / block_n), ceil(K / block_k)], W[i, j] = e4m3(w[i, j]) *
// s[i / block_n, j / block_k].
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m8n8k4 with .f16 floating point type"): the four
// quad pairs of a warp (lanes 4p..4p+3 with 4p+16..4p+19) each run one 8x8x4 product; lane
// `own` = (lane & 3) + 4 * (lane >> 4) of a pair holds row `own` of A (4 inputs) and column `own`
// of B (4 inputs). A is the activations (row = token), B the weights (column = output). Pair p
// takes outputs 8p..8p+7 of each group of 32, so lane (p, own) owns output 8p + own of each of
// its J groups, and a row of W is that column of B: one 16-byte load of the row is 16
// consecutive inputs of the column, the B fragments of 4 products, with no shared-memory staging
// (each lane reads BK contiguous bytes of its row per k-tile: whole 32-byte sectors). The pairs
// share the tokens, so the A fragment is the same for all four (a broadcast shared-memory read);
// the activations are staged through shared memory, double-buffered through registers (sm_70
// has no cp.async).
//
// e4m3fn to fp16 without a conversion instruction (SM70 has no FP8): the fp16 whose bits are
// ((c & 0x7F) << 7) | ((c & 0x80) << 8) is exactly 2^-8 times the value of every non-NaN code c,
// subnormals included (volta_fp8w.kernels.e4m3). A byte permute puts two codes of a word each in
// the high byte of a half over a zero low byte (c << 8); one right shift moves exponent and
// mantissa into place, the sign stays at bit 15. Every code decodes to a finite half (the NaN
// codes, refused at load, to +-1.875), so weights a lane does not load meet zero activations or
// reach only outputs that are not stored.
//
// Scales: a k-tile lies inside one scale block (BK divides block_k; splits start at whole
// tiles). The products of a block's tiles accumulate, unscaled, into a temporary fragment; after
// the block's last tile (or the split's) it is added to the accumulators times the block's scale
// times 2^8: one FFMA per output and block, never a multiply per weight. The accumulator of a
// lane holds outputs of other lanes' columns (below), so each lane loads the scales of its own
// four accumulator columns, with the tile that ends the block, one tile ahead.
//
// Split-K: blockIdx.z splits the input. With more than one split every block adds its fp32 tile
// atomically into zeroed accumulators ws [M, N]; the last block to arrive on the tile's counter
// (CUTLASS's serial split-K arrival: fence, barrier, one atomic increment) reads the sums with
// atomicExch, which puts the zeros back, adds the bias, stores fp16 and resets the counter, so
// the next launch (a CUDA graph replay) needs no memset: the prelude's splitk_mma_epilogue,
// which this kernel gives only its fp16 store.

#if !defined(BM) || !defined(WARPS) || !defined(J) || !defined(BK) || !defined(MIN_BLOCKS)
#error "build with -DBM -DWARPS -DJ -DBK -DMIN_BLOCKS"
#endif
#if BM % 8 || (BK != 32 && BK != 64 && BK != 128)
#error "BM is a multiple of 8 and BK one of 32, 64, 128"
#endif

#define THREADS (WARPS * 32)
#define TB (BM / 8)
#define BN (WARPS * 32 * J)
// m8n8k4 products of one k-tile per (row block, output group); 16-byte weight loads of a lane
// per output group and k-tile.
#define STEPS (BK / 4)
#define CHUNKS (BK / 16)
// Rows of staged activations are padded by 8 halves (16 bytes), so the 8 token rows one
// fragment read touches start in different bank pairs.
#define XS_LD (BK + 8)
#define XVECS (BM * BK / 8)
#define XV_PER_THREAD ((XVECS + THREADS - 1) / THREADS)

// A half's bits c << 8 (code c in the high byte over a zero one), two to a word, as the fp16
// pair 2^-8 times their values: exponent and mantissa move down one bit, the sign stays.
__device__ __forceinline__ u32 e4m3_pair(u32 a) {
  return ((a >> 1) & 0x3F803F80u) | (a & 0x80008000u);
}

// Codes 0..3 of w (byte i is code i) as fp16 pairs: lo = (code 0, code 1), hi = (code 2, code
// 3), the inputs' order, each half 2^-8 times its code's value. Selector nibble i names the
// source byte of result byte i (0-3: w, 4: a zero byte of the second operand): 0x1404 gives
// bytes (0, c0, 0, c1), 0x3424 gives (0, c2, 0, c3).
__device__ __forceinline__ void e4m3x4(u32 w, u32& lo, u32& hi) {
  lo = e4m3_pair(__byte_perm(w, 0u, 0x1404));
  hi = e4m3_pair(__byte_perm(w, 0u, 0x3424));
}

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

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) fp8w_mma(
    const u16* __restrict__ x, const u8* __restrict__ w, const float* __restrict__ s,
    const u16* __restrict__ bias, u16* __restrict__ out, float* __restrict__ ws,
    int* __restrict__ counters, int m, int n, int k, int kx, int ldx, int ldo, int block_n,
    int block_k, int k_blocks, int k_per_split, int aligned) {
  __shared__ __align__(16) u16 xs[2][BM * XS_LD];
  __shared__ int last;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int own = (lane & 3) + ((lane >> 4) << 2);
  const int pair = (lane >> 2) & 3;
  const int tok0 = blockIdx.x * BM;
  const int n_warp = blockIdx.y * BN + warp * 32 * J;
  const int col0 = n_warp + pair * 8 + own;  // this lane's row of W in group j: col0 + 32 j
  const int k_begin = blockIdx.z * k_per_split;
  const int k_end = min(k_begin + k_per_split, k);
  const int tiles = (k_end - k_begin + BK - 1) / BK;

  // Rows past n are not loaded: their bytes keep earlier (finite) values, which reach only
  // their own outputs, and those are not stored.
  bool col_ok[J];
  const u8* w_row[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    col_ok[j] = col0 + 32 * j < n;
    w_row[j] = w + (col_ok[j] ? (col0 + 32 * j) * k : 0);
  }
  // The scale rows of the lane's accumulator columns: (lane & 2) + {0, 1, 4, 5} of its pair's
  // 8 outputs (the accumulator layout: the prelude's splitk_mma_epilogue), -1 past n.
  int s_row[J][4];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = n_warp + j * 32 + pair * 8 + (lane & 2) + (q & 1) + ((q & 2) << 1);
      s_row[j][q] = col < n ? (col / block_n) * k_blocks : -1;
    }
  // Tiles left in the scale block of the split's first tile, counted down as tiles load.
  const int block_tiles = block_k / BK;
  int block_left = block_tiles - (k_begin / BK) % block_tiles;

  // This thread's share of the activations: 16-byte vectors of 8 inputs, each at one token
  // and one place in the tile, the same every tile.
  const u16* xp[XV_PER_THREAD];
  bool x_ok[XV_PER_THREAD];
  int x_k[XV_PER_THREAD];
  uint4* x_to[XV_PER_THREAD];
#pragma unroll
  for (int i = 0; i < XV_PER_THREAD; ++i) {
    const int v = threadIdx.x + i * THREADS;
    const int tok = v / (BK / 8);
    x_k[i] = (v % (BK / 8)) * 8;
    x_ok[i] = v < XVECS && tok0 + tok < m;
    xp[i] = x + (x_ok[i] ? (tok0 + tok) * ldx + x_k[i] : 0);
    x_to[i] = reinterpret_cast<uint4*>(&xs[0][(v < XVECS ? tok : 0) * XS_LD + x_k[i]]);
  }

  // Global memory to registers for the tile at input k0: the lane's weight bytes (16-byte
  // chunks at or past k not loaded; with K a multiple of 16 a chunk is all in or all out), the
  // scales when the tile ends its block or the split, and the activations (zero past kx, up to
  // which the launcher zero-pads x, and for tokens past m).
  auto load = [&](Tile& t, int k0) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      if (!col_ok[j]) continue;
      const u8* row = w_row[j] + k0;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        const int left = k - k0 - 16 * c;
        if (left <= 0) continue;
        t.w[j][c] = aligned ? *reinterpret_cast<const uint4*>(row + 16 * c)
                            : bytes16(row + 16 * c, left);
      }
    }
    const bool block_end = --block_left == 0;
    if (block_end) block_left = block_tiles;
    t.flush = block_end || k0 + BK >= k_end;
    if (t.flush) {
      const int kb = k0 / block_k;
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          t.s[j][q] = s_row[j][q] >= 0 ? s[s_row[j][q] + kb] * 256.f : 0.f;
    }
#pragma unroll
    for (int i = 0; i < XV_PER_THREAD; ++i) {
      const bool ok = x_ok[i] && k0 + x_k[i] < kx;
      t.xv[i] = ok ? *reinterpret_cast<const uint4*>(xp[i] + k0) : make_uint4(0, 0, 0, 0);
    }
  };

  // Registers to shared buffer `buf`.
  auto stage = [&](const Tile& t, int buf) {
#pragma unroll
    for (int i = 0; i < XV_PER_THREAD; ++i)
      if (threadIdx.x + i * THREADS < XVECS) x_to[i][buf * (BM * XS_LD / 8)] = t.xv[i];
  };

  float acc[J][TB][8], part[J][TB][8];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int b = 0; b < TB; ++b)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[j][b][i] = part[j][b][i] = 0.f;

  Tile cur = {}, nxt = {};
  if (tiles > 0) {
    load(cur, k_begin);
    stage(cur, 0);
  }
  __syncthreads();
#pragma unroll 1
  for (int t = 0; t < tiles; ++t) {
    const bool more = t + 1 < tiles;
    if (more) load(nxt, k_begin + (t + 1) * BK);
    const u16* xrow = &xs[t & 1][own * XS_LD];
#pragma unroll
    for (int st = 0; st < STEPS; ++st) {
      u32 f[J][2];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const uint4 q = cur.w[j][st / 4];
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
    if (cur.flush) {
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int b = 0; b < TB; ++b)
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            acc[j][b][i] = fmaf(part[j][b][i], cur.s[j][(i & 1) + ((i & 4) >> 1)], acc[j][b][i]);
            part[j][b][i] = 0.f;
          }
    }
    if (more) {
      stage(nxt, (t + 1) & 1);
      cur = nxt;
    }
    __syncthreads();
  }

  // The prelude's split-K epilogue; each output pair is stored as one word where aligned.
  splitk_mma_epilogue(acc, ws, counters, last, bias, m, n, tok0, n_warp,
                      [&](int tok, int col, float v0, float v1, bool ok0, bool ok1) {
                        const u32 pair16 = pack_half2(v0, v1);
                        u16* o = out + tok * ldo + col;
                        if (ok1 && (reinterpret_cast<unsigned long long>(o) & 3) == 0) {
                          *reinterpret_cast<u32*>(o) = pair16;
                        } else {
                          if (ok0) o[0] = (u16)(pair16 & 0xFFFFu);
                          if (ok1) o[1] = (u16)(pair16 >> 16);
                        }
                      });
}
