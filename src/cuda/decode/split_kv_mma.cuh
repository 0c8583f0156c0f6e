// Split-KV ("flash-decoding") attention against a KV cache on tensor cores,
// for sm_80 and sm_90a, head-dim classes 64 and 128.
//
// Why tensor cores for a memory-bound kernel: the CUDA-core kernel of
// split_kv_warp.cuh issued 174 warp instructions per key (ncu, H200, B = 64,
// 32k: 2.9 G instructions, 1.6 IPC, 20 % of DRAM bandwidth) — the dot products'
// shuffles and a softmax replicated on every lane of a key row. Here S = Q K^T
// and O += P V are mma.sync m16n8k16 with the packed query rows as M (16,
// padded), and the softmax runs once per element of the accumulators, so a key
// costs about ten instructions and the kernel can wait on DRAM only.
//
// No ldmatrix and no block barrier in the loop: every lane copies (cp.async)
// exactly the 16-byte chunks it later reads as its own mma fragments, into a
// private ring of kStages slabs per warp, and waits for its own copies only.
// That works because the fragment layouts leave freedom in the order of the
// reduced dimension:
//   S = Q K^T reduces over dims. Lane (g, t) = (lane / 4, lane % 4) of n-tile
//     n holds key 8n + g; it copies dims 32 blk + 8t .. + 7 of that key, and
//     the mma's k index 2t + e (+8) stands for dim 32 blk + 8t + e (+2) in the
//     first k-step of the block and + 4 (+6) in the second. Q's A fragments
//     are built once with the same order, so the sum is the dot product.
//   O += P V reduces over keys, which P's accumulator layout fixes (lane (g, t)
//     holds keys 2t, 2t+1, 2t+8, 2t+9 of the slab); the output dims are free:
//     column g of n-tile (h, i) stands for dim 64 h + 8 g + i. So the lane
//     copies dims 64 h + 8g .. + 7 of its four keys, one chunk each, and pairs
//     keys with a byte permute into the B fragments of n-tiles (h, 0..7).
// Block: kWarps warps on one (split, row block, batch row x kv head); each warp
// streams every kWarps-th slab of 16 keys of the split; the warps' softmax
// states are merged at the end (block_merge.cuh).
#pragma once

#include "cuda/decode/block_merge.cuh"
#include "cuda/decode/kvcache_kernel.cuh"
#include "cuda/decode/kvcache_launch.hpp"
#include "cuda/sm80/mma.cuh"

namespace flashattn::cuda::decode {

template <typename Element, int kHeadDim_>
struct SplitKvMmaTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kRows = 16;  // M of the mma: packed query rows per block
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kSlabKeys = 16;                  // keys per warp step: the k of P V
  static constexpr int kKeyBlocks = kHeadDim / 32;      // S: 16-byte chunks per lane per n-tile of keys
  static constexpr int kValueHalves = kHeadDim / 64;    // P V: 16-byte chunks per lane per key
  static constexpr int kKeyChunks = 2 * kKeyBlocks;     // per lane per slab: 2 n-tiles of 8 keys
  static constexpr int kValueChunks = 4 * kValueHalves; // per lane per slab: 4 keys
  static constexpr int kChunks = kKeyChunks + kValueChunks;
  static constexpr int kOutTiles = 8 * kValueHalves;    // n-tiles of 8 output dims
  static constexpr int kStages = kHeadDim <= 64 ? 4 : 3;  // slabs per warp: kStages - 1 in flight
  static constexpr int kKeysPerBlockIter = kWarps * kSlabKeys;
  static constexpr int kMinBlocks = 2;
  static_assert(kHeadDim % 64 == 0, "the dim orders above need 64-dim halves");
  static_assert(kKeysPerBlockIter == kKeysPerTile, "splits come in whole block steps");
  static_assert(kChunks * 32 * 16 == kSlabKeys * 2 * kHeadDim * 2, "32 lanes copy a slab of K and V");
  // Ring: (kWarps, kStages, kChunks, 32 lanes) 16-byte chunks (96 KiB at hdim 128: 2 blocks per SM),
  // reused after the loop for the merge.
  static constexpr size_t ring_bytes() { return size_t(kWarps) * kStages * kChunks * 32 * 16; }
  static constexpr size_t merge_bytes() { return BlockStates<kWarps, kRows, kHeadDim>::bytes(); }
  static constexpr size_t smem_bytes() { return ring_bytes() > merge_bytes() ? ring_bytes() : merge_bytes(); }
};

