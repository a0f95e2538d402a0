// out[M, N] = x[M, K] . dequant(W)[N, K]^T (+ bias) on Volta's tensor cores: inline PTX
// mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 (PTX ISA, "Matrix multiply-accumulate
// operation using mma instruction", m8n8k4), fp32 accumulation, fp16 output.
//
// Build options (-D): BITS 4 or 8; HAS_ZP 0 or 1 (asymmetric zero points); BM tokens per block
// (a multiple of 8); WARPS warps per block; J words per lane per word row (a warp covers 32 * J
// outputs, a block BN = WARPS * 32 * J).
//
// Weights as volta_ct_wna16.layout prepares them: w int32 [KW, N] (word kw of output n holds
// inputs PACK * kw .. PACK * kw + PACK - 1 at bits BITS * j, offset by 2^(BITS-1)), scales s
// fp16 [groups, N], zero points z fp16 [groups, N] (stored values) when HAS_ZP. A k-tile is
// four word rows, 32 inputs of 4 bits or 16 of 8, so it lies inside one quantization group
// (32, 64, 128, or the whole input) and takes one row of scales and zero points.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m8n8k4 with .f16 floating point type"): the
// four quad pairs of a warp (lanes 4p..4p+3 with 4p+16..4p+19) each run one 8x8x4 product;
// lane `own` = (lane & 3) + 4 * (lane >> 4) of a pair holds row `own` of A (4 inputs) and
// column `own` of B (4 inputs). A is the activations (row = token), B the weights (column =
// output). The word a lane loads, word kw of output n, already holds PACK consecutive inputs of
// its column: the weights go from global memory straight into B fragments, dequantized in
// registers, with no shared-memory staging. Pair p takes outputs 8p..8p+7 of each 32, so a
// warp's word loads are 128 contiguous bytes. The pairs share the tokens, so the A fragment is
// the same for all four (a broadcast shared-memory read); the activations are staged through
// shared memory, double-buffered through registers (sm_70 has no cp.async).
//
// Integers become fp16 without a conversion instruction: a 4-bit field ORed into bits 0..3 of a
// half with exponent 0x6400 reads as 1024 + q, into bits 4..7 as 1024 + 16 q; a byte placed
// under 0x64 reads as 1024 + q (vLLM's Marlin, csrc/quantization/marlin/dequant.h, after NVIDIA
// FasterTransformer's interleaved_numeric_conversion.h). For 4 bits that pairs values (0, 4),
// (1, 5), (2, 6), (3, 7) of a word in one register, so the activations are stored to shared
// memory in the order 0, 4, 1, 5, 2, 6, 3, 7 within each 8 inputs: a dot product does not
// depend on the order of its terms, only on both operands having the same one.
//
// Split-K: blockIdx.z splits the input. With more than one split every block adds its fp32
// tile atomically into zeroed accumulators ws [M, N]; the last block to arrive on the tile's
// counter (CUTLASS's serial split-K arrival: fence, barrier, one atomic increment) reads the
// sums with atomicExch, which puts the zeros back, adds the bias, stores fp16 and resets the
// counter, so the next launch (a CUDA graph replay) needs no memset: the prelude's
// splitk_mma_epilogue, which this kernel gives only its fp16 store.

// The build options' sizes, the dequantization and the k-tile registers come from
// mma_common.cuh, which the loader puts in front of this file.

