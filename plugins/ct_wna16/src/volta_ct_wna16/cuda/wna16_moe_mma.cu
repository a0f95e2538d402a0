// The routed experts' GEMM on Volta's tensor cores: for each block of BM routed (token, expert)
// pairs of one expert (volta_ct_wna16.routing's layout, the one the Triton routed-blocks kernel
// reads: pairs[b * BM + r] the block's pair indices, num_pairs where the block is padded, and
// experts[b] its expert, num_experts past the routed pairs) and BN outputs,
//   row(p)[n] = r[p] * sum_k x[p / row_div, k] * dequant(W_e)[n, k],
// r[p] the router weight where rw is given, else 1. With out32 the rows are added atomically
// into fp32 row p / out_div (down: each token's pairs summed into its row); else they are stored
// as fp16 row p of out16 (gate/up).
//
// The dense GEMM's k-loop (wna16_mma.cu: weights dequantized in registers straight into
// mma.m8n8k4 B fragments, the activations staged through double-buffered shared memory), with
// the expert's weights at e * stride_we words and its scales and zero points at e * stride_se,
// and the activations gathered: each thread's vectors come from its pair's input row, read once
// per block from the routing. No split-K: prefill routes enough blocks to fill the GPU. Every
// index into one expert's weights, the activations and the output fits 32-bit ints (the
// launcher checks); the expert's offset is 64-bit.
//
// Build options: those of wna16_mma.cu (BITS, HAS_ZP, BM, WARPS, J).

extern "C" __global__ void __launch_bounds__(THREADS) wna16_moe_mma(
    const u16* __restrict__ x, const u32* __restrict__ w, const u16* __restrict__ s,
    const u16* __restrict__ z, u16* __restrict__ out16, float* __restrict__ out32,
    const float* __restrict__ rw, const int* __restrict__ pairs, const int* __restrict__ experts,
    int num_pairs, int num_experts, int n, int k, int kx, int kw, int group, int row_div,
    int out_div, int ldx, int ldo, long long stride_we, long long stride_se) {
  __shared__ __align__(16) u16 xs[2][BM * XS_LD];
  __shared__ int rows[BM];
  const int e = experts[blockIdx.x];
  if (e >= num_experts) return;  // past the routed pairs: the whole block returns at once
  if (threadIdx.x < BM) rows[threadIdx.x] = pairs[blockIdx.x * BM + threadIdx.x];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int own = (lane & 3) + ((lane >> 4) << 2);
  const int pair = (lane >> 2) & 3;
  const int n_warp = blockIdx.y * BN + warp * 32 * J;
  const int col0 = n_warp + pair * 8 + own;  // this lane's output j is col0 + 32 j
  const int tiles = (k + BK - 1) / BK;
  w += e * stride_we;
  s += e * stride_se;
#if HAS_ZP
  z += e * stride_se;
#endif

  // Outputs past n are not loaded (their accumulators are not stored), as in wna16_mma.cu.
  bool col_ok[J];
#pragma unroll
  for (int j = 0; j < J; ++j) col_ok[j] = col0 + 32 * j < n;
  const u32* w_lane = w + col0;
  const int group_tiles = (group + BK - 1) / BK;
  int group_left = group_tiles;
  const u16* sp = s + col0;
#if HAS_ZP
  const u16* zp = z + col0;
#endif

  // This thread's share of the activations: 16-byte vectors of 8 inputs of one pair's input
  // row, at one place in the tile, the same every tile; padded rows load zeros.
  const u16* xp[XV_PER_THREAD];
  bool x_ok[XV_PER_THREAD];
  int x_k[XV_PER_THREAD];
  uint4* x_to[XV_PER_THREAD];
#pragma unroll
  for (int i = 0; i < XV_PER_THREAD; ++i) {
    const int v = threadIdx.x + i * THREADS;
    const int tok = min(v / (BK / 8), BM - 1);
    const int p = rows[tok];
    x_k[i] = (v % (BK / 8)) * 8;
    x_ok[i] = v < XVECS && p < num_pairs;
    xp[i] = x + (x_ok[i] ? p / row_div : 0) * ldx + x_k[i];
    x_to[i] = reinterpret_cast<uint4*>(&xs[0][tok * XS_LD + x_k[i]]);
  }

  auto load = [&](Tile& t, int k0) {
    const int kw0 = (unsigned)k0 / PACK;
    const int rows_left = min(kw - kw0, KW_TILE);
    const u32* row = w_lane + kw0 * n;
#pragma unroll
    for (int r = 0; r < KW_TILE; ++r, row += n)
#pragma unroll
      for (int j = 0; j < J; ++j)
        if (r < rows_left && col_ok[j]) t.w[r][j] = row[32 * j];
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
    load(cur, 0);
    stage(cur, 0);
  }
  __syncthreads();
  const u32 ex = 0x64006400u;
  for (int t = 0; t < tiles; ++t) {
    const bool more = t + 1 < tiles;
    if (more) load(nxt, (t + 1) * BK);
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

  // Accumulator i of a lane is row (lane & 1) + (i & 2) + 4 (lane >> 4) of its 8-row block and
  // output (i & 4) + (lane & 2) + (i & 1) of its quad pair's 8 (PTX ISA, "Matrix Fragments for
  // mma.m8n8k4", the f32 accumulators), as the prelude's splitk_mma_epilogue reads them.
#pragma unroll
  for (int b = 0; b < TB; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int p = rows[b * 8 + (lane & 1) + 2 * h + ((lane >> 4) << 2)];
      if (p >= num_pairs) continue;
      const float r = rw != nullptr ? rw[p] : 1.f;
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int i = 2 * h + 4 * q;
          const int col = n_warp + j * 32 + pair * 8 + 4 * q + (lane & 2);
          const float v0 = acc[j][b][i] * r, v1 = acc[j][b][i + 1] * r;
          const bool ok0 = col < n, ok1 = col + 1 < n;
          if (out32 != nullptr) {
            float* o = out32 + (p / out_div) * ldo + col;
            if (ok0) atomicAdd(o, v0);
            if (ok1) atomicAdd(o + 1, v1);
          } else {
            u16* o = out16 + p * ldo + col;
            if (ok1 && (reinterpret_cast<unsigned long long>(o) & 3) == 0) {
              *reinterpret_cast<u32*>(o) = (u32)f2h(v0) | ((u32)f2h(v1) << 16);
            } else {
              if (ok0) o[0] = f2h(v0);
              if (ok1) o[1] = f2h(v1);
            }
          }
        }
    }
}
