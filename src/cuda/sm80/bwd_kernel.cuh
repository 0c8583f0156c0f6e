// FlashAttention-2 backward for sm80+.
//   bwd_delta_kernel:   delta = rowsum(dO * O), fp32 (H, total_q)
//   bwd_kernel:         one CTA per (key tile, K/V head, batch) recomputes S^T and P^T
//                       from the LSE for every query tile that sees its keys (all query
//                       heads of its GQA group), accumulates dK, dV in registers and
//                       adds dQ = dS K into an fp32 workspace (atomics, or an ordered
//                       semaphore hand-off in deterministic mode)
//   bwd_convert_dq_kernel: fp32 workspace -> dQ in T, times the softmax scale
#pragma once

#include "cuda/sm80/kernel_traits.cuh"

namespace flashattn::sm80 {

// kExtras: the tile of the softcap / ALiBi / dropout kernels (bwd_tile_config).
template <typename T_, int kHeadDim_, bool kMaskDiagonal_, bool kLargeSmem = false, bool kExtras = false>
struct BwdTraits {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kMaskDiagonal = kMaskDiagonal_;
  static constexpr BwdTileConfig kConfig = bwd_tile_config(kHeadDim, kLargeSmem, kExtras, kMaskDiagonal);
  static constexpr int kBlockM = kConfig.block_m, kBlockN = kConfig.block_n, kWarps = kConfig.warps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = kConfig.q_stages;
  // S^T, dP^T: (kBlockN, kBlockM); per warp (kSKeys, kSQueries).
  static constexpr int kSKeys = kBlockN / kConfig.s_warps_n, kSQueries = kBlockM / (kWarps / kConfig.s_warps_n);
  static constexpr int kSMTiles = kSKeys / 16, kSNTiles = kSQueries / 8;
  // dK, dV: (kBlockN, kHeadDim); per warp (kDkvKeys, kDkvCols).
  static constexpr int kDkvKeys = kBlockN / kConfig.dkv_warps_n, kDkvCols = kHeadDim / (kWarps / kConfig.dkv_warps_n);
  static constexpr int kDkvMTiles = kDkvKeys / 16, kDkvNTiles = kDkvCols / 8;
  // dQ: (kBlockM, kHeadDim); per warp (kDqRows, kDqCols).
  static constexpr int kDqRows = kBlockM / kConfig.dq_warps_m, kDqCols = kHeadDim / (kWarps / kConfig.dq_warps_m);
  static constexpr int kDqMTiles = kDqRows / 16, kDqNTiles = kDqCols / 8;
  static_assert(kSNTiles % 2 == 0 && kDkvNTiles % 2 == 0 && kDqNTiles % 2 == 0, "n8 tiles come in pairs");

