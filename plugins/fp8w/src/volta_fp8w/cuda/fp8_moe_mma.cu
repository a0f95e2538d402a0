// The routed experts' W8A16 GEMM on Volta's tensor cores: for each block of BM routed (token,
// expert) pairs of one expert and the block's outputs,
//   row(p)[c] = sum_k x[p / row_div, k] * W_e[row(c), k],
// W_e expert e's e4m3fn weights times their scales, as the Triton routed blocks read them
// (volta_fp8w.kernels.moe): pairs[b * BM + r] the block's pair indices (num_pairs where the
// block is padded), the experts' blocks in expert order, ceil(counts[e] / BM) of expert e's.
//
// GATE_UP (gate/up with the SiLU product): the weights are gate's `inter` rows then up's, J / 2
// output groups of gate rows and J / 2 of up's rows at the same intermediate columns, so each
// lane holds gate and up of the same outputs; act[p, c] = SiLU(g) * u, g and u times r[p]
// first where rw is given (the router weight on the input), stored fp16 in out16 (ldo a row).
// Else (down): J groups of output rows; r[p] * the row (rw given, else 1) is added atomically
// into fp32 row p / out_div of out32 (each token's pairs summed into its row).
//
// The dense GEMM's k-loop (fp8_mma.cu, its helpers in fp8_common.cuh: codes decoded in
// registers straight into B fragments, one FFMA an output per scale block, the activations
// staged through double-buffered shared memory), with expert e's codes at e * stride_we bytes
// and its scales at e * stride_se floats, and the activations gathered: each thread's vectors
// come from its pair's input row, read once per block from the routing. No split-K: prefill
// routes enough blocks to fill the GPU. Every index into one expert's weights, the
// activations and the output fits 32-bit ints (the launcher checks); the expert's offset is
// 64-bit.
//
// Build options: those of fp8_mma.cu (BM, WARPS, J, BK, MIN_BLOCKS) and GATE_UP (0 or 1; J
// even with 1).

#if !defined(GATE_UP) || (GATE_UP && J % 2)
#error "build with -DGATE_UP=0 or -DGATE_UP=1 (and an even J)"
#endif

// Output groups of 32 columns a warp covers, and a block's columns: with GATE_UP each column is
// a gate row and an up row.
#define GROUPS (GATE_UP ? J / 2 : J)
#define BN (WARPS * 32 * GROUPS)

