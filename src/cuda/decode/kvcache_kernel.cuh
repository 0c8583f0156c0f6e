// Split-KV ("flash-decoding") attention against a KV cache, for sm_80 and sm_90a.
//
// Decode reads every K/V byte of the cache once and does little math per byte
// (Sq * G rows x (D + Dv) FMAs per key, G = H / Hkv), so the kernel is built
// for bandwidth, not tensor cores: plain fp32 FMAs, K/V tiles streamed into
// shared memory with cp.async (two stages: one tile in flight while the other
// is consumed), and the G query heads of one KV head (times the Sq queries)
// packed into the rows of one block so that each cache row is fetched once.
// When B * Hkv blocks cannot fill the GPU, the keys are split over gridDim.x:
// each split writes O / l and its LSE in fp32 and combine_kernel merges them.
//
// Block: kThreads threads, rows r = i * G + g of one (batch row, kv head),
// kRows of them per block (more rows: more blocks along gridDim.y).
//   Q  smem fp32 (kRows, kHeadDim), rotated and rounded to the element type
//   K  smem (kStages, kBlockN, kHeadDim + 8), V alike; +8 elements of padding
//      put consecutive rows 4 banks apart, so 16-byte reads are conflict-free
//   S  smem fp32 (kRows, kBlockN): scores, then probabilities
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/kvcache_params.hpp"
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
  static constexpr size_t smem_bytes() {
    return size_t(2) * kStages * kTileElems * sizeof(Element) + size_t(kRows) * kHeadDim * 4 +
           size_t(kRows) * kBlockN * 4 + size_t(3) * kRows * 4;
  }
};

template <typename Element>
__device__ __forceinline__ float to_float(Element x);
template <>
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename Element>
__device__ __forceinline__ Element from_float(float x);
template <>
__device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(gmem), "r"(src_bytes));
}
// The same copy, the L2 asked to fetch the 256 bytes around the chunk from the DRAM (a key row of one
// head at hdim 128) rather than the 32-byte sectors the chunk touches.
__device__ __forceinline__ void cp_async_16_l2_256(void* smem, const void* gmem, bool valid) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(address), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// 2^x by the special-function unit alone. exp2f adds a rescaling for results below 2^-126 (four
// instructions where one does); here those flush to zero, weights no softmax sum can see next to the
// row maximum's 1. Other results are the same bits as exp2f's.
__device__ __forceinline__ float exp2_flush(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// Programmatic dependent launch (sm_90+, kvcache_launch.cuh says which launches use it). The wait
// holds the thread until the grids this one depends on have completed and their writes are visible
// (at once in a grid launched in plain stream order), so it precedes every global access of a kernel
// that may be launched early. allow_dependent_grids lets the next grid, when launched that way, be
// scheduled once every block of this one has called it or exited; it publishes nothing (that is the
// dependent's wait). Both are compiled out below sm_90, whose code the launcher never launches early.
__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// x, hidden from the optimizer (an empty asm volatile that claims to change it; no instruction).
// For a value the compiler would otherwise derive again from its source at every use: it did so
// with split_kv_mma's long-pages row strides (31 more instructions in the slab loop, sm_90a bf16
// hdim 128), its lane addresses (22) and the block-table row pointer (13; 65 in the short-pages
// loop), each time 64-bit parameter arithmetic in every step. And for a value that must be ready
// ahead of the next asm volatile, such as the wait for the prerequisite grids, below which the
// compiler sinks arithmetic onto the path from the previous grid's end to the first load.
template <typename T>
__device__ __forceinline__ T opaque(T x) {
#ifdef __CUDA_ARCH__
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "a 32- or 64-bit register");
  if constexpr (sizeof(T) == 8) {
    asm volatile("" : "+l"(x));
  } else {
    asm volatile("" : "+r"(x));
  }
#endif
  return x;
}

