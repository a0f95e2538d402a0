// Causal paged prefill on Volta's tensor cores: S = Q.K^T and O += P.V both on inline PTX
// mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 (PTX ISA, "Matrix multiply-accumulate
// operation using mma instruction", m8n8k4), the online softmax in fp32 between them
// (FlashAttention-2, Dao 2023, algorithm 1: rows split over warps, no inter-warp reduction).
// The semantics are those of the Triton kernel volta_attn_v100.kernels.prefill, which stays the
// reference: the packed cache [blocks, kv_heads, slots, 2 * HEAD] (K then V), the fp8 scale
// folding (k_scale into the score scale, v_scale into the probabilities), causal masking from
// each query's absolute position seq_len - q_len + t, sliding window, soft cap, sinks.
//
// Build options (-D): HEAD the head size (a multiple of 16); BLOCK_N keys per tile (a multiple
// of 32); WARPS warps per block, each owning 8 rows (BLOCK_M = 8 * WARPS); KV_FP8 1 for an
// fp8_e5m2 cache (bytes), 0 for fp16. __launch_bounds__ asks for one block per SM: with the
// default two, ptxas capped head sizes 80 and 96 at 128 registers and spilled 12-40 bytes.
//
// Rows of a program are (query token, head of the KV head's group): row = t * heads_per_prog + g,
// so each K/V tile is read once for the group (GQA). Programs are numbered over all sequences'
// query blocks as in the Triton kernel: sequence b starts at program q_start[b] / block_q + b,
// taken in reverse so the longest (last) query blocks start first.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m8n8k4 with .f16 floating point type"): the
// four quad pairs of a warp (lanes 4p..4p+3 with 4p+16..4p+19) each run one 8x8x4 product; lane
// `own` = (lane & 3) + 4 * (lane >> 4) of a pair holds row `own` of A and column `own` of B, four
// k values each. Here the four pairs share the warp's 8 rows (A) and take 8 columns each, so
// one instruction is an 8 x 32 x 4 product. Accumulator i of a lane is row
// (lane & 1) + (i & 2) + 4 * (lane >> 4), column (i & 4) + (lane & 2) + (i & 1) of its pair's
// 8 x 8 block: each lane holds two rows (ra and ra + 2), and a row's values sit in the lanes
// that differ in bits 1, 2 and 3 (shuffles over 2, 4 and 8 reduce it).
//
// Shared memory: Q [BLOCK_M][HEAD + 8], K [BLOCK_N][HEAD + 8] (B of Q.K^T is K^T column-major,
// so a column is a K row: one 8-byte read), V transposed [DV][BLOCK_N + 8] (B of P.V needs four
// consecutive keys of one head column), and per warp P [8][BLOCK_N + 8]. P goes through shared
// memory because an accumulator fragment (rows ra, ra + 2, columns spread over the pair) is not
// an A fragment (one row, four consecutive k per lane): the warp stores its fp16 probabilities
// and reads them back as A, with no other warp involved (__syncwarp). Rows are padded by 8
// halves (16 bytes) so the 8 rows one fragment read touches start in different banks. sm_70 has
// no cp.async: tiles go global -> registers -> shared memory, e5m2 widened to fp16 on the way
// (an e5m2 byte is the high byte of the fp16 of the same value).

#if !defined(HEAD) || !defined(BLOCK_N) || !defined(WARPS) || !defined(KV_FP8)
#error "build with -DHEAD -DBLOCK_N -DWARPS -DKV_FP8"
#endif
#if HEAD % 16 || BLOCK_N % 32
#error "HEAD must be a multiple of 16 and BLOCK_N of 32"
#endif

#define THREADS (WARPS * 32)
#define BLOCK_M (WARPS * 8)
// P.V output columns, padded to whole 32-column instructions (V's padded rows are zero).
#define DV (((HEAD) + 31) / 32 * 32)
#define LDQ (HEAD + 8)
#define LDK (HEAD + 8)
#define LDV (BLOCK_N + 8)
#define LDP (BLOCK_N + 8)
#define Q_HALVES (BLOCK_M * LDQ)
#define K_HALVES (BLOCK_N * LDK)
#define V_HALVES (DV * LDV)
#define P_HALVES (8 * LDP)
// The dynamic shared memory a block needs; the launcher computes the same figure
// (volta_attn_v100.cuda.prefill.shared_bytes) and the kernel traps if it got less.
#define SMEM_BYTES (2 * (Q_HALVES + K_HALVES + V_HALVES + WARPS * P_HALVES))
// 8-element chunks of a K or V tile (8 halves = 16 bytes of fp16, or 8 bytes of e5m2).
#define CHUNKS (BLOCK_N * HEAD / 8)
#define CHUNKS_PER_THREAD ((CHUNKS + THREADS - 1) / THREADS)
#define NB (BLOCK_N / 32)
#define NO (DV / 32)