extern "C" __global__ void __launch_bounds__(THREADS) wna16_mma(
    const u16* __restrict__ x, const u32* __restrict__ w, const u16* __restrict__ s,
    const u16* __restrict__ z, const u16* __restrict__ bias, u16* __restrict__ out,
    float* __restrict__ ws, int* __restrict__ counters, int m, int n, int k, int kx, int kw,
    int group, int ldx, int ldo, int k_per_split) {
  __shared__ __align__(16) u16 xs[2][BM * XS_LD];
  __shared__ int last;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int own = (lane & 3) + ((lane >> 4) << 2);
  const int pair = (lane >> 2) & 3;
  const int tok0 = blockIdx.x * BM;
  const int n_warp = blockIdx.y * BN + warp * 32 * J;
  const int col0 = n_warp + pair * 8 + own;  // this lane's output j is col0 + 32 j
  const int k_begin = blockIdx.z * k_per_split;
  const int k_end = min(k_begin + k_per_split, k);
  const int tiles = (k_end - k_begin + BK - 1) / BK;

  // Outputs past n are not loaded: their words and scales keep earlier (finite) values, which
  // reach only their own accumulators, and those are not stored. One address per word row
  // serves a lane's J outputs (32 apart).
  bool col_ok[J];
#pragma unroll
  for (int j = 0; j < J; ++j) col_ok[j] = col0 + 32 * j < n;
  const u32* w_lane = w + col0;
  // The split's first group, and its tiles left; then the rows move on by n a group. The
  // whole input (channel-wise) may not be whole tiles: its last partial tile is its own.
  const int group_tiles = (group + BK - 1) / BK;
  int group_left = group_tiles - (k_begin / BK) % group_tiles;
  const u16* sp = s + (k_begin / group) * n + col0;
#if HAS_ZP
  const u16* zp = z + (k_begin / group) * n + col0;
#endif

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
    xp[i] = x + (tok0 + tok) * ldx + x_k[i];
    x_to[i] = reinterpret_cast<uint4*>(&xs[0][tok * XS_LD + x_k[i]]);
  }

  // Global memory to registers for the tile at input k0: its words (rows past the input are
  // not loaded: they keep earlier, finite values and meet zero activations), its row of scales
  // and zero points, and the activations (zero past kx, up to which the launcher zero-pads x).
  auto load = [&](Tile& t, int k0) {
    const int kw0 = (unsigned)k0 / PACK;
    const int rows = min(kw - kw0, KW_TILE);
    const u32* row = w_lane + kw0 * n;
#pragma unroll
    for (int r = 0; r < KW_TILE; ++r, row += n)
#pragma unroll
      for (int j = 0; j < J; ++j)
        if (r < rows && col_ok[j]) t.w[r][j] = row[32 * j];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      if (col_ok[j]) {
        t.s[j] = sp[32 * j];
#if HAS_ZP
        t.z[j] = zp[32 * j];
#endif
      }
    }
    if (--group_left == 0) {
      group_left = group_tiles;
      sp += n;
#if HAS_ZP
      zp += n;
#endif
    }
#pragma unroll
    for (int i = 0; i < XV_PER_THREAD; ++i) {
      const bool ok = x_ok[i] && k0 + x_k[i] < kx;
      t.xv[i] = ok ? *reinterpret_cast<const uint4*>(xp[i] + k0) : make_uint4(0, 0, 0, 0);
    }
  };

  // Registers to shared buffer `buf`, in the inputs' fragment order.
  auto stage = [&](const Tile& t, int buf) {
#pragma unroll
    for (int i = 0; i < XV_PER_THREAD; ++i) {
      if (threadIdx.x + i * THREADS < XVECS) {
        uint4 q = t.xv[i];
#if BITS == 4
        q = make_uint4(__byte_perm(q.x, q.z, 0x5410), __byte_perm(q.x, q.z, 0x7632),
                       __byte_perm(q.y, q.w, 0x5410), __byte_perm(q.y, q.w, 0x7632));
#endif
        x_to[i][buf * (BM * XS_LD / 8)] = q;
      }
    }
  };

  float acc[J][TB][8];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int b = 0; b < TB; ++b)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[j][b][i] = 0.f;

  Tile cur = {}, nxt = {};
  if (tiles > 0) {
    load(cur, k_begin);
    stage(cur, 0);
  }
  __syncthreads();
  const u32 ex = 0x64006400u;
  for (int t = 0; t < tiles; ++t) {
    const bool more = t + 1 < tiles;
    if (more) load(nxt, k_begin + (t + 1) * BK);
    u32 zc[J], c16[J], ss[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
#if HAS_ZP
      const u32 zz = cur.z[j] * 0x10001u;
#else
      const u32 zz = BITS == 4 ? 0x48004800u : 0x58005800u;  // 8.0 or 128.0
#endif
      zc[j] = hadd2(zz, ex);
      c16[j] = hfma2(zz, 0xBC00BC00u, 0xD400D400u);  // z * -1 - 64
      ss[j] = cur.s[j] * 0x10001u;
    }
    const u16* xrow = &xs[t & 1][own * XS_LD];
#pragma unroll
    for (int r = 0; r < KW_TILE; ++r) {
      u32 f[J][2 * STEPS];
#pragma unroll
      for (int j = 0; j < J; ++j) dequant(cur.w[r][j], zc[j], c16[j], ss[j], ex, f[j]);
#pragma unroll
      for (int st = 0; st < STEPS; ++st) {
#pragma unroll
        for (int b = 0; b < TB; ++b) {
          const uint2 a =
              *reinterpret_cast<const uint2*>(xrow + b * 8 * XS_LD + r * PACK + st * 4);
#pragma unroll
          for (int j = 0; j < J; ++j)
            mma_m8n8k4(acc[j][b], a.x, a.y, f[j][2 * st], f[j][2 * st + 1]);
        }
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
                        u16* o = out + tok * ldo + col;
                        if (ok1 && (reinterpret_cast<unsigned long long>(o) & 3) == 0) {
                          *reinterpret_cast<u32*>(o) = (u32)f2h(v0) | ((u32)f2h(v1) << 16);
                        } else {
                          if (ok0) o[0] = f2h(v0);
                          if (ok1) o[1] = f2h(v1);
                        }
                      });
}