// Asks the L2 for the line holding `address`; returns nothing to the thread, so it may run before the
// wait for the previous grid. (A no-op where the header is compiled for the host: dev/kvcache_emulator.)
__device__ __forceinline__ void prefetch_to_l2(const void* address) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(address));
#endif
}

// Asks the L2 for batch row b's entries of the index tensors (thread 0 of the block), ahead of the
// wait for the previous grid: a prefetch returns nothing to the thread, and a write of the previous
// grid updates the L2's line, so the load after the wait reads the written value, from the L2
// instead of the DRAM. The split's first copies wait for the cache length: a DRAM round trip of
// the call's prologue becomes an L2 one.
__device__ __forceinline__ void prefetch_row_entries(const KvCacheParams& p, int64_t b) {
#if defined(__CUDA_ARCH__)
  if (threadIdx.x != 0) return;
  auto prefetch = [b](const int32_t* entries) {
    if (entries != nullptr) prefetch_to_l2(entries + b);
  };
  prefetch(p.cache_seqlens);
  prefetch(p.cache_leftpad);
  prefetch(p.cache_batch_idx);
#endif
}

// The row of batch row b, bounded on the device: the C API cannot read device
// index tensors, so a row whose values leave the cache attends to no key.
__device__ __forceinline__ CacheRow bounded_row(const KvCacheParams& p, int64_t b, const CacheRow::Entries& entries) {
  CacheRow row = CacheRow::of(p, b, entries);
  const bool bad_index = !p.paged && (row.cache_index < 0 || row.cache_index >= p.cache_batch);
  if (bad_index || row.leftpad < 0 || row.filled < row.leftpad || row.filled + p.seqlen_new > p.capacity)
    row.keys = 0;
  return row;
}
__device__ __forceinline__ CacheRow bounded_row(const KvCacheParams& p, int64_t b) {
  return bounded_row(p, b, CacheRow::read(p, b));
}

// Element d of one head vector rotated at `position` (flash-attn's rotary; see kvcache_params.hpp).
template <typename Element>
__device__ __forceinline__ float rotated_element(const KvCacheParams& p, const Element* vec, int d,
                                                 int64_t position) {
  if (p.rotary_cos == nullptr || d >= p.rotary_dim) return to_float(vec[d]);
  const RotaryPair pair = rotary_pair(p.rotary_dim, p.rotary_interleaved, d);
  const float c = to_float(static_cast<const Element*>(p.rotary_cos)[position * p.rotary_cos_stride + pair.column]);
  const float s = to_float(static_cast<const Element*>(p.rotary_sin)[position * p.rotary_sin_stride + pair.column]);
  const float value = rotate<float>(to_float(vec[pair.first]), to_float(vec[pair.second]), c, s, d == pair.first);
  return to_float(from_float<Element>(value));
}

// k_new (rotated) and v_new into the cache. Grid (B * S_new * Hkv), one thread per dim.
template <typename Element>
__global__ void append_kernel(const KvCacheParams p) {
  allow_dependent_grids();  // the split kernel's blocks may take their SMs now: they wait for this grid
  wait_for_prerequisite_grids();  // launched early after the caller's kernel: nothing read before
  const int64_t h = blockIdx.x % p.heads_kv;
  const int64_t t = (blockIdx.x / p.heads_kv) % p.seqlen_new;
  const int64_t b = blockIdx.x / (p.heads_kv * p.seqlen_new);
  const CacheRow row = bounded_row(p, b);
  if (row.keys == 0) return;  // values outside the cache: nothing is written
  const int64_t position = row.filled + t;
  const int d = threadIdx.x;
  if (d < p.head_dim) {
    const int64_t dst = cache_offset(p, p.k_cache_layout, row, b, position, h);
    const Element* src = static_cast<const Element*>(p.k_new) + b * p.k_new_layout.batch + t * p.k_new_layout.row +
                         h * p.k_new_layout.head;
    if (dst >= 0) static_cast<Element*>(p.k_cache)[dst + d] = from_float<Element>(rotated_element(p, src, d, position));
  }
  if (d < p.head_dim_v) {
    const int64_t dst = cache_offset(p, p.v_cache_layout, row, b, position, h);
    const Element* src = static_cast<const Element*>(p.v_new) + b * p.v_new_layout.batch + t * p.v_new_layout.row +
                         h * p.v_new_layout.head;
    if (dst >= 0) static_cast<Element*>(p.v_cache)[dst + d] = src[d];
  }
}