// u8, u16, u32, mma_m8n8k4, pack_half2 and ex2 come from the core's SM70 prelude
// (volta_core/kernel_api/sm70_prelude.cuh), which the loader puts in front of this file.

// A row that has seen no key yet: finite, so a fully masked tile gives exp2(-inf - NEG_BIG) = 0.
#define NEG_BIG (-1.0e30f)
#define LOG2E 1.4426950408889634f

// 1 / x to about 1 ulp (the soft cap's tanh needs no correctly rounded division).
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float max_over_row(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
}

__device__ __forceinline__ float sum_over_row(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  return v + __shfl_xor_sync(0xffffffffu, v, 8);
}

// Eight K or V elements of one key as stored: 8 bytes of e5m2 or 16 of fp16, held in registers
// from their load in one tile's iteration to their store to shared memory in the next.
#if KV_FP8
typedef uint2 Chunk;
#else
typedef uint4 Chunk;
#endif

// The chunk at element offset `off` (zero for a key past the sequence).
__device__ __forceinline__ Chunk load_chunk(const unsigned char* __restrict__ kv, long long off,
                                            bool ok) {
  Chunk c = {};
  if (ok) c = *reinterpret_cast<const Chunk*>(kv + (KV_FP8 ? 1 : 2) * off);
  return c;
}

// A chunk as eight fp16.
__device__ __forceinline__ uint4 widen(Chunk c) {
#if KV_FP8
  // Bytes b0..b3 of a word become the fp16 pairs (b0 << 8, b1 << 8) and (b2 << 8, b3 << 8).
  return make_uint4(__byte_perm(c.x, 0u, 0x1404), __byte_perm(c.x, 0u, 0x3424),
                    __byte_perm(c.y, 0u, 0x1404), __byte_perm(c.y, 0u, 0x3424));
#else
  return c;
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) volta_prefill_mma(
    const u16* __restrict__ q, const unsigned char* __restrict__ kv,
    const int* __restrict__ block_table, const int* __restrict__ seq_lens,
    const int* __restrict__ q_start, const float* __restrict__ k_scales,
    const float* __restrict__ v_scales, const float* __restrict__ sinks, u16* __restrict__ out,
    float sm_scale, float softcap, int window, int has_sinks, int group, int heads_per_prog,
    int head_chunks, int num_seqs, int scale_stride, int page_size, int stride_qt,
    int stride_qh, long long stride_blk, long long stride_kvh, long long stride_slot,
    int stride_bt, int stride_ot, int stride_oh) {
  extern __shared__ __align__(16) u16 smem[];
  u16* qs = smem;
  u16* ks = qs + Q_HALVES;
  u16* vt = ks + K_HALVES;
  u16* ps = vt + V_HALVES + (threadIdx.x >> 5) * P_HALVES;
  {
    u32 given;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(given));
    if (given < SMEM_BYTES) __trap();
  }

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int own = (lane & 3) + ((lane >> 4) << 2);
  const int pair = (lane >> 2) & 3;
  const int pid = (int)gridDim.x - 1 - (int)blockIdx.x;
  const int kv_head = blockIdx.y / head_chunks;
  const int chunk = blockIdx.y % head_chunks;
  const int block_q = BLOCK_M / heads_per_prog;

  // The last sequence whose first program q_start[b] / block_q + b is at or before pid (the
  // firsts increase strictly with b).
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (q_start[mid] / block_q + mid <= pid) lo = mid; else hi = mid - 1;
  }
  const int seq = lo;
  const int q_begin = q_start[seq];
  const int q_len = q_start[seq + 1] - q_begin;
  const int q_block = pid - (q_begin / block_q + seq);
  if (q_block * block_q >= q_len) return;  // past the sequence's last block: the whole block
  const int seq_len = seq_lens[seq];
  const int context = seq_len - q_len;
  const int lowest = context + q_block * block_q;

  // Q rows to shared memory (zero for padding rows), V's padded head rows to zero.
  for (int e = threadIdx.x; e < BLOCK_M * HEAD; e += THREADS) {
    const int r = e / HEAD, d = e % HEAD;
    const int t = q_block * block_q + r / heads_per_prog;
    const int g = chunk * heads_per_prog + r % heads_per_prog;
    u16 v = 0;
    if (t < q_len && g < group && r < block_q * heads_per_prog) {
      v = q[(long long)(q_begin + t) * stride_qt + (long long)(kv_head * group + g) * stride_qh +
            d];
    }
    qs[r * LDQ + d] = v;
  }
  for (int e = threadIdx.x; e < (DV - HEAD) * LDV; e += THREADS) vt[HEAD * LDV + e] = 0;

  // This lane's two rows: absolute query positions (-1 for padding rows: they see no key) and
  // sink logits in base-2 units.
  const int ra = warp * 8 + (lane & 1) + ((lane >> 4) << 2);
  float sink[2];
  int q_abs[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = ra + 2 * h;
    const int t = q_block * block_q + r / heads_per_prog;
    const int g = chunk * heads_per_prog + r % heads_per_prog;
    const bool valid = t < q_len && g < group && r < block_q * heads_per_prog;
    q_abs[h] = valid ? context + t : -1;
    sink[h] = valid && has_sinks ? sinks[kv_head * group + g] * LOG2E : NEG_BIG;
  }
  float k_scale = 1.f, v_scale = 1.f;
