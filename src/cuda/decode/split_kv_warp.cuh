// Split-KV ("flash-decoding") attention against a KV cache, warp-streamed variant, for sm_80 and sm_90a.
//
// Decode reads every K/V byte of the cache once and does little math per byte
// (R = Sq * G packed rows x (D + Dv) FMAs per key, G = H / Hkv), so the kernel
// is built for bytes in flight, not for tensor cores: each warp streams its own
// keys through a private ring of kStages shared-memory stages filled by
// cp.async (16 KiB in flight per warp, no registers held by the loads), with
// no block-wide barrier in the loop. Each lane copies exactly the chunks it
// later reads, so waiting for its own copies (cp.async.wait_group) suffices.
//
// Lane map: kLanesPerKey = kHeadDim / 8 lanes hold one key row, 8 dims each;
// a warp holds kGroups = 32 / kLanesPerKey key rows at a time. Every lane
// group keeps its own online-softmax state (m, l, O) for its rows, so the loop
// needs only the butterfly sum of a dot product inside a group. At the end the
// kWarps * kGroups states of the block are merged exactly through shared memory.
// The default build runs it for head-dim class 256 only (the tensor-core kernel
// of split_kv_mma.cuh takes 64 and 128); -DFLASHATTN_CUDA_DECODE=warp for all.
// Measured on the H200: 0.27-1.3 TB/s, bound by instruction issue (ncu: 174
// warp instructions per key), dev/kvcache_decode.md.
//
// Block: kWarps warps, rows r = i * G + g (query i, head g of the group) of one
// (batch row, kv head), at most kRows per block (more rows: gridDim.y blocks).
#pragma once

#include "cuda/decode/block_merge.cuh"
#include "cuda/decode/kvcache_kernel.cuh"
#include "cuda/decode/kvcache_launch.hpp"

namespace flashattn::cuda::decode {

template <typename Element, int kHeadDim_, int kRows_>
struct SplitKvWarpTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kRows = kRows_;    // packed query rows per block (registers: q and O per row)
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kLanesPerKey = kHeadDim / 8;  // 16-byte chunks of one key row
  static constexpr int kGroups = 32 / kLanesPerKey;  // key rows per warp step
  static constexpr int kUnroll = 4;                  // warp steps per stage
  static constexpr int kStages = 4;                  // stages per warp: kStages - 1 in flight while one is used
  static constexpr int kKeysPerWarpIter = kGroups * kUnroll;
  static constexpr int kKeysPerBlockIter = kKeysPerWarpIter * kWarps;
  static constexpr int kStates = kWarps * kGroups;   // softmax states merged at the end
  // Resident blocks per SM asked of the register allocator (kvcache_launch.hpp's blocks_per_sm):
  // 3 x 64 KiB of ring fit the 227 KiB of an SM; with 4 rows, 168 registers hold q, O and the state.
  static constexpr int kMinBlocks = kRows <= 4 ? 3 : 2;
  static_assert(kLanesPerKey <= 32 && 32 % kLanesPerKey == 0, "a key row fits a warp");
  // Ring: (kWarps, kStages, K|V, kUnroll, 32 lanes) 16-byte chunks = 64 KiB; reused after the loop
  // for the merge: O (kStates, kRows, kHeadDim), m and l (kStates, kRows), fp32.
  static constexpr size_t ring_bytes() { return size_t(kWarps) * kStages * 2 * kUnroll * 32 * 16; }
  static constexpr size_t merge_bytes() { return BlockStates<kStates, kRows, kHeadDim>::bytes(); }
  static constexpr size_t smem_bytes() { return ring_bytes() > merge_bytes() ? ring_bytes() : merge_bytes(); }
};

// Element offset of cache position `position` (kv head 0) of batch row b, -1 for a page outside the cache.
// Positions fit int32 (checked on the host): the page division is a 32-bit one.
__device__ __forceinline__ int64_t row_offset(const KvCacheParams& p, const TensorLayout& layout,
                                              const CacheRow& row, int64_t b, int position, int& block) {
  if (!p.paged) return row.cache_index * layout.batch + int64_t(position) * layout.row;
  const int page_rows = static_cast<int>(p.page_rows);
  const int page = position / page_rows;
  if (block < 0) block = __ldg(p.block_table + b * p.block_table_stride + page);
  if (block < 0 || block >= p.cache_batch) return -1;
  return int64_t(block) * layout.batch + int64_t(position - page * page_rows) * layout.row;
}

template <typename Element>
__device__ __forceinline__ void unpack8(const uint4& packed, float (&out)[8]) {
  const Element* e = reinterpret_cast<const Element*>(&packed);
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = to_float(e[k]);
}