// Keys [begin, end) of split `split` among `splits` for rows whose mask allows [lo, hi).
struct KeyRange {
  int64_t begin, end;
};
template <int kBlockN>
__device__ __forceinline__ KeyRange split_range(int64_t lo, int64_t hi, int split, int splits) {
  // Key counts are below 2^31 (the kernels hold keys as int): a 32-bit division.
  const uint32_t span = hi > lo ? static_cast<uint32_t>(hi - lo) : 0u;
  const int64_t per_split = ((span + splits - 1) / static_cast<uint32_t>(splits) + kBlockN - 1) / kBlockN * kBlockN;
  const int64_t begin = lo + split * per_split;
  return {begin, min(hi, begin + per_split)};
}

// Asks the L2 for the block-table lines that split `split` of `splits` reads first in batch row b,
// ahead of the wait for the previous grid, as prefetch_row_entries does for the row's entries. Which
// keys a split reads needs the cache length, readable only after that wait, so the split's share is
// taken of the row's capacity: exact for a full cache; otherwise some lines are asked for in vain (one
// instruction a thread, and a line of the table in the L2). One line a thread, from the share's
// first: the entries the walk reads later are read ahead of their copies anyway.
template <int kBlockN>
__device__ __forceinline__ void prefetch_table_share(const KvCacheParams& p, int64_t b, int split, int splits) {
#if defined(__CUDA_ARCH__)
  const KeyRange keys = split_range<kBlockN>(0, p.capacity, split, splits);
  if (keys.end <= keys.begin) return;
  const uint32_t page_rows = static_cast<uint32_t>(p.page_rows);
  const int32_t* row = p.block_table + b * p.block_table_stride;
  constexpr uintptr_t kLineBytes = 128;
  const int32_t* first = row + static_cast<uint32_t>(keys.begin) / page_rows;
  const int32_t* last = row + static_cast<uint32_t>(keys.end - 1) / page_rows;
  const uintptr_t first_line = reinterpret_cast<uintptr_t>(first) / kLineBytes;
  const uintptr_t last_line = reinterpret_cast<uintptr_t>(last) / kLineBytes;
  const uintptr_t line = first_line + threadIdx.x;
  if (line <= last_line) prefetch_to_l2(reinterpret_cast<const void*>(line * kLineBytes));
#endif
}

// Grid (splits, row blocks, B * Hkv). Writes out/lse directly when splits == 1,
// else fp32 partials: o_partial (splits, B * Hkv, rows_padded, Dv), lse_partial (splits, B * Hkv, rows_padded).
template <typename Traits, typename Element>
__global__ void __launch_bounds__(Traits::kThreads)
    split_kv_kernel(const KvCacheParams p, float* o_partial, float* lse_partial, int rows_padded) {
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

  wait_for_prerequisite_grids();  // launched early after the stream's previous kernel: nothing read before
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
      float* o = o_partial + ((int64_t(split) * gridDim.z + blockIdx.z) * rows_padded + r0 + r) * dv_count;
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
      lse_partial[(int64_t(split) * gridDim.z + blockIdx.z) * rows_padded + r0 + tid] =
          l > 0.0f ? row_max[tid] + __logf(l) : -INFINITY;
    }
  }
}