  using TileKV = SmemTile<kBlockN, kHeadDim>;  // K, V: (kBlockN, kHeadDim)
  using TileQ = SmemTile<kBlockM, kHeadDim>;   // Q, dO: (kBlockM, kHeadDim)
  using TileP = SmemTile<kBlockN, kBlockM>;    // P^T, dS^T: (kBlockN, kBlockM)
  static constexpr int kSmemBytes =
      2 * TileKV::kBytes + 2 * kStages * TileQ::kBytes + 2 * TileP::kBytes + 2 * kStages * kBlockM * 4;
};

// Extra arguments of one backward pass (a slice of query heads).
struct BwdPass {
  float* dq_accum = nullptr;     // (dq_copies, total_q, heads_per_pass, kHeadDim)
  const float* delta = nullptr;  // (H, total_q)
  int* semaphores = nullptr;     // (B, heads_per_pass, m_blocks, kSemaphoresPerQueryTile)
  int head_begin = 0, heads_per_pass = 0, m_blocks = 0;
  // The sm90 deterministic backward's dQ copies and key tiles per copy
  // (sm90/bwd_items.hpp, BwdItems): 2 copies and 0 in the rotated order, up
  // to kMaxDqCopies groups of key tiles under a causal mask.
  int dq_copies = 1, key_group_tiles = 0;
  int64_t dq_copy_floats = 0;  // total_q * heads_per_pass * kHeadDim
  // The sm90 deterministic backward's first adder of a query tile stores (the
  // accumulator is not zeroed; the convert pass reads a copy only where
  // dq_row_semaphores shows an adder). block_m: the query tile that numbers
  // the semaphores.
  bool dq_first_store = false;
  int block_m = 0;
};

__device__ __forceinline__ int64_t packed_q_row0(const AttnParams& params, const SequenceBounds& seq, int b) {
  return params.is_varlen ? seq.q_row0 : int64_t(b) * params.seqlen_q;
}

// delta[h][r] = sum_d dO[r, h, d] * O[r, h, d]; one warp per packed row.
template <typename T>
__global__ void bwd_delta_kernel(const __grid_constant__ BwdParams params, float* delta) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int h = blockIdx.y, lane = threadIdx.x & 31;
  if (r >= params.total_q) return;
  const int b = params.is_varlen ? 0 : static_cast<int>(r / params.seqlen_q);
  const int64_t i = params.is_varlen ? r : r % params.seqlen_q;
  const T* dout = static_cast<const T*>(params.dout) + row_offset(params.dout_layout, b, i, h);
  const T* out = static_cast<const T*>(params.o) + row_offset(params.o_layout, b, i, h);
  float sum = 0.0f;
  for (int col = lane * 8; col < params.head_dim_v; col += 256) {
    const uint4 a = *reinterpret_cast<const uint4*>(dout + col), o = *reinterpret_cast<const uint4*>(out + col);
    const T* av = reinterpret_cast<const T*>(&a);
    const T* ov = reinterpret_cast<const T*>(&o);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += static_cast<float>(av[e]) * static_cast<float>(ov[e]);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
  if (lane == 0) delta[int64_t(h) * params.total_q + r] = sum;
}

// The sm90 deterministic semaphores of query tile m_block of query head
// head_begin + hp in sequence b: [2 copy + wg] counts the key tiles whose
// consumer warpgroup wg has added into dQ copy `copy`.
__device__ __forceinline__ int* dq_tile_semaphores(const BwdPass& pass, int b, int hp, int m_block) {
  const int64_t tile = (int64_t(b) * pass.heads_per_pass + hp) * pass.m_blocks + m_block;
  return pass.semaphores + tile * flashattn::cuda::kSemaphoresPerQueryTile;
}

// With pass.dq_first_store: the semaphores of the query tile that holds
// packed row r (dq_tile_semaphores), nullptr for a row of no sequence.
__device__ __forceinline__ const int* dq_row_semaphores(const BwdParams& params, const BwdPass& pass, int64_t r,
                                                        int hp) {
  int b = 0;
  int64_t i = r;
  if (params.is_varlen) {
    // The last sequence starting at or before r (empty ones share its start).
    int lo = 0, hi = static_cast<int>(params.batch);
    if (r < params.cu_seqlens_q[0]) return nullptr;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (params.cu_seqlens_q[mid] <= r) lo = mid; else hi = mid;
    }
    b = lo;
    if (r >= params.cu_seqlens_q[b + 1]) return nullptr;  // a row past the last sequence
    i = r - params.cu_seqlens_q[b];
  } else {
    b = static_cast<int>(r / params.seqlen_q);
    i = r % params.seqlen_q;
  }
  return dq_tile_semaphores(pass, b, hp, static_cast<int>(i / pass.block_m));
}

