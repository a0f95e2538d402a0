// Split-KV paged decode on Volta's tensor cores: inline PTX
// mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 (PTX ISA, "Matrix multiply-accumulate operation
// using mma instruction", m8n8k4) for both products, fp32 online softmax, fp16 output. It computes
// what volta_attn_v100/kernels/decode.py computes (same masks, scale folding, sinks, partials).
//
// Build options (-D): HEAD 128 or 256; KV_FP8 0 (fp16 cache) or 1 (fp8 e5m2 bytes); WARPS warps
// per block; MIN_BLOCKS blocks per SM the register allocation is bounded for.
//
// Rows. A block owns 8 rows, m8n8k4's M: row r of row chunk rc is query token (8 rc + r) / group
// and head (8 rc + r) % group of one KV head, so a 32/8-head layer's group of 4 (or an MTP pair of
// tokens x 4 heads) pads to 8 rows, not to the 16 a Triton dot needs, and each K/V byte is read
// once per row chunk. Grid (row_chunks * splits, num_kv_heads, num_seqs).
//
// Keys. Each warp walks tiles of 8 keys (every WARPS-th tile of its partition); the four quad
// pairs of the warp (lanes 4p..4p+3 with 4p+16..4p+19, p = (lane >> 2) & 3) split the head
// dimension: pair p owns dims slice p of both products, so a lane keeps HEAD / 4 output floats.
//  * S = Q.K^T: lane `own` = (lane & 3) + 4 (lane >> 4) of pair p holds key `own`'s K over its
//    pair's dims (the B fragment, column-major) as 16-byte chunks 4j + p of the key's row: one
//    load instruction reads 64 contiguous bytes of each of the 8 keys. The dims of a product are
//    a sum's terms, so any split works; the four pairs' partial S add up with two butterfly
//    shuffles (xor 4, xor 8), which leave the same S, in the same rounding, in every pair.
//  * P.V: the accumulator layout gives a lane keys {c, c+1, c+4, c+5} (c = lane & 2) of rows
//    ra = (lane & 1) + 4 (lane >> 4) and ra + 2. Keys are a sum's terms too, so P.V runs over key
//    sets {0,1,4,5} and {2,3,6,7}: one shuffle (xor 2) of a pair of fp16 registers hands each lane
//    row `own`'s four probabilities of both sets, which is the A fragment (row-major). No shared
//    memory: each pair keeps its own copy of S, P and the statistics.
//  * V's B fragment wants 4 keys of one dim per lane: lane `own` of pair p reads HEAD / 32 dims
//    (at p * HEAD / 4 + own * HEAD / 32) of each of the tile's 8 keys, so a warp's load
//    instruction reads one key's whole V row, contiguous, and a byte permute pairs two keys' halves.
// Loads are issued a tile ahead into the registers the current tile has finished with (no
// cp.async on sm_70): the next K right after Q.K, the next V right after P.V, the next tile's
// block-table entry at the top. e5m2 is exact as fp16: its byte is the high byte of a half (same
// sign, 5-bit exponent and bias), widened by one byte permute per pair.
//
// Partitions (split-KV) combine in the same launch, as kernels/decode.py and CUTLASS's serial
// split-K do: each block stores its rows' unnormalised output, running max (base 2) and sum,
// fences, and counts itself in on its (sequence, KV head, row chunk) counter; the last one combines
// every partition in partition order (deterministic), adds the sinks, writes fp16 and puts the
// counter back to zero, so a CUDA graph replay needs no memset.

#if !defined(HEAD) || !defined(KV_FP8) || !defined(WARPS) || !defined(MIN_BLOCKS)
#error "build with -DHEAD -DKV_FP8 -DWARPS -DMIN_BLOCKS"
#endif
#if HEAD != 128 && HEAD != 256
#error "HEAD must be 128 or 256"
#endif

// u8, u16, u32, mma_m8n8k4, pack_half2 and ex2 come from the core's SM70 prelude
// (volta_core/kernel_api/sm70_prelude.cuh), which the loader puts in front of this file.