// Where one lane's key of a stream is in the cache, advanced slab step by slab
// step without a division: (page, within) with within < page_rows, and the block
// of `page` read one step ahead. A contiguous cache is one page that never ends.
struct KeyStream {
  int key;          // key index (relative to the row's leftpad) of the next slab to issue
  uint32_t page, within;
  int block;        // cache block of `page`, -1 when outside the cache or past the keys
};

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Grid (splits, row blocks, B * Hkv). Writes out/lse directly when splits == 1,
// else fp32 partials: o_partial (splits, B * Hkv, rows_padded, Dv), lse_partial (splits, B * Hkv, rows_padded).
template <typename Traits, typename Element>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocks)
    split_kv_mma_kernel(const KvCacheParams p, float* o_partial, float* lse_partial, int rows_padded) {
  constexpr int kRows = Traits::kRows, kHeadDim = Traits::kHeadDim, kChunks = Traits::kChunks;
  constexpr int kKeyBlocks = Traits::kKeyBlocks, kValueHalves = Traits::kValueHalves;
  constexpr int kKeyChunks = Traits::kKeyChunks, kStages = Traits::kStages;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) uint4 smem_chunks[];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;  // fragment row group and column pair
  const int64_t b = blockIdx.z / p.heads_kv, hkv = blockIdx.z % p.heads_kv;
  const int64_t heads_per_kv = p.heads / p.heads_kv;
  const int64_t r0 = int64_t(blockIdx.y) * kRows;
  const int nrows = static_cast<int>(min(int64_t(kRows), p.seqlen_q * heads_per_kv - r0));
  const CacheRow row = bounded_row(p, b);
  const MaskPolicy mask = row.mask(p);
  const int d_count = static_cast<int>(p.head_dim), dv_count = static_cast<int>(p.head_dim_v);

  // Q as A fragments in the dim order above: q_frag[blk][half] holds dims 32 blk + 8t .. + 7 of
  // row g + 8 half, rotated and rounded to the element type (as the cache holds k); zero past D
  // and for padding rows. Each of this lane's two rows sees keys [key_lo, key_hi).
  uint4 q_frag[kKeyBlocks][2];
  int key_lo[2], key_hi[2], diagonal[2];
  float slope[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    const int64_t query = (r0 + r) / heads_per_kv;
    const bool real = r < nrows;
    key_lo[half] = static_cast<int>(mask.key_begin(query));
    key_hi[half] = real ? static_cast<int>(mask.key_end(query + 1)) : 0;
    diagonal[half] = static_cast<int>(query + mask.shift);
    const int64_t h = hkv * heads_per_kv + (r0 + r) % heads_per_kv;
    slope[half] = real && p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.0f;
    const Element* q_row = static_cast<const Element*>(p.q) + b * p.q_layout.batch + query * p.q_layout.row +
                           h * p.q_layout.head;
    const int64_t position = real ? query_rotary_position(p, row, query) : 0;
#pragma unroll
    for (int blk = 0; blk < kKeyBlocks; ++blk) {
      uint32_t words[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int d = 32 * blk + 8 * t + 2 * w;
        const float lo = real && d < d_count ? rotated_element(p, q_row, d, position) : 0.0f;
        const float hi = real && d + 1 < d_count ? rotated_element(p, q_row, d + 1, position) : 0.0f;
        words[w] = sm80::Pack2<Element>::pack(lo, hi);
      }
      q_frag[blk][half] = make_uint4(words[0], words[1], words[2], words[3]);
    }
  }

  const int64_t i_first = r0 / heads_per_kv, i_last = (r0 + nrows - 1) / heads_per_kv;
  const KeyRange range = split_range<kKeysPerTile>(mask.key_begin(i_first), mask.key_end(i_last + 1),
                                                   blockIdx.x, gridDim.x);
  const int keys_begin = static_cast<int>(range.begin), keys_end = static_cast<int>(range.end);
  // Slabs inside [plain_lo, plain_hi) are visible to every row of the block: no mask arithmetic.
  const bool plain_scores = p.softcap <= 0.0f && p.alibi_slopes == nullptr;
  const int plain_lo = static_cast<int>(mask.key_begin(i_last));
  const int plain_hi = min(static_cast<int>(mask.key_end(i_first + 1)), keys_end);
  const float score_scale = p.softmax_scale * kLog2e;  // scores in log2 units

  // Six key streams per lane: 0-1 for K (keys 8n + g of n-tile n), 2-5 for V (keys 2t, 2t+1,
  // 2t+8, 2t+9). A contiguous cache is one endless page of block cache_index.
  constexpr int kStreams = 6;
  const uint32_t page_rows = p.paged ? static_cast<uint32_t>(p.page_rows) : 0xffffffffu;
  const uint32_t step_pages = Traits::kKeysPerBlockIter / page_rows;
  const uint32_t step_within = Traits::kKeysPerBlockIter % page_rows;
  auto block_of = [&](const KeyStream& s) -> int {
    if (s.key >= keys_end) return -1;
    if (!p.paged) return static_cast<int>(row.cache_index);
    const int block = __ldg(p.block_table + b * p.block_table_stride + s.page);
    return block >= 0 && block < p.cache_batch ? block : -1;
  };
  KeyStream streams[kStreams];
  const int base0 = keys_begin + warp * Traits::kSlabKeys;