// dQ[r, h, :] = scale * sum over the copies c of dq_accum[c, r, h - head_begin, :]
// (in copy order), 8 columns per thread.
template <typename T, int kHeadDim>
__global__ void bwd_convert_dq_kernel(const __grid_constant__ BwdParams params, const BwdPass pass) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / (kHeadDim / 8)) + threadIdx.x / (kHeadDim / 8);
  const int col = (threadIdx.x % (kHeadDim / 8)) * 8, hp = blockIdx.y;
  if (r >= params.total_q || col >= params.head_dim) return;
  const int b = params.is_varlen ? 0 : static_cast<int>(r / params.seqlen_q);
  const int64_t i = params.is_varlen ? r : r % params.seqlen_q;
  const float* src = pass.dq_accum + (r * pass.heads_per_pass + hp) * kHeadDim + col;
  // With first-adder stores a copy that no key tile reached holds no value.
  const int* reached = pass.dq_first_store ? dq_row_semaphores(params, pass, r, hp) : nullptr;
  auto holds = [&](int copy) { return !pass.dq_first_store || (reached != nullptr && reached[2 * copy] != 0); };
  float4 lo = make_float4(0.0f, 0.0f, 0.0f, 0.0f), hi = lo;
  for (int copy = 0; copy < pass.dq_copies; ++copy) {
    if (!holds(copy)) continue;
    const float4 lo1 = *reinterpret_cast<const float4*>(src + copy * pass.dq_copy_floats);
    const float4 hi1 = *reinterpret_cast<const float4*>(src + copy * pass.dq_copy_floats + 4);
    lo = make_float4(lo.x + lo1.x, lo.y + lo1.y, lo.z + lo1.z, lo.w + lo1.w);
    hi = make_float4(hi.x + hi1.x, hi.y + hi1.y, hi.z + hi1.z, hi.w + hi1.w);
  }
  const float scale = params.softmax_scale;
  uint4 packed;
  packed.x = Pack2<T>::pack(lo.x * scale, lo.y * scale);
  packed.y = Pack2<T>::pack(lo.z * scale, lo.w * scale);
  packed.z = Pack2<T>::pack(hi.x * scale, hi.y * scale);
  packed.w = Pack2<T>::pack(hi.z * scale, hi.w * scale);
  T* dst = static_cast<T*>(params.dq) + row_offset(params.dq_layout, b, i, pass.head_begin + hp) + col;
  *reinterpret_cast<uint4*>(dst) = packed;
}

// dQ accumulation: fire-and-forget fp32 adds of a column pair (one vector RED
// on sm90, two scalar ones before).
__device__ __forceinline__ void red_add_f32x2(float* address, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(address), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(address, a);
  atomicAdd(address + 1, b);
#endif
}

__device__ __forceinline__ int load_acquire(const int* pointer) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(pointer) : "memory");
  return value;
}
__device__ __forceinline__ void store_release(int* pointer, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(pointer), "r"(value) : "memory");
}