#define THREADS (WARPS * 32)
#define ROWS 8
#define TILE 8
#define SLICE (HEAD / 4)
#define ES (KV_FP8 ? 1 : 2)
#define CHUNK_DIMS (16 / ES)
#define K_CHUNKS (SLICE / CHUNK_DIMS)
#define K_STEPS (CHUNK_DIMS / 4)
#define QK_STEPS (SLICE / 4)
#define VW (HEAD / 32)
#define V_WORDS (VW * ES / 4)
#define V_PAIRS (VW / 2)
#define MAX_SPLITS 64
// A running max that has seen no key: finite, so exp2(-inf - NEG_BIG) is 0, never nan.
#define NEG_BIG (-1.0e30f)
#define LOG2E 1.4426950408889634f

#if KV_FP8
typedef u8 kv_t;
#else
typedef u16 kv_t;
#endif

__device__ __forceinline__ u16 to_half(float x) {
  u16 a;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(a) : "f"(x));
  return a;
}

// Bytes 0 and 1 (lo) or 2 and 3 of an e5m2 word as an fp16 pair: each byte under a zero byte.
__device__ __forceinline__ u32 e5m2_lo(u32 w) { return __byte_perm(w, 0u, 0x1404); }
__device__ __forceinline__ u32 e5m2_hi(u32 w) { return __byte_perm(w, 0u, 0x3424); }

// V_WORDS 32-bit words of one lane's V dims of a key (4, 8 or 16 contiguous bytes).
__device__ __forceinline__ void load_words(const kv_t* p, u32 (&w)[V_WORDS]) {
#if V_WORDS == 4
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#elif V_WORDS == 2
  const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
  w[0] = v.x, w[1] = v.y;
#else
  w[0] = __ldg(reinterpret_cast<const u32*>(p));
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) volta_decode_mma(
    const u16* __restrict__ q, const kv_t* __restrict__ kv, const int* __restrict__ block_table,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale,
    const float* __restrict__ sinks, u16* __restrict__ out, float* __restrict__ part_acc,
    float* __restrict__ part_ml, int* __restrict__ counters, float sm_scale, float softcap,
    int window, int has_sinks, int group, int num_q_heads, int row_chunks, int num_splits,
    int scale_stride, int page_size, int stride_qt, int stride_qh, int stride_blk, int stride_kvh,
    int stride_slot, int stride_bt, int stride_ot, int stride_oh) {
  __shared__ float red_o[WARPS][ROWS][HEAD];
  __shared__ float red_m[WARPS][ROWS];
  __shared__ float red_l[WARPS][ROWS];
  __shared__ float weights[ROWS][MAX_SPLITS];
  __shared__ float row_m[ROWS];
  __shared__ float row_l[ROWS];
  __shared__ int last;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int pair = (lane >> 2) & 3;
  const int own = (lane & 3) + ((lane >> 4) << 2);
  const int kc = lane & 2;
  const int ra = (lane & 1) + ((lane >> 4) << 2);
  const int rc = blockIdx.x % row_chunks;
  const int split = blockIdx.x / row_chunks;
  const int kvh = blockIdx.y;
  const int seq = blockIdx.z;

  const int q_begin = query_start[seq];
  const int q_len = query_start[seq + 1] - q_begin;
  const int seq_len = seq_lens[seq];

  // The keys this lane's two score rows (ra, ra + 2) see: from the window's start (or 0) up to
  // the row's own position (causal, inside the sequence); none for padding rows.
  int key_lo[2], key_hi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = rc * ROWS + ra + 2 * h;
    const int t = row / group;
    const int q_abs = seq_len - q_len + t;
    key_hi[h] = t < q_len ? q_abs : -1;
    key_lo[h] = window > 0 ? q_abs - window + 1 : 0;
  }

  // Q as A fragments: row `own`, the dims of each of the pair's Q.K steps.
  u32 qf[2 * QK_STEPS];
  {
    const int row = rc * ROWS + own;
    const int t = row / group;
    const bool valid = t < q_len;
    const u16* qrow =
        q + (long long)(q_begin + t) * stride_qt + (long long)(kvh * group + row % group) * stride_qh;
#pragma unroll
    for (int g = 0; g < QK_STEPS; ++g) {
      const int dim = (4 * (g / K_STEPS) + pair) * CHUNK_DIMS + 4 * (g % K_STEPS);
      const uint2 v = valid ? *reinterpret_cast<const uint2*>(qrow + dim) : make_uint2(0u, 0u);
      qf[2 * g] = v.x;
      qf[2 * g + 1] = v.y;
    }
  }

  // k_scale folds into the score scale (base-2 units), v_scale into the probabilities.
  float qk_scale = sm_scale * LOG2E;
  float p_scale = 1.0f;