#pragma unroll
  for (int s = 0; s < kStreams; ++s) {
    const int offset = s < 2 ? 8 * s + g : 2 * t + ((s - 2) & 1) + 8 * ((s - 2) >> 1);
    streams[s].key = base0 + offset;
    const uint32_t position = static_cast<uint32_t>(row.leftpad + streams[s].key);
    streams[s].page = position / page_rows;
    streams[s].within = position % page_rows;
    streams[s].block = block_of(streams[s]);
  }

  const Element* k_lane = static_cast<const Element*>(p.k_cache) + hkv * p.k_cache_layout.head + 8 * t;
  const Element* v_lane = static_cast<const Element*>(p.v_cache) + hkv * p.v_cache_layout.head + 8 * g;
  auto lane_ring = [&](int stage) { return smem_chunks + (warp * kStages + stage) * kChunks * 32 + lane; };
  // Copies the next slab of every stream into `stage` (absent keys and pages: zeros), then steps on.
  auto issue = [&](int stage) {
    uint4* ring = lane_ring(stage);
#pragma unroll
    for (int s = 0; s < kStreams; ++s) {
      const KeyStream& st = streams[s];
      const bool present = st.block >= 0;
      if (s < 2) {
        const Element* src = k_lane + (present ? int64_t(st.block) * p.k_cache_layout.batch +
                                                     int64_t(st.within) * p.k_cache_layout.row
                                               : 0);
#pragma unroll
        for (int blk = 0; blk < kKeyBlocks; ++blk)
          cp_async_16(ring + (s * kKeyBlocks + blk) * 32, src + 32 * blk, present && 32 * blk + 8 * t < d_count);
      } else {
        const Element* src = v_lane + (present ? int64_t(st.block) * p.v_cache_layout.batch +
                                                     int64_t(st.within) * p.v_cache_layout.row
                                               : 0);
#pragma unroll
        for (int h = 0; h < kValueHalves; ++h)
          cp_async_16(ring + (kKeyChunks + (s - 2) * kValueHalves + h) * 32, src + 64 * h,
                      present && 64 * h + 8 * g < dv_count);
      }
    }
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < kStreams; ++s) {
      KeyStream& st = streams[s];
      st.key += Traits::kKeysPerBlockIter;
      st.page += step_pages;
      st.within += step_within;
      if (st.within >= page_rows) {
        st.within -= page_rows;
        ++st.page;
      }
      st.block = block_of(st);
    }
  };

  // Online softmax state of rows g and g + 8 over this lane's columns (m is the same on the 4 lanes
  // of a row, l a partial sum): o = sum_j 2^(x_j - m) v_j, l = sum_j 2^(x_j - m), x in log2 units.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o_acc[Traits::kOutTiles][4];
#pragma unroll
  for (int n = 0; n < Traits::kOutTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[n][e] = 0.0f;

  auto compute = [&](int j0, int stage) {
    const uint4* ring = lane_ring(stage);
    float s_acc[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[n][e] = 0.0f;
#pragma unroll
      for (int blk = 0; blk < kKeyBlocks; ++blk) {
        const uint4 k = ring[(n * kKeyBlocks + blk) * 32];
        const uint4 q_lo = q_frag[blk][0], q_hi = q_frag[blk][1];
        sm80::mma_16816<Element>(s_acc[n], {q_lo.x, q_hi.x, q_lo.y, q_hi.y}, k.x, k.y);
        sm80::mma_16816<Element>(s_acc[n], {q_lo.z, q_hi.z, q_lo.w, q_hi.w}, k.z, k.w);
      }
    }
    // Scores in log2 units; s_acc[n][2 half + e] is row g + 8 half, key j0 + 8n + 2t + e.
    const bool plain = plain_scores && j0 >= plain_lo && j0 + Traits::kSlabKeys <= plain_hi;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s_acc[n][2 * half + e];
          if (plain) {
            x *= score_scale;
            continue;
          }
          const int j = j0 + 8 * n + 2 * t + e;
          float score = x * p.softmax_scale;
          if (p.softcap > 0.0f) score = p.softcap * tanhf(score / p.softcap);
          score -= slope[half] * static_cast<float>(abs(diagonal[half] - j));
          x = j >= key_lo[half] && j < key_hi[half] && j < keys_end ? score * kLog2e : -INFINITY;
        }
    float alpha[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float slab_max = fmaxf(fmaxf(s_acc[0][2 * half], s_acc[0][2 * half + 1]),
                             fmaxf(s_acc[1][2 * half], s_acc[1][2 * half + 1]));
      slab_max = fmaxf(slab_max, __shfl_xor_sync(0xffffffffu, slab_max, 1));
      slab_max = fmaxf(slab_max, __shfl_xor_sync(0xffffffffu, slab_max, 2));
      const float m_new = fmaxf(m[half], slab_max);
      const bool any = m_new != -INFINITY;  // else every probability is 0 and nothing rescales
      alpha[half] = any ? exp2f(m[half] - m_new) : 1.0f;
      const float m_use = any ? m_new : 0.0f;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s_acc[n][2 * half + e];
          x = exp2f(x - m_use);
          l[half] = l[half] * (e == 0 && n == 0 ? alpha[half] : 1.0f) + x;
        }
      m[half] = m_new;
    }
    // The maximum settles after a few slabs: skip the rescale when no row of the warp moved.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < Traits::kOutTiles; ++n) {
        o_acc[n][0] *= alpha[0];
        o_acc[n][1] *= alpha[0];
        o_acc[n][2] *= alpha[1];
        o_acc[n][3] *= alpha[1];
      }
    }
    // P as the A fragment of the slab (k = 16 keys): the accumulator layout of the two n-tiles.
    const uint32_t p_frag[4] = {sm80::Pack2<Element>::pack(s_acc[0][0], s_acc[0][1]),
                                sm80::Pack2<Element>::pack(s_acc[0][2], s_acc[0][3]),
                                sm80::Pack2<Element>::pack(s_acc[1][0], s_acc[1][1]),
                                sm80::Pack2<Element>::pack(s_acc[1][2], s_acc[1][3])};