// kVariant: see Extras (kernel_traits.cuh).
template <class Traits, Extras kVariant>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdParams params, const __grid_constant__ BwdPass pass) {
  constexpr bool kExtras = kVariant != Extras::kNone;
  using T = typename Traits::T;
  using TileKV = typename Traits::TileKV;
  using TileQ = typename Traits::TileQ;
  using TileP = typename Traits::TileP;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kThreads = Traits::kThreads;
  constexpr int kHeadDim = Traits::kHeadDim, kStages = Traits::kStages;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);  // (kBlockN, kHeadDim)
  T* sV = sK + TileKV::kElements;          // (kBlockN, kHeadDim)
  T* sQ = sV + TileKV::kElements;          // kStages x (kBlockM, kHeadDim)
  T* sdO = sQ + kStages * TileQ::kElements;  // kStages x (kBlockM, kHeadDim)
  T* sP = sdO + kStages * TileQ::kElements;  // (kBlockN, kBlockM): P^T with dropout applied
  T* sdS = sP + TileP::kElements;            // (kBlockN, kBlockM): dS^T
  float* sLse = reinterpret_cast<float*>(sdS + TileP::kElements);  // kStages x kBlockM
  float* sDelta = sLse + kStages * kBlockM;                          // kStages x kBlockM

  // Deterministic mode launches the last key tiles first (see next_item).
  const bool deterministic = pass.semaphores != nullptr;
  const int n_block = deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const SequenceBounds seq = sequence_bounds(params, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.len_k) return;
  const int keys = min(kBlockN, seq.len_k - n0);
  const int group = static_cast<int>(params.heads / params.heads_kv);
  const int h_kv = pass.head_begin / group + blockIdx.y;
  const int dim = static_cast<int>(params.head_dim), dim_v = static_cast<int>(params.head_dim_v);
  const MaskPolicy mask =
      MaskPolicy::make(seq.len_q, seq.len_k, params.align_bottom_right, params.window_left, params.window_right);
  const int64_t q_packed0 = packed_q_row0(params, seq, b);
  const bool dropout = params.dropout.enabled;
  const float keep_scale = params.dropout.keep_scale;
  const DropoutKeys<kVariant, true> dropout_keys(params.dropout, tid);

  const T* k_tile = static_cast<const T*>(params.k) + row_offset(params.k_layout, b, seq.k_row0 + n0, h_kv);
  const T* v_tile = static_cast<const T*>(params.v) + row_offset(params.v_layout, b, seq.k_row0 + n0, h_kv);
  load_tile_async<TileKV, kThreads>(sK, k_tile, params.k_layout.row, keys, dim, tid);
  load_tile_async<TileKV, kThreads>(sV, v_tile, params.v_layout.row, keys, dim_v, tid);

  // Warp partitions of the three GEMM shapes.
  const int s_key0 = (warp % Traits::kConfig.s_warps_n) * Traits::kSKeys;
  const int s_query0 = (warp / Traits::kConfig.s_warps_n) * Traits::kSQueries;
  const int dkv_key0 = (warp % Traits::kConfig.dkv_warps_n) * Traits::kDkvKeys;
  const int dkv_col0 = (warp / Traits::kConfig.dkv_warps_n) * Traits::kDkvCols;
  const int dq_row0 = (warp % Traits::kConfig.dq_warps_m) * Traits::kDqRows;
  const int dq_col0 = (warp / Traits::kConfig.dq_warps_m) * Traits::kDqCols;

  float acc_dk[Traits::kDkvMTiles][Traits::kDkvNTiles][4];  // (kDkvKeys, kDkvCols)
  float acc_dv[Traits::kDkvMTiles][Traits::kDkvNTiles][4];  // (kDkvKeys, kDkvCols)
  clear(acc_dk);
  clear(acc_dv);

  // The query tiles that see this key tile: the same key range as the
  // forward's, so the set (and the order rank of this CTA within each query
  // tile, used by the deterministic hand-off) is a pure function of the mask.
  const int m_blocks = (seq.len_q + kBlockM - 1) / kBlockM;
  auto last_visiting_block = [&](int m_block) {  // -1: this key tile is not visited
    const int m0 = m_block * kBlockM, rows = min(kBlockM, seq.len_q - m0);
    const int64_t begin = mask.key_begin(m0), end = mask.key_end(m0 + rows);
    if (end <= begin) return -1;
    const int first = static_cast<int>(begin / kBlockN), last = static_cast<int>((end - 1) / kBlockN);
    return n_block >= first && n_block <= last ? last : -1;
  };
  // Items run heads ascending, query tiles descending, or ascending in
  // deterministic mode. There the key tiles of a query tile add their dQ in
  // descending order, and the last key tiles launch first: every wait is on a
  // CTA that started earlier, and under a causal mask each CTA's first query
  // tile is its diagonal one, where it adds first, so the CTAs of a head do
  // not wait for each other's hand-offs.
  const int h_end = (h_kv + 1) * group;
  auto next_item = [&](int& h, int& m_block) {
    if (m_blocks == 0) return false;
    while (true) {
      m_block += deterministic ? 1 : -1;
      if (m_block < 0 || m_block >= m_blocks) {
        m_block = deterministic ? 0 : m_blocks - 1;
        if (++h >= h_end) return false;
      }
      if (last_visiting_block(m_block) >= 0) return true;
    }
  };
  auto load_item = [&](int stage, int h, int m_block) {
    const int m0 = m_block * kBlockM, rows = min(kBlockM, seq.len_q - m0);
    load_tile_async<TileQ, kThreads>(sQ + stage * TileQ::kElements,
                                     static_cast<const T*>(params.q) + row_offset(params.q_layout, b, seq.q_row0 + m0, h),
                                     params.q_layout.row, rows, dim, tid);
    load_tile_async<TileQ, kThreads>(
        sdO + stage * TileQ::kElements,
        static_cast<const T*>(params.dout) + row_offset(params.dout_layout, b, seq.q_row0 + m0, h),
        params.dout_layout.row, rows, dim_v, tid);
    // LSE and delta through cp.async too: a plain load would stall its warp
    // for the global latency at the start of every item, and the first barrier
    // of the item would hold every other warp behind it. Rows past the end
    // read zero; finish_item_load makes their LSE +inf (P = 0).
    for (int i = tid; i < kBlockM; i += kThreads) {
      const bool valid = i < rows;
      const float* lse = params.lse + (valid ? row_offset(params.lse_layout, b, seq.q_row0 + m0 + i, h) : 0);
      const float* delta = pass.delta + (valid ? int64_t(h) * params.total_q + q_packed0 + m0 + i : 0);
      cp_async_4(sLse + stage * kBlockM + i, lse, valid);
      cp_async_4(sDelta + stage * kBlockM + i, delta, valid);
    }
    cp_async_commit();
  };

  // After cp_async_wait: each thread turns the LSE words it copied into log2
  // units (the barrier that follows publishes them).
  auto finish_item_load = [&](int stage, int m_block) {
    const int rows = min(kBlockM, seq.len_q - m_block * kBlockM);
    for (int i = tid; i < kBlockM; i += kThreads) {
      float& lse = sLse[stage * kBlockM + i];
      lse = i < rows ? lse * kLog2e : INFINITY;
    }
  };

  int* pending_release = nullptr;  // deterministic mode: the semaphore this CTA still has to release
  int pending_value = 0;
  auto compute_item = [&](int stage, int h, int m_block, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int m0 = m_block * kBlockM, rows = min(kBlockM, seq.len_q - m0);
    const T* sQs = sQ + stage * TileQ::kElements;
    const T* sdOs = sdO + stage * TileQ::kElements;
    const float* lse = sLse + stage * kBlockM;  // log2 units, +inf past the end (finish_item_load)
    const float* delta = sDelta + stage * kBlockM;
    const ScoreTransform transform = make_score_transform(params, b, h);
    const float log2_scale = transform.log2_scale();
    const uint32_t batch_head = static_cast<uint32_t>(b * params.heads + h);

    float acc_s[Traits::kSMTiles][Traits::kSNTiles][4];   // S^T: (kSKeys, kSQueries)
    float acc_dp[Traits::kSMTiles][Traits::kSNTiles][4];  // dP^T: (kSKeys, kSQueries)
    clear(acc_s);
    clear(acc_dp);
    gemm_ss<Traits::kSMTiles, Traits::kSNTiles, kHeadDim / 16, false, false, TileKV, TileQ>(
        acc_s, sK, s_key0, sQs, s_query0, lane);
    gemm_ss<Traits::kSMTiles, Traits::kSNTiles, kHeadDim / 16, false, false, TileKV, TileQ>(
        acc_dp, sV, s_key0, sdOs, s_query0, lane);
    const auto& dropout_config = dropout_keys.config();

    // P = exp2(s * log2_scale - lse * log2e); dS = P * (dP_dropped - delta), times
    // the softcap derivative 1 - tanh^2 when a softcap is set.
#pragma unroll
    for (int mi = 0; mi < Traits::kSMTiles; ++mi) {
      // Masked items: each of the thread's two keys of this m16 tile sees a range
      // of queries; as offsets from its first query column, two 32-bit compares.
      constexpr int kQueryColumns = Traits::kSNTiles * 8;
      const int64_t column0 = m0 + s_query0 + 2 * t;
      int first_visible[2] = {0, 0}, end_visible[2] = {kQueryColumns, kQueryColumns};
      if constexpr (kMasked) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int64_t j = n0 + s_key0 + mi * 16 + g + half * 8;
          if constexpr (Traits::kMaskDiagonal) {
            first_visible[half] = MaskPolicy::offset_in_tile(mask.query_begin(j), column0, kQueryColumns);
            end_visible[half] = MaskPolicy::offset_in_tile(mask.query_end(j), column0, kQueryColumns);
          } else {
            end_visible[half] = j < seq.len_k ? kQueryColumns : 0;
          }
        }
      }