#if KV_FP8
  qk_scale *= k_scale[kvh * scale_stride];
  p_scale = v_scale[kvh * scale_stride];
#endif
  // softcap * tanh(s / softcap) in base-2 units, as 1 - 2 / (e^(2 s / cap) + 1): the cap scales
  // by LOG2E too, and e^(2 s / cap) = 2^(s * 2 LOG2E / cap).
  const float cap = softcap * LOG2E;
  const float tanh_scale = cap > 0.f ? 2.0f * LOG2E / cap : 0.f;

  const int num_tiles = (seq_len + TILE - 1) / TILE;
  const int lowest = seq_len - q_len;
  const int lo = window > 0 ? max(lowest - window + 1, 0) / TILE : 0;
  const int per_split = (num_tiles - lo + num_splits - 1) / num_splits;
  const int tile_lo = lo + split * per_split;
  const int tile_hi = min(tile_lo + per_split, num_tiles);

  const int* bt_row = block_table + (long long)seq * stride_bt;
  const long long head_off = (long long)kvh * stride_kvh;

  u32 kraw[4 * K_CHUNKS];
  u32 vraw[TILE][V_WORDS];
  float o[VW][8];
#pragma unroll
  for (int e = 0; e < VW; ++e)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[e][i] = 0.f;
  float m[2] = {NEG_BIG, NEG_BIG};
  float l[2] = {0.f, 0.f};

  // Tile t's first key row: its page (from the block table) and slot; keys past the sequence
  // read its last key (masked out of the scores), which lies in the tile's page since a page
  // holds a multiple of 16 keys.
  auto tile_row = [&](int page, int slot) -> const kv_t* {
    return kv + (long long)page * stride_blk + head_off + (long long)slot * stride_slot;
  };
  auto load_k = [&](const kv_t* first, int last_key) {
    const kv_t* row = first + min(own, last_key) * stride_slot;
#pragma unroll
    for (int j = 0; j < K_CHUNKS; ++j) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + (4 * j + pair) * CHUNK_DIMS));
      kraw[4 * j] = v.x, kraw[4 * j + 1] = v.y, kraw[4 * j + 2] = v.z, kraw[4 * j + 3] = v.w;
    }
  };
  auto load_v = [&](const kv_t* first, int last_key) {
    const kv_t* base = first + HEAD + pair * SLICE + own * VW;
#pragma unroll
    for (int k = 0; k < TILE; ++k) load_words(base + min(k, last_key) * stride_slot, vraw[k]);
  };

  // A warp's tiles are WARPS apart: its block-table column and slot advance by the quotient and
  // remainder of WARPS * TILE keys by the page size, so the loop divides nothing.
  int t = tile_lo + warp;
  int column = t * TILE / page_size;
  int slot = t * TILE % page_size;
  const int column_step = WARPS * TILE / page_size;
  const int slot_step = WARPS * TILE % page_size;
  if (t < tile_hi) {
    const kv_t* first = tile_row(__ldg(bt_row + column), slot);
    load_k(first, seq_len - 1 - t * TILE);
    load_v(first, seq_len - 1 - t * TILE);
  }
  for (; t < tile_hi; t += WARPS) {
    const int next = t + WARPS;
    const bool more = next < tile_hi;
    column += column_step;
    slot += slot_step;
    if (slot >= page_size) {
      slot -= page_size;
      ++column;
    }
    const int next_page = more ? __ldg(bt_row + column) : 0;

    float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int g = 0; g < QK_STEPS; ++g) {
#if KV_FP8
      const u32 w = kraw[g];
      mma_m8n8k4(s, qf[2 * g], qf[2 * g + 1], e5m2_lo(w), e5m2_hi(w));
#else
      mma_m8n8k4(s, qf[2 * g], qf[2 * g + 1], kraw[2 * g], kraw[2 * g + 1]);
#endif
    }
    const kv_t* next_first = tile_row(next_page, slot);
    if (more) load_k(next_first, seq_len - 1 - next * TILE);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      s[i] += __shfl_xor_sync(0xffffffffu, s[i], 4);
      s[i] += __shfl_xor_sync(0xffffffffu, s[i], 8);
    }

    // Accumulator i: row ra + (i & 2), key (i & 4) + kc + (i & 1) of the tile.
    float mx[2] = {NEG_BIG, NEG_BIG};
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] *= qk_scale;
    if (cap > 0.f) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        s[i] = cap * (1.0f - __fdividef(2.0f, ex2(s[i] * tanh_scale) + 1.0f));
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int h = (i >> 1) & 1;
      const int pos = t * TILE + (i & 4) + kc + (i & 1);
      s[i] = pos >= key_lo[h] && pos <= key_hi[h] ? s[i] : -__int_as_float(0x7f800000);
      mx[h] = fmaxf(mx[h], s[i]);
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m[h], mx[h]);
      alpha[h] = ex2(m[h] - m_new);
      m[h] = m_new;
      l[h] *= alpha[h];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int h = (i >> 1) & 1;
      s[i] = ex2(s[i] - m[h]);
      l[h] += s[i];
    }