// Exact merge of the splits: lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s.
// One block per packed row (b, kv head, r); grid covers B * Hkv * rows. Thread s holds lse_s;
// warp w sums the splits s = w (mod kCombineWarps), each lane four output dims, so that a warp
// has at most a quarter of the splits' loads to chain, and the warps' sums are added in a fixed
// order (one warp per row, batches of 8 loads over 31 splits, took 10.6 us at B = 1, 4k on the
// H200: 8 blocks, latency-bound; a loop that chained one load per split had taken 50 us).
constexpr int kCombineWarps = 4;
constexpr int kCombineThreads = kCombineWarps * 32;
static_assert(kMaxSplits <= kCombineThreads, "one split per thread for the LSE");
// kHeadDimClass bounds Dv (the launch's head-dim class): a lane's dims d0 + 4 lane for d0 = 0, 128, ...
// below it are a loop the compiler unrolls, one step at classes 64 and 128.
template <typename Element, int kHeadDimClass>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const KvCacheParams p, const float* o_partial,
                                                                  const float* lse_partial, int splits,
                                                                  int rows_padded) {
  __shared__ float weights[kMaxSplits];
  __shared__ float partial_max[kCombineWarps], partial_sum[kCombineWarps];
  __shared__ float4 warp_sums[kCombineWarps][kHeadDimClass / 4];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // 32-bit divisions (the packed rows of all (batch row, kv head) pairs number below 2^31, checked
  // by run_kvcache): a 64-bit one is a long dependent chain ahead of the first load.
  const uint32_t heads_kv = static_cast<uint32_t>(p.heads_kv);
  const uint32_t group = static_cast<uint32_t>(p.heads) / heads_kv;
  const uint32_t total_rows = static_cast<uint32_t>(p.seqlen_q) * group;
  const int64_t bh_count = p.batch * p.heads_kv;
  const int64_t bh = blockIdx.x / total_rows, r = blockIdx.x % total_rows;
  const int64_t stride = bh_count * rows_padded;  // between splits, in rows
  const int64_t base = bh * rows_padded + r;
  // Every address below is computed here, ahead of the wait, and made opaque: the compiler would
  // otherwise sink its arithmetic below the wait, onto the chain from the split grid's end to the
  // first load. A thread past the split count reads split splits - 1 (always written) and ignores
  // it: the loads need no predicate.
  const int64_t own_split = min(tid, splits - 1);
  const float* own_lse_in = opaque(lse_partial + own_split * stride + base);
  // The first kEarlySplits partials of this warp's first four dims, loaded with the LSE: they need
  // no weight to be read, and waiting for the LSE's reductions first put a second round trip to L2
  // on the call's critical path (at B = 1 a split count of 16 is 4 per warp: all of them).
  constexpr int kEarlySplits = 8;
  const int dv = static_cast<int>(p.head_dim_v);  // a multiple of 8: rows of partials are float4-aligned
  const float* partial = o_partial + base * dv;
  const int early_dim = min(4 * lane, dv - 4);  // lanes past dv (hdim 64) read a dim they ignore
  const float4* early_src[kEarlySplits];
#pragma unroll
  for (int k = 0; k < kEarlySplits; ++k) {
    const int64_t s = min(warp + k * kCombineWarps, splits - 1);
    early_src[k] = opaque(reinterpret_cast<const float4*>(partial + s * stride * dv + early_dim));
  }
  // Where warp 0 writes the row of O and its LSE.
  const int64_t b = static_cast<uint32_t>(bh) / heads_kv, hkv = static_cast<uint32_t>(bh) % heads_kv;
  const int64_t i = static_cast<uint32_t>(r) / group, h = hkv * group + static_cast<uint32_t>(r) % group;
  Element* o = static_cast<Element*>(p.o) + b * p.o_layout.batch + i * p.o_layout.row + h * p.o_layout.head;
  float* lse_out = p.lse != nullptr ? p.lse + b * p.lse_layout.batch + i * p.lse_layout.row + h * p.lse_layout.head
                                    : nullptr;
  // Launched early, while the split kernel still runs: the index math above reads only the
  // parameters and runs meanwhile (after the wait, 190 instructions, two divisions among them, came
  // between the wait and the first load; 1 now, sm_90a bf16 hdim 128); the partials, and out, are
  // touched only after that grid has completed.
  wait_for_prerequisite_grids();
  // The next kernel of the stream (at B = 1 the next call's split kernel) may be scheduled now, onto
  // the SMs the split grid has left, and wait there while this grid merges: its launch's latency
  // leaves the call's critical path (H100, session 35: 0.99 -> 0.43 us from this grid's end to the
  // next one's wait; B = 1 4k 12.7 -> 12.3 us). Allowed at the entry instead (v25), its blocks took
  // slots beside the split grid's and that call's walk slowed.
  allow_dependent_grids();
  // __ldcg: global loads (the opaque pointers' state space is hidden from the compiler, which
  // would issue generic ones), cached in L2 only, where the split grid left them.
  const float loaded_lse = __ldcg(own_lse_in);
  float4 early[kEarlySplits];
#pragma unroll
  for (int k = 0; k < kEarlySplits; ++k) early[k] = __ldcg(early_src[k]);
  const float own_lse = tid < splits ? loaded_lse : -INFINITY;
  float lse_max = warp_max(own_lse);
  if (lane == 0) partial_max[warp] = lse_max;
  __syncthreads();
  lse_max = partial_max[0];
  for (int w = 1; w < kCombineWarps; ++w) lse_max = fmaxf(lse_max, partial_max[w]);
  const float own_exp = lse_max != -INFINITY && tid < splits ? __expf(own_lse - lse_max) : 0.0f;
  const float warp_total = warp_sum(own_exp);
  if (lane == 0) partial_sum[warp] = warp_total;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kCombineWarps; ++w) total += partial_sum[w];  // a fixed order: the same bits every call
  const float lse = lse_max == -INFINITY ? INFINITY : lse_max + __logf(total);
  if (tid < splits) weights[tid] = lse == INFINITY ? 0.0f : __expf(own_lse - lse);
  __syncthreads();