// Grid (splits, row blocks, B * Hkv). Writes out/lse directly when splits == 1,
// else fp32 partials: o_partial (splits, B * Hkv, rows_padded, Dv), lse_partial (splits, B * Hkv, rows_padded).
template <typename Traits, typename Element>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocks)
    split_kv_warp_kernel(const KvCacheParams p, float* o_partial, float* lse_partial, int rows_padded) {
  constexpr int kRows = Traits::kRows, kUnroll = Traits::kUnroll, kGroups = Traits::kGroups;
  constexpr int kLanesPerKey = Traits::kLanesPerKey, kHeadDim = Traits::kHeadDim;
  extern __shared__ __align__(16) uint4 smem_chunks[];
  const BlockStates<Traits::kStates, kRows, kHeadDim> states(reinterpret_cast<float*>(smem_chunks));  // after the loop
  wait_for_prerequisite_grids();  // launched early after the stream's previous kernel: nothing read before

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int group = lane / kLanesPerKey;   // which key row of a step this lane works on
  const int dim0 = 8 * (lane % kLanesPerKey);  // its 8 dims
  const int split = blockIdx.x, splits = gridDim.x;
  const int64_t b = blockIdx.z / p.heads_kv, hkv = blockIdx.z % p.heads_kv;
  const int64_t heads_per_kv = p.heads / p.heads_kv;
  const int64_t r0 = int64_t(blockIdx.y) * kRows;
  const int nrows = static_cast<int>(min(int64_t(kRows), p.seqlen_q * heads_per_kv - r0));
  const CacheRow row = bounded_row(p, b);
  const MaskPolicy mask = row.mask(p);
  const int d_count = static_cast<int>(p.head_dim), dv_count = static_cast<int>(p.head_dim_v);
  const bool k_lane = dim0 < d_count, v_lane = dim0 < dv_count;

  // This lane's 8 dims of every row of q, rotated, rounded to the element type, then scaled.
  // Row r sees keys [key_lo[r], key_hi[r]) (the mask policy as an interval, 32-bit: positions
  // fit int32) and its ALiBi distance to key j is |diagonal[r] - j|.
  float q[kRows][8];
  int key_lo[kRows], key_hi[kRows], diagonal[kRows];
  float slope[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t query = (r0 + r) / heads_per_kv;
    key_lo[r] = static_cast<int>(mask.key_begin(query));
    key_hi[r] = r < nrows ? static_cast<int>(mask.key_end(query + 1)) : 0;
    diagonal[r] = static_cast<int>(query + mask.shift);
    slope[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) q[r][e] = 0.0f;
    if (r >= nrows) continue;
    const int64_t h = hkv * heads_per_kv + (r0 + r) % heads_per_kv;
    if (p.alibi_slopes != nullptr) slope[r] = p.alibi_slopes[b * p.alibi_batch_stride + h];
    if (!k_lane) continue;
    const Element* q_row = static_cast<const Element*>(p.q) + b * p.q_layout.batch + query * p.q_layout.row +
                           h * p.q_layout.head;
    const int64_t position = query_rotary_position(p, row, query);
#pragma unroll
    for (int e = 0; e < 8; ++e) q[r][e] = rotated_element(p, q_row, dim0 + e, position) * p.softmax_scale;
  }

  const int64_t i_first = r0 / heads_per_kv, i_last = (r0 + nrows - 1) / heads_per_kv;
  const KeyRange range = split_range<kKeysPerTile>(mask.key_begin(i_first), mask.key_end(i_last + 1), split, splits);
  const int keys_begin = static_cast<int>(range.begin), keys_end = static_cast<int>(range.end);

  // Online softmax state of this lane group. Invariant: o = sum_j exp(s_j - m) v_j and
  // l = sum_j exp(s_j - m) over the keys seen; a new maximum rescales both by exp(m_old - m_new).
  float m[kRows], l[kRows], o[kRows][8];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[r][e] = 0.0f;
  }

  const Element* k_base = static_cast<const Element*>(p.k_cache) + hkv * p.k_cache_layout.head + dim0;
  const Element* v_base = static_cast<const Element*>(p.v_cache) + hkv * p.v_cache_layout.head + dim0;
  // This lane's chunks of stage `stage`: K at [u * 32], V at [kUnroll * 32 + u * 32].
  auto stage_chunks = [&](int stage) { return smem_chunks + ((warp * Traits::kStages + stage) * 2 * kUnroll) * 32 + lane; };
  // Paged: the block-table entries of the next issue's keys are fetched one step ahead, so the
  // cp.async of a step never waits for a table read (-1: no key, or contiguous cache).
  const int page_rows = static_cast<int>(p.page_rows);
  auto table_entry = [&](int j) {
    if (!p.paged || j >= keys_end) return -1;
    return __ldg(p.block_table + b * p.block_table_stride + static_cast<int>(row.leftpad + j) / page_rows);
  };
  int table_ahead[kUnroll];
  // Keys base + u * kGroups + group, u < kUnroll, into `stage`; absent keys and pages are zero-filled.
  auto issue = [&](int base, int stage) {
    uint4* chunks = stage_chunks(stage);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kGroups + group;
      int64_t k_off = -1, v_off = -1;
      if (j < keys_end) {
        const int position = static_cast<int>(row.leftpad + j);
        int block = table_ahead[u];
        k_off = row_offset(p, p.k_cache_layout, row, b, position, block);
        v_off = row_offset(p, p.v_cache_layout, row, b, position, block);
      }
      cp_async_16(chunks + u * 32, k_base + (k_off > 0 ? k_off : 0), k_lane && k_off >= 0);
      cp_async_16(chunks + (kUnroll + u) * 32, v_base + (v_off > 0 ? v_off : 0), v_lane && v_off >= 0);
    }
    cp_async_commit();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) table_ahead[u] = table_entry(base + Traits::kKeysPerBlockIter + u * kGroups + group);
  };
  auto compute = [&](int base, int stage) {
    const uint4* chunks = stage_chunks(stage);
    float s[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = base + u * kGroups + group;
      float kf[8];
      unpack8<Element>(chunks[u * 32], kf);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(q[r][e], kf[e], dot);
        // Sum over the kLanesPerKey lanes of this key row (xor offsets stay inside the group).
#pragma unroll
        for (int offset = kLanesPerKey / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        float score = -INFINITY;
        if (j >= key_lo[r] && j < key_hi[r] && j < keys_end) {
          score = dot;
          if (p.softcap > 0.0f) score = p.softcap * tanhf(score / p.softcap);
          if (slope[r] != 0.0f) score -= slope[r] * static_cast<float>(abs(diagonal[r] - j));
        }
        s[u][r] = score;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float step_max = s[0][r];
#pragma unroll
      for (int u = 1; u < kUnroll; ++u) step_max = fmaxf(step_max, s[u][r]);
      const float m_new = fmaxf(m[r], step_max);
      const bool any = m_new != -INFINITY;  // uniform in the group: every lane of it holds the same scores
      const float alpha = any ? __expf(m[r] - m_new) : 1.0f;
      l[r] *= alpha;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[r][e] *= alpha;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        s[u][r] = any ? __expf(s[u][r] - m_new) : 0.0f;
        l[r] += s[u][r];
      }
      m[r] = m_new;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float vf[8];
      unpack8<Element>(chunks[(kUnroll + u) * 32], vf);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) o[r][e] = fmaf(s[u][r], vf[e], o[r][e]);
    }
  };

  // Step n of this warp covers keys base0 + n * stride ..; kStages - 1 steps are in flight.
  constexpr int stride = Traits::kKeysPerBlockIter;
  const int base0 = keys_begin + warp * Traits::kKeysPerWarpIter;
  const int steps = base0 < keys_end ? (keys_end - base0 + stride - 1) / stride : 0;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) table_ahead[u] = table_entry(base0 + u * kGroups + group);