#pragma unroll
    for (int e = 0; e < VW; ++e)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[e][i] *= alpha[(i >> 1) & 1];

    // Row ra's keys (i = 0, 1, 4, 5) and row ra + 2's (i = 2, 3, 6, 7) as fp16 pairs; the lane
    // keeps row `own`'s and trades the other row for its partner's half of the keys.
    const u32 pa0 = pack_half2(s[0] * p_scale, s[1] * p_scale);
    const u32 pa1 = pack_half2(s[4] * p_scale, s[5] * p_scale);
    const u32 pb0 = pack_half2(s[2] * p_scale, s[3] * p_scale);
    const u32 pb1 = pack_half2(s[6] * p_scale, s[7] * p_scale);
    const u32 mine0 = kc ? pb0 : pa0, mine1 = kc ? pb1 : pa1;
    const u32 got0 = __shfl_xor_sync(0xffffffffu, kc ? pa0 : pb0, 2);
    const u32 got1 = __shfl_xor_sync(0xffffffffu, kc ? pa1 : pb1, 2);
    // A fragments of key sets {0, 1, 4, 5} and {2, 3, 6, 7}.
    const u32 a[2][2] = {{kc ? got0 : mine0, kc ? got1 : mine1},
                         {kc ? mine0 : got0, kc ? mine1 : got1}};

    u32 vh[TILE][V_PAIRS];
#pragma unroll
    for (int k = 0; k < TILE; ++k) {
#if KV_FP8
#pragma unroll
      for (int w = 0; w < V_WORDS; ++w) {
        vh[k][2 * w] = e5m2_lo(vraw[k][w]);
        vh[k][2 * w + 1] = e5m2_hi(vraw[k][w]);
      }
#else
#pragma unroll
      for (int w = 0; w < V_WORDS; ++w) vh[k][w] = vraw[k][w];
#endif
    }
    if (more) load_v(next_first, seq_len - 1 - next * TILE);
#pragma unroll
    for (int set = 0; set < 2; ++set) {
      const int k0 = 2 * set;
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        const u32 sel = (e & 1) ? 0x7632u : 0x5410u;
        const u32 b0 = __byte_perm(vh[k0][e >> 1], vh[k0 + 1][e >> 1], sel);
        const u32 b1 = __byte_perm(vh[k0 + 4][e >> 1], vh[k0 + 5][e >> 1], sel);
        mma_m8n8k4(o[e], a[set][0], a[set][1], b0, b1);
      }
    }
  }

  // The warp's state to shared memory: sums over the lane pair that split the keys.
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  if (kc == 0 && pair == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      red_m[warp][ra + 2 * h] = m[h];
      red_l[warp][ra + 2 * h] = l[h];
    }
  }