#if KV_FP8
  k_scale = k_scales[kv_head * scale_stride];
  v_scale = v_scales[kv_head * scale_stride];
#endif
  const float qk_scale = sm_scale * k_scale * LOG2E;
  const float cap = softcap * LOG2E;
  const float two_log2e_over_cap = softcap > 0.f ? 2.f * LOG2E / cap : 0.f;

  const int last_key = min(context + (q_block + 1) * block_q, seq_len);
  const int tile_lo = window > 0 ? max(lowest - window + 1, 0) / BLOCK_N : 0;
  const int tile_hi = (last_key + BLOCK_N - 1) / BLOCK_N;
  const int* bt_row = block_table + (long long)seq * stride_bt;
  const long long head_off = (long long)kv_head * stride_kvh;

  float o[NO][8];
#pragma unroll
  for (int c = 0; c < NO; ++c)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[c][i] = 0.f;
  float m_row[2] = {NEG_BIG, NEG_BIG};
  float l_part[2] = {0.f, 0.f};  // this lane's share of each row's sum

  // This thread's chunks of a tile: K chunk j is chunk c = threadIdx.x + j * THREADS of the
  // tile's K rows (consecutive threads take consecutive chunks of one key: coalesced reads), V
  // chunk j the same c with keys fastest (consecutive threads take consecutive keys, so each
  // transposed half store of a warp lands in consecutive shared-memory halves).
  Chunk k_next[CHUNKS_PER_THREAD], v_next[CHUNKS_PER_THREAD];
  auto load_tile = [&](int tile) {
#pragma unroll
    for (int j = 0; j < CHUNKS_PER_THREAD; ++j) {
      const int c = threadIdx.x + j * THREADS;
      if (CHUNKS % THREADS == 0 || c < CHUNKS) {
        const int k_pos = tile * BLOCK_N + c / (HEAD / 8);
        const int v_pos = tile * BLOCK_N + c % BLOCK_N;
        const int k_d = (c % (HEAD / 8)) * 8, v_d = (c / BLOCK_N) * 8;
        long long k_off = 0, v_off = 0;
        if (k_pos < seq_len) {
          k_off = (long long)bt_row[k_pos / page_size] * stride_blk +
                  (long long)(k_pos % page_size) * stride_slot + head_off + k_d;
        }
        if (v_pos < seq_len) {
          v_off = (long long)bt_row[v_pos / page_size] * stride_blk +
                  (long long)(v_pos % page_size) * stride_slot + head_off + HEAD + v_d;
        }
        k_next[j] = load_chunk(kv, k_off, k_pos < seq_len);
        v_next[j] = load_chunk(kv, v_off, v_pos < seq_len);
      }
    }
  };
  if (tile_lo < tile_hi) load_tile(tile_lo);

  for (int tile = tile_lo; tile < tile_hi; ++tile) {
    __syncthreads();  // the previous tile's K and V reads are done (and Q is staged)
#pragma unroll
    for (int j = 0; j < CHUNKS_PER_THREAD; ++j) {
      const int c = threadIdx.x + j * THREADS;
      if (CHUNKS % THREADS == 0 || c < CHUNKS) {
        *reinterpret_cast<uint4*>(ks + (c / (HEAD / 8)) * LDK + (c % (HEAD / 8)) * 8) =
            widen(k_next[j]);
        const uint4 v = widen(v_next[j]);
        const u32 w[4] = {v.x, v.y, v.z, v.w};
        const int key = c % BLOCK_N, d = (c / BLOCK_N) * 8;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          vt[(d + 2 * i) * LDV + key] = (u16)(w[i] & 0xffffu);
          vt[(d + 2 * i + 1) * LDV + key] = (u16)(w[i] >> 16);
        }
      }
    }
    __syncthreads();
    // The next tile's loads are in flight while this one's products run: sm_70 has no
    // cp.async, so registers are the only place they can land without stalling here.
    if (tile + 1 < tile_hi) load_tile(tile + 1);

    // S = Q.K^T for the warp's 8 rows and the tile's keys.
    float s[NB][8];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int i = 0; i < 8; ++i) s[b][i] = 0.f;
    const u16* qrow = qs + (warp * 8 + own) * LDQ;
    const u16* krow = ks + (pair * 8 + own) * LDK;
