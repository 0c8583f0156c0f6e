// Split-KV ("flash-decoding") attention against a KV cache with block-wide tiles (v1,
// -DFLASHATTN_CUDA_DECODE=tiles), for sm_80 and sm_90a.
//
// Decode reads every K/V byte of the cache once and does little math per byte
// (Sq * G rows x (D + Dv) FMAs per key, G = H / Hkv), so the kernel is built
// for bandwidth, not tensor cores: plain fp32 FMAs, K/V tiles streamed into
// shared memory with cp.async (two stages: one tile in flight while the other
// is consumed), and the G query heads of one KV head (times the Sq queries)
// packed into the rows of one block so that each cache row is fetched once.
// When B * Hkv blocks cannot fill the GPU, the keys are split over gridDim.x:
// each split writes O / l and its LSE in fp32 and the last split block of its
// rows to finish merges them (merge_splits_if_last, block_merge.cuh).
//
// Block: kThreads threads, rows r = i * G + g of one (batch row, kv head),
// kRows of them per block (more rows: more blocks along gridDim.y).
//   Q  smem fp32 (kRows, kHeadDim), rotated and rounded to the element type
//   K  smem (kStages, kBlockN, kHeadDim + 8), V alike; +8 elements of padding
//      put consecutive rows 4 banks apart, so 16-byte reads are conflict-free
//   S  smem fp32 (kRows, kBlockN): scores, then probabilities
#pragma once

#include "cuda/decode/block_merge.cuh"
#include "cuda/decode/kvcache_kernel.cuh"
#include "cuda/decode/kvcache_launch.hpp"

namespace flashattn::cuda::decode {

template <typename Element, int kHeadDim_>
struct DecodeTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kThreads = 128;
  static constexpr int kBlockN = 64;  // keys per tile: 16 KiB of K + 16 KiB of V at D = 128
  static constexpr int kRows = 16;    // packed query rows per block
  static constexpr int kStages = 2;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per head vector
  static constexpr int kRowStride = kHeadDim + 8;
  // Scores: thread t owns key t % kBlockN and rows t / kBlockN + kScoreLanes * k.
  static constexpr int kScoreLanes = kThreads / kBlockN;
  static constexpr int kScoreRows = kRows / kScoreLanes;
  // P V: thread t owns dims 4 * (t % kDimGroups) .. +3 and rows t / kDimGroups + kOutLanes * k.
  static constexpr int kDimGroups = kHeadDim / 4;
  static constexpr int kOutLanes = kThreads / kDimGroups;
  static constexpr int kOutRows = kRows / kOutLanes;
  // Loads: kChunks consecutive threads move one key row, kLoadKeys rows per pass.
  static constexpr int kLoadKeys = kThreads / kChunks;
  static_assert(kThreads % kBlockN == 0 && kThreads % kDimGroups == 0 && kThreads % kChunks == 0, "thread maps");
  static_assert(kBlockN % kLoadKeys == 0 && kRows % kScoreLanes == 0 && kRows % kOutLanes == 0, "thread maps");

  static constexpr int kTileElems = kBlockN * kRowStride;
  static_assert(size_t(kStages) * kTileElems * sizeof(Element) >= sizeof(float) * kMaxSplits * kRows,
                "the K tiles hold the split merge's weights");
  static constexpr size_t smem_bytes() {
    return size_t(2) * kStages * kTileElems * sizeof(Element) + size_t(kRows) * kHeadDim * 4 +
           size_t(kRows) * kBlockN * 4 + size_t(3) * kRows * 4;
  }
};

