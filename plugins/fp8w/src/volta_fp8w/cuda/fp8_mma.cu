// out[M, N] = x[M, K] . W[N, K]^T (+ bias) on Volta's tensor cores, W an e4m3fn checkpoint's
// weights decoded in registers: inline PTX mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32
// (the prelude's mma_m8n8k4; PTX ISA, "Matrix multiply-accumulate operation using mma
// instruction", m8n8k4), fp32 accumulation, fp16 output. Compiled behind
// volta_core.kernel_api.with_prelude, which defines u8/u16/u32, mma_m8n8k4, pack_half2, h2f
// and splitk_mma_epilogue, and fp8_common.cuh (the decode and the k-tile's products).
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

// Build options, derived sizes, the decode, the Tile and the k-tile's products: fp8_common.cuh,
// which the loader puts before this file. This kernel adds BN (outputs a block covers).
#define BN (WARPS * 32 * J)

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

  // Rows past n are not loaded (load_weights).
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

  // Global memory to registers for the tile at input k0: the lane's weight bytes, the scales
  // when the tile ends its block or the split, and the activations (zero past kx, up to which
  // the launcher zero-pads x, and for tokens past m).
  auto load = [&](Tile& t, int k0) {
    load_weights(t, w_row, col_ok, k0, k, aligned);
    const bool block_end = --block_left == 0;
    if (block_end) block_left = block_tiles;
    t.flush = block_end || k0 + BK >= k_end;
    if (t.flush) load_scales(t, s, s_row, k0 / block_k);
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
    tile_products(cur, &xs[t & 1][own * XS_LD], part, acc);
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