#pragma unroll
    for (int h = 0; h < kValueHalves; ++h) {
      // Keys 2t, 2t+1, 2t+8, 2t+9; dims 64 h + 8g .. + 7 each.
      const uint4 v0 = ring[(kKeyChunks + 0 * kValueHalves + h) * 32];
      const uint4 v1 = ring[(kKeyChunks + 1 * kValueHalves + h) * 32];
      const uint4 v2 = ring[(kKeyChunks + 2 * kValueHalves + h) * 32];
      const uint4 v3 = ring[(kKeyChunks + 3 * kValueHalves + h) * 32];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t select = i % 2 == 0 ? 0x5410u : 0x7632u;  // low or high halves of a word pair
        const uint32_t b0 = __byte_perm(word_of(v0, i / 2), word_of(v1, i / 2), select);
        const uint32_t b1 = __byte_perm(word_of(v2, i / 2), word_of(v3, i / 2), select);
        sm80::mma_16816<Element>(o_acc[8 * h + i], p_frag, b0, b1);
      }
    }
  };

  // Step n of this warp is the slab at base0 + n * kKeysPerBlockIter; kStages - 1 slabs in flight.
  constexpr int stride = Traits::kKeysPerBlockIter;
  const int steps = base0 < keys_end ? (keys_end - base0 + stride - 1) / stride : 0;
#pragma unroll
  for (int n = 0; n < kStages - 1; ++n) {
    if (n < steps) {
      issue(n);
    } else {
      cp_async_commit();  // empty group: the wait count below stays uniform
    }
  }
  for (int n = 0; n < steps; ++n) {
    if (n + kStages - 1 < steps) {
      issue((n + kStages - 1) % kStages);  // the stage step n - 1 used
    } else {
      cp_async_commit();
    }
    cp_async_wait<kStages - 1>();  // this lane's copies of step n have landed
    compute(base0 + n * stride, n % kStages);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the merge buffer

  // This warp's state: l summed over the 4 lanes of each row, m to natural-log units.
  const BlockStates<Traits::kWarps, kRows, kHeadDim> states(reinterpret_cast<float*>(smem_chunks));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float row_l = l[half];
    row_l += __shfl_xor_sync(0xffffffffu, row_l, 1);
    row_l += __shfl_xor_sync(0xffffffffu, row_l, 2);
    const int r = g + 8 * half;
    if (t == 0) {
      states.m[warp * kRows + r] = m[half] == -INFINITY ? -INFINITY : m[half] / kLog2e;
      states.l[warp * kRows + r] = row_l;
    }
    float* o_row = states.o + (warp * kRows + r) * kHeadDim;
#pragma unroll
    for (int h = 0; h < kValueHalves; ++h)
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) o_row[64 * h + 8 * (2 * t + e) + i] = o_acc[8 * h + i][2 * half + e];
  }
  __syncthreads();
  merge_and_store<Traits::kWarps, kRows, kHeadDim, Element>(p, states, nrows, r0, b, hkv, o_partial, lse_partial,
                                                            rows_padded);
}

}  // namespace flashattn::cuda::decode