#pragma unroll
    for (int k0 = 0; k0 < HEAD; k0 += 4) {
      const uint2 a = *reinterpret_cast<const uint2*>(qrow + k0);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const uint2 bk = *reinterpret_cast<const uint2*>(krow + b * 32 * LDK + k0);
        mma_m8n8k4(s[b], a.x, a.y, bk.x, bk.y);
      }
    }

    // Online softmax in base-2 units: scale (k_scale folded in), soft cap, masks.
    float tile_max[2] = {NEG_BIG, NEG_BIG};
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int h = (i >> 1) & 1;
        const int pos = tile * BLOCK_N + b * 32 + pair * 8 + (i & 4) + (lane & 2) + (i & 1);
        float x = s[b][i] * qk_scale;
        if (softcap > 0.f) {
          // cap * tanh(x / cap) = cap * (1 - 2 / (e^(2 x / cap) + 1)), the cap in base-2 units.
          x = cap * (1.f - 2.f * rcp_approx(ex2(x * two_log2e_over_cap) + 1.f));
        }
        const bool keep = pos < seq_len && pos <= q_abs[h] &&
                          (window <= 0 || q_abs[h] - pos < window);
        x = keep ? x : __int_as_float(0xff800000);  // -inf
        s[b][i] = x;
        tile_max[h] = fmaxf(tile_max[h], x);
      }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m_row[h], max_over_row(tile_max[h]));
      alpha[h] = ex2(m_row[h] - m_new);
      m_row[h] = m_new;
      l_part[h] *= alpha[h];
    }
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const int h = (i >> 1) & 1;
        const float p0 = ex2(s[b][i] - m_row[h]);
        const float p1 = ex2(s[b][i + 1] - m_row[h]);
        l_part[h] += p0 + p1;
        const int row = (lane & 1) + (i & 2) + ((lane >> 4) << 2);
        const int col = b * 32 + pair * 8 + (i & 4) + (lane & 2);
        *reinterpret_cast<u32*>(ps + row * LDP + col) = pack_half2(p0 * v_scale, p1 * v_scale);
      }
    __syncwarp();

    // O = O * alpha + P.V.
#pragma unroll
    for (int c = 0; c < NO; ++c)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[c][i] *= alpha[(i >> 1) & 1];
    const u16* prow = ps + own * LDP;
    const u16* vrow = vt + (pair * 8 + own) * LDV;
#pragma unroll
    for (int k0 = 0; k0 < BLOCK_N; k0 += 4) {
      const uint2 a = *reinterpret_cast<const uint2*>(prow + k0);
#pragma unroll
      for (int c = 0; c < NO; ++c) {
        const uint2 bv = *reinterpret_cast<const uint2*>(vrow + c * 32 * LDV + k0);
        mma_m8n8k4(o[c], a.x, a.y, bv.x, bv.y);
      }
    }
  }

  // Normalise, sinks in the denominator: out = acc e^(m - M) / (l e^(m - M) + e^(sink - M)).
  float scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = sum_over_row(l_part[h]);
    const float m_fin = fmaxf(m_row[h], sink[h]);
    const float a = ex2(m_row[h] - m_fin);
    const float denom = l * a + ex2(sink[h] - m_fin);
    scale[h] = a / (denom > 0.f ? denom : 1.f);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (q_abs[h] < 0) continue;
    const int r = ra + 2 * h;
    const int t = q_block * block_q + r / heads_per_prog;
    const int g = chunk * heads_per_prog + r % heads_per_prog;
    u16* orow = out + (long long)(q_begin + t) * stride_ot + (long long)(kv_head * group + g) *
                                                               stride_oh;
#pragma unroll
    for (int c = 0; c < NO; ++c)
#pragma unroll
      for (int i = 2 * h; i < 8; i += 4) {
        // Accumulators i and i + 1 (i & 2 == 2 h) are adjacent columns of row r.
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = c * 32 + pair * 8 + (i & 4) + (lane & 2) + e;
          if (col < HEAD) {
            const u32 hv = pack_half2(o[c][i + e] * scale[h], 0.f);
            orow[col] = (u16)(hv & 0xffffu);
          }
        }
      }
  }
}