#pragma unroll
      for (int ni = 0; ni < Traits::kSNTiles; ++ni) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = s_key0 + mi * 16 + g + (e >> 1) * 8;
          const int query = s_query0 + ni * 8 + 2 * t + (e & 1);
          const int64_t i = m0 + query, j = n0 + key;
          float s = acc_s[mi][ni][e], softcap_grad = 1.0f;
          if (kExtras && transform.active) {
            if (transform.softcap > 0.0f) {
              const float tanh_value = tanhf(s * (transform.scale / transform.softcap));
              s = transform.softcap * tanh_value;
              softcap_grad = 1.0f - tanh_value * tanh_value;
            } else {
              s *= transform.scale;
            }
            if (transform.alibi_slope != 0.0f) s -= transform.alibi_slope * mask.alibi_distance(i, j);
          }
          float p = exp2_approx(s * log2_scale - lse[query]);
          if constexpr (kMasked) {
            const int offset = ni * 8 + (e & 1);
            if (offset < first_visible[e >> 1] || offset >= end_visible[e >> 1]) p = 0.0f;
          }
          float dp = acc_dp[mi][ni][e], p_dropped = p;
          if (kExtras && dropout) {
            const bool keep = dropout_keep(dropout_config, batch_head,
                                           static_cast<uint32_t>(i), static_cast<uint32_t>(j));
            dp = keep ? dp * keep_scale : 0.0f;
            p_dropped = keep ? p * keep_scale : 0.0f;
          }
          acc_s[mi][ni][e] = p_dropped;
          acc_dp[mi][ni][e] = p * (dp - delta[query]) * softcap_grad;
        }
      }
    }
    store_accumulator<T, TileP>(sP, acc_s, s_key0, s_query0, lane);
    store_accumulator<T, TileP>(sdS, acc_dp, s_key0, s_query0, lane);
    __syncthreads();  // P^T and dS^T complete

    gemm_ss<Traits::kDkvMTiles, Traits::kDkvNTiles, kBlockM / 16, false, true, TileP, TileQ>(acc_dv, sP, dkv_key0,
                                                                                             sdOs, dkv_col0, lane);
    gemm_ss<Traits::kDkvMTiles, Traits::kDkvNTiles, kBlockM / 16, false, true, TileP, TileQ>(acc_dk, sdS, dkv_key0,
                                                                                             sQs, dkv_col0, lane);
    float acc_dq[Traits::kDqMTiles][Traits::kDqNTiles][4];  // (kDqRows, kDqCols)
    clear(acc_dq);
    gemm_ss<Traits::kDqMTiles, Traits::kDqNTiles, kBlockN / 16, true, true, TileP, TileKV>(acc_dq, sdS, dq_row0, sK,
                                                                                          dq_col0, lane);

    float* dq_rows = pass.dq_accum + ((q_packed0 + m0) * pass.heads_per_pass + (h - pass.head_begin)) * kHeadDim;
    const int64_t dq_row_stride = int64_t(pass.heads_per_pass) * kHeadDim;
    auto add_dq = [&]() {
#pragma unroll
      for (int mi = 0; mi < Traits::kDqMTiles; ++mi) {
#pragma unroll
        for (int ni = 0; ni < Traits::kDqNTiles; ++ni) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = dq_row0 + mi * 16 + g + half * 8, col = dq_col0 + ni * 8 + 2 * t;
            if (row < rows && col < dim)  // dim is a multiple of 8: col + 1 < dim too
              red_add_f32x2(dq_rows + row * dq_row_stride + col, acc_dq[mi][ni][2 * half],
                            acc_dq[mi][ni][2 * half + 1]);
          }
        }
      }
    };
    if (pass.semaphores != nullptr) {
      // Deterministic: the key tiles of one query tile add their dQ in
      // descending order, so every fp32 sum of the workspace runs in one fixed
      // order. Higher key tiles have lower block indices, were scheduled first,
      // and release before they wait again: the wait cannot deadlock. The
      // release itself is deferred to the next item's first barrier, off this
      // CTA's critical path.
      int* semaphore = pass.semaphores + (int64_t(b) * pass.heads_per_pass + (h - pass.head_begin)) * pass.m_blocks + m_block;
      const int rank = last_visiting_block(m_block) - n_block;
      if (tid == 0)
        while (load_acquire(semaphore) != rank) {
        }
      __syncthreads();
      pending_release = semaphore;
      pending_value = rank + 1;
    }
    add_dq();
  };
  auto release_pending = [&]() {  // after a barrier that follows this CTA's dQ adds
    if (pending_release != nullptr && tid == 0) {
      __threadfence();
      store_release(pending_release, pending_value);
    }
    pending_release = nullptr;
  };

  int h = h_kv * group, m_block = deterministic ? -1 : m_blocks;
  bool has_item = next_item(h, m_block);
  if (has_item) load_item(0, h, m_block);
  else cp_async_commit();
  for (int iteration = 0; has_item; ++iteration) {
    const int stage = kStages == 2 ? (iteration & 1) : 0;
    int next_h = h, next_m = m_block;
    const bool has_next = next_item(next_h, next_m);
    cp_async_wait<0>();
    finish_item_load(stage, m_block);
    __syncthreads();  // this item's Q, dO, LSE, delta landed; everyone is done with the other stage
    release_pending();
    if (kStages == 2 && has_next) load_item(stage ^ 1, next_h, next_m);
    const int m0 = m_block * kBlockM, rows = min(kBlockM, seq.len_q - m0);
    const bool visible = mask.tile_fully_visible(m0, m0 + rows, n0, n0 + kBlockN);
    if (visible) compute_item(stage, h, m_block, std::false_type{});
    else compute_item(stage, h, m_block, std::true_type{});
    if (kStages == 1 && has_next) {
      __syncthreads();  // every warp is done with Q, dO
      load_item(0, next_h, next_m);
    }
    h = next_h;
    m_block = next_m;
    has_item = has_next;
  }
  cp_async_wait<0>();
  __syncthreads();  // K, V no longer read: reuse them for dK, dV
  release_pending();

  store_accumulator<T, TileKV>(sK, acc_dk, dkv_key0, dkv_col0, lane, params.softmax_scale);
  store_accumulator<T, TileKV>(sV, acc_dv, dkv_key0, dkv_col0, lane);
  __syncthreads();
  T* dk_tile = static_cast<T*>(params.dk) + row_offset(params.dk_layout, b, seq.k_row0 + n0, h_kv);
  T* dv_tile = static_cast<T*>(params.dv) + row_offset(params.dv_layout, b, seq.k_row0 + n0, h_kv);
  store_tile<TileKV>(dk_tile, params.dk_layout.row, sK, 0, keys, dim, tid, kThreads);
  store_tile<TileKV>(dv_tile, params.dv_layout.row, sV, 0, keys, dim_v, tid, kThreads);
}

}  // namespace flashattn::sm80