#pragma unroll
  for (int n = 0; n < Traits::kStages - 1; ++n) {
    if (n < steps) {
      issue(base0 + n * stride, n);
    } else {
      cp_async_commit();  // empty group: the wait count below stays uniform
    }
  }
  for (int n = 0; n < steps; ++n) {
    const int ahead = n + Traits::kStages - 1;
    if (ahead < steps) {
      issue(base0 + ahead * stride, ahead % Traits::kStages);  // the stage step n - 1 used
    } else {
      cp_async_commit();
    }
    cp_async_wait<Traits::kStages - 1>();  // this lane's copies of step n have landed
    compute(base0 + n * stride, n % Traits::kStages);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the merge buffer

  const int state = warp * kGroups + group;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (lane % kLanesPerKey == 0) {
      states.m[state * kRows + r] = m[r];
      states.l[state * kRows + r] = l[r];
    }
    float* dst = states.o + (state * kRows + r) * kHeadDim + dim0;
    *reinterpret_cast<float4*>(dst) = make_float4(o[r][0], o[r][1], o[r][2], o[r][3]);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(o[r][4], o[r][5], o[r][6], o[r][7]);
  }
  __syncthreads();
  merge_and_store<Traits::kStates, kRows, kHeadDim, Element>(p, states, nrows, r0, b, hkv, o_partial, lse_partial,
                                                             rows_padded);
}

}  // namespace flashattn::cuda::decode