// SiLU(g) * u = g / (1 + 2^(-g log2 e)) * u in fp32, with the approximate exponential and
// division Triton's epilogue compiles tl.exp and its division to (ex2.approx, div.full): one
// MUFU.EX2 and one MUFU.RCP an output. A g so negative that 2^(-g log2 e) overflows gives 0.
__device__ __forceinline__ float silu_mul(float g, float u) {
  return __fdividef(g, 1.f + ex2(-1.4426950408889634f * g)) * u;
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) fp8w_moe_mma(
    const u16* __restrict__ x, const u8* __restrict__ w, const float* __restrict__ s,
    u16* __restrict__ out16, float* __restrict__ out32, const float* __restrict__ rw,
    const int* __restrict__ pairs, const int* __restrict__ counts, int num_pairs,
    int num_experts, int n, int k, int kx, int ldx, int ldo, int row_div, int out_div,
    int block_n, int block_k, int k_blocks, long long stride_we, long long stride_se,
    int aligned) {
  __shared__ __align__(16) u16 xs[2][BM * XS_LD];
  __shared__ int rows[BM];
  __shared__ int warp_blocks[WARPS];
  __shared__ int expert;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (threadIdx.x < BM) rows[threadIdx.x] = pairs[blockIdx.x * BM + threadIdx.x];

  // The block's expert from the counts, as the Triton kernels' block_expert: each thread sums
  // the blocks of its run of experts, a scan over the threads (warp shuffles, then the warps'
  // sums) gives the blocks before its run, and the one thread whose blocks hold this block
  // names its expert; none does past the routed blocks, and the expert stays num_experts.
  const int per = (num_experts + THREADS - 1) / THREADS;
  const int first = threadIdx.x * per;
  int mine = 0;
  for (int i = 0; i < per && first + i < num_experts; ++i)
    mine += (counts[first + i] + BM - 1) / BM;
  int upto = mine;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xFFFFFFFFu, upto, d);
    if (lane >= d) upto += v;
  }
  if (lane == 31) warp_blocks[warp] = upto;
  if (threadIdx.x == 0) expert = num_experts;
  __syncthreads();
  int before = upto - mine;
  for (int v = 0; v < warp; ++v) before += warp_blocks[v];
  if (before <= (int)blockIdx.x && (int)blockIdx.x < before + mine) {
    int e = first, end = before;
    while ((end += (counts[e] + BM - 1) / BM) <= (int)blockIdx.x) ++e;
    expert = e;
  }
  __syncthreads();
  const int e = expert;
  if (e >= num_experts) return;  // past the routed blocks: the whole block returns at once
  const int own = (lane & 3) + ((lane >> 4) << 2);
  const int pair = (lane >> 2) & 3;
  const int n_warp = blockIdx.y * BN + warp * 32 * GROUPS;
  const int col0 = n_warp + pair * 8 + own;  // this lane's column in group j: col0 + 32 (j % GROUPS)
  const int tiles = (k + BK - 1) / BK;
  w += e * stride_we;
  s += e * stride_se;

  // Group j's weight rows: its columns, up's after gate's `n` rows with GATE_UP. Columns past
  // n are not loaded (load_weights).
  bool col_ok[J];
  const u8* w_row[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    col_ok[j] = col0 + 32 * (j % GROUPS) < n;
    w_row[j] = w + (col_ok[j] ? (col0 + 32 * (j % GROUPS) + (j / GROUPS) * n) * k : 0);
  }
  // The scale rows of the lane's accumulator columns, as fp8_mma.cu's, -1 past n.
  int s_row[J][4];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col =
          n_warp + (j % GROUPS) * 32 + pair * 8 + (lane & 2) + (q & 1) + ((q & 2) << 1);
      s_row[j][q] = col < n ? ((col + (j / GROUPS) * n) / block_n) * k_blocks : -1;
    }
  const int block_tiles = block_k / BK;
  int block_left = block_tiles;

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
    xp[i] = x + (x_ok[i] ? (p / row_div) * ldx + x_k[i] : 0);
    x_to[i] = reinterpret_cast<uint4*>(&xs[0][tok * XS_LD + x_k[i]]);
  }

  // Global memory to registers for the tile at input k0, as fp8_mma.cu's (activations zero
  // past kx, up to which the launcher zero-pads them, and for padded rows).
  auto load = [&](Tile& t, int k0) {
    load_weights(t, w_row, col_ok, k0, k, aligned);
    const bool block_end = --block_left == 0;
    if (block_end) block_left = block_tiles;
    t.flush = block_end || k0 + BK >= k;
    if (t.flush) load_scales(t, s, s_row, k0 / block_k);
#pragma unroll
    for (int i = 0; i < XV_PER_THREAD; ++i) {
      const bool ok = x_ok[i] && k0 + x_k[i] < kx;
      t.xv[i] = ok ? *reinterpret_cast<const uint4*>(xp[i] + k0) : make_uint4(0, 0, 0, 0);
    }
  };

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
    load(cur, 0);
    stage(cur, 0);
  }
  __syncthreads();
#pragma unroll 1
  for (int t = 0; t < tiles; ++t) {
    const bool more = t + 1 < tiles;
    if (more) load(nxt, (t + 1) * BK);
    tile_products(cur, &xs[t & 1][own * XS_LD], part, acc);
    if (more) {
      stage(nxt, (t + 1) & 1);
      cur = nxt;
    }
    __syncthreads();
  }

  // Accumulator i of a lane is row (lane & 1) + (i & 2) + 4 (lane >> 4) of its 8-row block and
  // column (i & 4) + (lane & 2) + (i & 1) of its quad pair's 8 (PTX ISA, "Matrix Fragments for
  // mma.m8n8k4", the f32 accumulators), as the prelude's splitk_mma_epilogue reads them: i and
  // i + 1 (i even) are adjacent columns of one row.
#pragma unroll
  for (int b = 0; b < TB; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int p = rows[b * 8 + (lane & 1) + 2 * h + ((lane >> 4) << 2)];
      if (p >= num_pairs) continue;
      const float r = rw != nullptr ? rw[p] : 1.f;
#pragma unroll
      for (int j = 0; j < GROUPS; ++j)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int i = 2 * h + 4 * q;
          const int col = n_warp + j * 32 + pair * 8 + 4 * q + (lane & 2);
          const bool ok0 = col < n, ok1 = col + 1 < n;
#if GATE_UP
          const u32 pair16 = pack_half2(silu_mul(acc[j][b][i] * r, acc[j + GROUPS][b][i] * r),
                                        silu_mul(acc[j][b][i + 1] * r, acc[j + GROUPS][b][i + 1] * r));
          u16* o = out16 + p * ldo + col;
          if (ok1 && (reinterpret_cast<unsigned long long>(o) & 3) == 0) {
            *reinterpret_cast<u32*>(o) = pair16;
          } else {
            if (ok0) o[0] = (u16)(pair16 & 0xFFFFu);
            if (ok1) o[1] = (u16)(pair16 >> 16);
          }
#else
          float* o = out32 + (p / out_div) * ldo + col;
          if (ok0) atomicAdd(o, acc[j][b][i] * r);
          if (ok1) atomicAdd(o + 1, acc[j][b][i + 1] * r);
#endif
        }
    }
}