#pragma unroll
  for (int e = 0; e < VW; ++e)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int col = (i & 4) + kc + (i & 1);
      red_o[warp][ra + (i & 2)][pair * SLICE + col * VW + e] = o[e][i];
    }
  __syncthreads();

  const int rows_total = q_len * group;
  // The block's rows over its warps, then either the output (one partition) or the partials.
  for (int idx = tid; idx < ROWS * HEAD; idx += THREADS) {
    const int r = idx / HEAD, d = idx % HEAD;
    const int row = rc * ROWS + r;
    if (row >= rows_total) continue;
    float big = NEG_BIG;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) big = fmaxf(big, red_m[w][r]);
    float sum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float f = ex2(red_m[w][r] - big);
      sum += red_l[w][r] * f;
      acc += red_o[w][r][d] * f;
    }
    const int token = q_begin + row / group;
    const int head = kvh * group + row % group;
    if (num_splits == 1) {
      const float sink = has_sinks ? sinks[head] * LOG2E : NEG_BIG;
      const float top = fmaxf(big, sink);
      const float scale = ex2(big - top);
      const float denom = sum * scale + ex2(sink - top);
      out[(long long)token * stride_ot + (long long)head * stride_oh + d] =
          to_half(acc * (scale / (denom > 0.f ? denom : 1.0f)));
    } else {
      const long long part = ((long long)token * num_q_heads + head) * num_splits + split;
      part_acc[part * HEAD + d] = acc;
      if (d == 0) {
        part_ml[2 * part] = big;
        part_ml[2 * part + 1] = sum;
      }
    }
  }
  if (num_splits == 1) return;

  int* counter = counters + ((long long)seq * gridDim.y + kvh) * row_chunks + rc;
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(counter, 1) == num_splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();

  // The last block: each row's maximum and sum over the partitions, then its output.
  if (tid < ROWS) {
    const int row = rc * ROWS + tid;
    float big = NEG_BIG, sum = 0.f;
    if (row < rows_total) {
      const long long first =
          ((long long)(q_begin + row / group) * num_q_heads + kvh * group + row % group) *
          num_splits;
      for (int sp = 0; sp < num_splits; ++sp) {
        weights[tid][sp] = __ldcg(part_ml + 2 * (first + sp));
        big = fmaxf(big, weights[tid][sp]);
      }
      for (int sp = 0; sp < num_splits; ++sp) {
        const float f = ex2(weights[tid][sp] - big);
        weights[tid][sp] = f;
        sum += __ldcg(part_ml + 2 * (first + sp) + 1) * f;
      }
    }
    row_m[tid] = big;
    row_l[tid] = sum;
  }
  __syncthreads();
  for (int idx = tid; idx < ROWS * HEAD; idx += THREADS) {
    const int r = idx / HEAD, d = idx % HEAD;
    const int row = rc * ROWS + r;
    if (row >= rows_total) continue;
    const int token = q_begin + row / group;
    const int head = kvh * group + row % group;
    const float* src = part_acc + ((long long)token * num_q_heads + head) * num_splits * HEAD + d;
    float acc = 0.f;
    for (int sp = 0; sp < num_splits; ++sp) acc += weights[r][sp] * __ldcg(src + sp * HEAD);
    const float big = row_m[r];
    const float sink = has_sinks ? sinks[head] * LOG2E : NEG_BIG;
    const float top = fmaxf(big, sink);
    const float scale = ex2(big - top);
    const float denom = row_l[r] * scale + ex2(sink - top);
    out[(long long)token * stride_ot + (long long)head * stride_oh + d] =
        to_half(acc * (scale / (denom > 0.f ? denom : 1.0f)));
  }
  if (tid == 0) *counter = 0;
}