// Grid (splits, row blocks, B * Hkv). Writes out/lse directly when splits == 1, else its fp32
// partials, and the last split block of its rows merges them into out/lse.
template <typename Traits, typename Element>
__global__ void __launch_bounds__(Traits::kThreads)
    split_kv_kernel(const KvCacheParams p, const SplitPartials partials) {
  constexpr int kThreads = Traits::kThreads, kBlockN = Traits::kBlockN, kRows = Traits::kRows;
  constexpr int kHeadDim = Traits::kHeadDim, kRowStride = Traits::kRowStride, kChunks = Traits::kChunks;
  extern __shared__ __align__(16) unsigned char smem[];
  Element* k_tiles = reinterpret_cast<Element*>(smem);      // (kStages, kBlockN, kRowStride)
  Element* v_tiles = k_tiles + Traits::kStages * Traits::kTileElems;
  float* q_smem = reinterpret_cast<float*>(v_tiles + Traits::kStages * Traits::kTileElems);  // (kRows, kHeadDim)
  float* s_smem = q_smem + kRows * kHeadDim;  // (kRows, kBlockN)
  float* row_max = s_smem + kRows * kBlockN;  // (kRows)
  float* row_sum = row_max + kRows;
  float* row_alpha = row_sum + kRows;

  const int tid = threadIdx.x;
  const int split = blockIdx.x, splits = gridDim.x;
  const int64_t b = blockIdx.z / p.heads_kv, hkv = blockIdx.z % p.heads_kv;
  const int64_t group = p.heads / p.heads_kv;
  const int64_t total_rows = p.seqlen_q * group;
  const int64_t r0 = int64_t(blockIdx.y) * kRows;
  const int nrows = static_cast<int>(min(int64_t(kRows), total_rows - r0));
  const CacheRow row = bounded_row(p, b);
  const MaskPolicy mask = row.mask(p);
  const int d_count = static_cast<int>(p.head_dim), dv_count = static_cast<int>(p.head_dim_v);

  // Q rows, rotated at their positions and rounded to the element type (as the cache holds k).
  for (int e = tid; e < kRows * kHeadDim; e += kThreads) {
    const int r = e / kHeadDim, d = e % kHeadDim;
    float value = 0.0f;
    if (r < nrows && d < d_count) {
      const int64_t i = (r0 + r) / group, h = hkv * group + (r0 + r) % group;
      const Element* q_row =
          static_cast<const Element*>(p.q) + b * p.q_layout.batch + i * p.q_layout.row + h * p.q_layout.head;
      value = rotated_element(p, q_row, d, query_rotary_position(p, row, i));
    }
    q_smem[e] = value;
  }
  if (tid < kRows) {
    row_max[tid] = -INFINITY;
    row_sum[tid] = 0.0f;
  }
  __syncthreads();  // a split without tiles reads the row state in the epilogue

  const int64_t i_first = r0 / group, i_last = (r0 + nrows - 1) / group;
  const KeyRange keys = split_range<kBlockN>(mask.key_begin(i_first), mask.key_end(i_last + 1), split, splits);
  const int tiles = keys.end > keys.begin ? static_cast<int>((keys.end - keys.begin + kBlockN - 1) / kBlockN) : 0;

  // Tile n of this split into stage `stage`: kChunks threads per key row, consecutive 16-byte chunks.
  auto load_tile = [&](int n, int stage) {
    const int64_t tile_begin = keys.begin + int64_t(n) * kBlockN;
    const int chunk = tid % kChunks;
    for (int key = tid / kChunks; key < kBlockN; key += Traits::kLoadKeys) {
      const int64_t j = tile_begin + key;
      const bool in_range = j < keys.end;
      int64_t k_off = 0, v_off = 0;
      if (in_range) {
        const int64_t position = row.leftpad + j;
        k_off = cache_offset(p, p.k_cache_layout, row, b, position, hkv);
        v_off = cache_offset(p, p.v_cache_layout, row, b, position, hkv);
      }
      const Element* k_src = static_cast<const Element*>(p.k_cache) + (k_off > 0 ? k_off : 0) + chunk * 8;
      const Element* v_src = static_cast<const Element*>(p.v_cache) + (v_off > 0 ? v_off : 0) + chunk * 8;
      Element* k_dst = k_tiles + stage * Traits::kTileElems + key * kRowStride + chunk * 8;
      Element* v_dst = v_tiles + stage * Traits::kTileElems + key * kRowStride + chunk * 8;
      cp_async_16(k_dst, k_src, in_range && k_off >= 0 && chunk * 8 < d_count);
      cp_async_16(v_dst, v_src, in_range && v_off >= 0 && chunk * 8 < dv_count);
    }
  };

  // P V accumulators: rows tid / kDimGroups + kOutLanes * k, dims 4 * (tid % kDimGroups) .. +3.
  float acc[Traits::kOutRows][4];
#pragma unroll
  for (int k = 0; k < Traits::kOutRows; ++k)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[k][e] = 0.0f;
  const int out_lane = tid / Traits::kDimGroups, dim0 = 4 * (tid % Traits::kDimGroups);
  const int score_key = tid % kBlockN, score_lane = tid / kBlockN;
  const int warp = tid / 32, lane = tid % 32;

  if (tiles > 0) load_tile(0, 0);
  cp_async_commit();
  for (int n = 0; n < tiles; ++n) {
    const int stage = n % Traits::kStages;
    if (n + 1 < tiles) load_tile(n + 1, (n + 1) % Traits::kStages);
    cp_async_commit();
    cp_async_wait<1>();  // tile n has landed (n + 1 may still be in flight)
    __syncthreads();

    // S = scale * Q K^T with softcap, ALiBi and the mask: one key per thread, kScoreRows rows.
    const int64_t tile_begin = keys.begin + int64_t(n) * kBlockN;
    const int64_t j = tile_begin + score_key;
    const Element* k_row = k_tiles + stage * Traits::kTileElems + score_key * kRowStride;
    float dots[Traits::kScoreRows];
#pragma unroll
    for (int k = 0; k < Traits::kScoreRows; ++k) dots[k] = 0.0f;
    if (j < keys.end) {
      for (int c = 0; c < kChunks && c * 8 < d_count; ++c) {
        const uint4 packed = *reinterpret_cast<const uint4*>(k_row + c * 8);
        const Element* k8 = reinterpret_cast<const Element*>(&packed);
        float kf[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) kf[e] = to_float(k8[e]);
#pragma unroll
        for (int k = 0; k < Traits::kScoreRows; ++k) {
          const int r = score_lane + Traits::kScoreLanes * k;
          if (r >= nrows) break;
          const float4 qa = *reinterpret_cast<const float4*>(q_smem + r * kHeadDim + c * 8);
          const float4 qb = *reinterpret_cast<const float4*>(q_smem + r * kHeadDim + c * 8 + 4);
          dots[k] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                     qb.z * kf[6] + qb.w * kf[7];
        }
      }
    }
#pragma unroll
    for (int k = 0; k < Traits::kScoreRows; ++k) {
      const int r = score_lane + Traits::kScoreLanes * k;
      if (r >= kRows) break;
      const int64_t i = (r0 + r) / group;
      float s = -INFINITY;
      if (r < nrows && j < keys.end && mask.visible(i, j)) {
        s = dots[k] * p.softmax_scale;
        if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
        if (p.alibi_slopes != nullptr) {
          const int64_t h = hkv * group + (r0 + r) % group;
          s -= p.alibi_slopes[b * p.alibi_batch_stride + h] * mask.alibi_distance(i, j);
        }
      }
      s_smem[r * kBlockN + score_key] = s;
    }
    __syncthreads();

    // Online softmax, one warp per row. Invariant: acc = sum_j exp(s_j - m) v_j and
    // l = sum_j exp(s_j - m) over the keys so far; a new maximum rescales both by
    // alpha = exp(m_old - m_new). A row with no visible key yet keeps m = -inf, alpha = 1.
    for (int r = warp; r < nrows; r += kThreads / 32) {
      float* s_row = s_smem + r * kBlockN;
      float tile_max = -INFINITY;
      for (int c = lane; c < kBlockN; c += 32) tile_max = fmaxf(tile_max, s_row[c]);
      tile_max = warp_max(tile_max);
      const float m_old = row_max[r];
      const float m_new = fmaxf(m_old, tile_max);
      float sum = 0.0f;
      for (int c = lane; c < kBlockN; c += 32) {
        const float prob = m_new == -INFINITY ? 0.0f : __expf(s_row[c] - m_new);
        s_row[c] = prob;
        sum += prob;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = m_new == -INFINITY ? 1.0f : __expf(m_old - m_new);
        row_alpha[r] = alpha;
        row_sum[r] = row_sum[r] * alpha + sum;
        row_max[r] = m_new;
      }
    }
    __syncthreads();

    // acc = alpha * acc + P V over the keys of this tile that exist.
    const int valid_keys = static_cast<int>(min(int64_t(kBlockN), keys.end - tile_begin));
    const Element* v_tile = v_tiles + stage * Traits::kTileElems;
#pragma unroll
    for (int k = 0; k < Traits::kOutRows; ++k) {
      const int r = out_lane + Traits::kOutLanes * k;
      const float alpha = r < nrows ? row_alpha[r] : 1.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[k][e] *= alpha;
    }
    if (dim0 < dv_count) {
      for (int key = 0; key < valid_keys; ++key) {
        const uint2 packed = *reinterpret_cast<const uint2*>(v_tile + key * kRowStride + dim0);
        const Element* v4 = reinterpret_cast<const Element*>(&packed);
        const float v0 = to_float(v4[0]), v1 = to_float(v4[1]), v2 = to_float(v4[2]), v3 = to_float(v4[3]);
#pragma unroll
        for (int k = 0; k < Traits::kOutRows; ++k) {
          const int r = out_lane + Traits::kOutLanes * k;
          if (r >= nrows) break;
          const float prob = s_smem[r * kBlockN + key];
          acc[k][0] += prob * v0;
          acc[k][1] += prob * v1;
          acc[k][2] += prob * v2;
          acc[k][3] += prob * v3;
        }
      }
    }
    __syncthreads();  // the stage and S are rewritten by the next tile
  }
  cp_async_wait<0>();

  // Epilogue: O / l and the LSE (+inf for a row that saw no key, as everywhere in the library).
#pragma unroll
  for (int k = 0; k < Traits::kOutRows; ++k) {
    const int r = out_lane + Traits::kOutLanes * k;
    if (r >= nrows || dim0 >= dv_count) continue;
    const float l = row_sum[r];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (splits == 1) {
      const int64_t i = (r0 + r) / group, h = hkv * group + (r0 + r) % group;
      Element* o = static_cast<Element*>(p.o) + b * p.o_layout.batch + i * p.o_layout.row + h * p.o_layout.head;
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dim0 + e] = from_float<Element>(acc[k][e] * inv);
    } else {
      float* o = partials.o + ((int64_t(split) * gridDim.z + blockIdx.z) * partials.rows_padded + r0 + r) * dv_count;
      *reinterpret_cast<float4*>(o + dim0) = make_float4(acc[k][0] * inv, acc[k][1] * inv, acc[k][2] * inv,
                                                         acc[k][3] * inv);
    }
  }
  if (tid < nrows) {
    const float l = row_sum[tid];
    const int64_t i = (r0 + tid) / group, h = hkv * group + (r0 + tid) % group;
    if (splits == 1) {
      if (p.lse != nullptr)
        p.lse[b * p.lse_layout.batch + i * p.lse_layout.row + h * p.lse_layout.head] =
            l > 0.0f ? row_max[tid] + __logf(l) : INFINITY;
    } else {
      partials.lse[(int64_t(split) * gridDim.z + blockIdx.z) * partials.rows_padded + r0 + tid] =
          l > 0.0f ? row_max[tid] + __logf(l) : -INFINITY;
    }
  }
  // The K tiles are free (the loop ended on a barrier): they hold the merge's weights.
  if (splits > 1) merge_splits_if_last<kRows, Element>(p, partials, nrows, r0, b, hkv, reinterpret_cast<float*>(smem));
}

}  // namespace flashattn::cuda::decode