#pragma unroll
  for (int d0 = 0; d0 < kHeadDimClass; d0 += 128) {
    const int d = d0 + 4 * lane;
    if (d >= dv) break;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // A split that saw no key has weight 0 and a zero partial: no 0 * inf. The splits in the
    // order s = warp, warp + kCombineWarps, ... (the early ones first): the same bits every call.
    auto add = [&](int s, const float4& value) {
      const float weight = weights[s];
      acc.x += weight * value.x;
      acc.y += weight * value.y;
      acc.z += weight * value.z;
      acc.w += weight * value.w;
    };
#pragma unroll
    for (int k = 0; k < kEarlySplits; ++k) {
      const int s = warp + k * kCombineWarps;
      if (s >= splits) break;
      add(s, d0 == 0 ? early[k] : *reinterpret_cast<const float4*>(partial + s * stride * dv + d));
    }
#pragma unroll 8
    for (int s = warp + kEarlySplits * kCombineWarps; s < splits; s += kCombineWarps)
      add(s, *reinterpret_cast<const float4*>(partial + s * stride * dv + d));
    warp_sums[warp][d / 4] = acc;
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int d0 = 0; d0 < kHeadDimClass; d0 += 128) {
    const int d = d0 + 4 * lane;
    if (d >= dv) break;
    float4 sum = warp_sums[0][d / 4];
    for (int w = 1; w < kCombineWarps; ++w) {
      const float4 more = warp_sums[w][d / 4];
      sum.x += more.x;
      sum.y += more.y;
      sum.z += more.z;
      sum.w += more.w;
    }
    o[d] = from_float<Element>(sum.x);
    o[d + 1] = from_float<Element>(sum.y);
    o[d + 2] = from_float<Element>(sum.z);
    o[d + 3] = from_float<Element>(sum.w);
  }
  if (lane == 0 && lse_out != nullptr) *lse_out = lse;
}

}  // namespace flashattn::cuda::decode
