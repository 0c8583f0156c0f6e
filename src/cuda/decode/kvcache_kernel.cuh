// Attention against a KV cache on the GPU, the pieces around the split-KV
// kernel (split_kv_kernel.cuh): shared device helpers, the append (+ rotary)
// kernel that writes k_new / v_new into the cache, and the exact combine of
// the splits' partial outputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/kvcache_params.hpp"

namespace flashattn::cuda::decode {

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

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// The row of batch row b, bounded on the device: the C API cannot read device
// index tensors, so a row whose values leave the cache attends to no key.
__device__ __forceinline__ CacheRow bounded_row(const KvCacheParams& p, int64_t b) {
  CacheRow row = CacheRow::of(p, b);
  const bool bad_index = !p.paged && (row.cache_index < 0 || row.cache_index >= p.cache_batch);
  if (bad_index || row.leftpad < 0 || row.filled < row.leftpad || row.filled + p.seqlen_new > p.capacity)
    row.keys = 0;
  return row;
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
  const int64_t span = hi > lo ? hi - lo : 0;
  const int64_t per_split = ((span + splits - 1) / splits + kBlockN - 1) / kBlockN * kBlockN;
  const int64_t begin = lo + split * per_split;
  return {begin, min(hi, begin + per_split)};
}

// Exact merge of the splits: lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s.
// One warp per packed row (b, kv head, r); grid covers B * Hkv * rows.
template <typename Element>
__global__ void combine_kernel(const KvCacheParams p, const float* o_partial, const float* lse_partial, int splits,
                               int rows_padded) {
  const int warps = blockDim.x / 32;
  const int64_t item = int64_t(blockIdx.x) * warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t group = p.heads / p.heads_kv;
  const int64_t total_rows = p.seqlen_q * group;
  const int64_t bh_count = p.batch * p.heads_kv;
  if (item >= bh_count * total_rows) return;
  const int64_t bh = item / total_rows, r = item % total_rows;
  const int64_t stride = bh_count * rows_padded;  // between splits, in rows
  const int64_t base = bh * rows_padded + r;
  float lse_max = -INFINITY;
  for (int s = lane; s < splits; s += 32) lse_max = fmaxf(lse_max, lse_partial[s * stride + base]);
  lse_max = warp_max(lse_max);
  float lse = INFINITY;
  if (lse_max != -INFINITY) {
    float total = 0.0f;
    for (int s = lane; s < splits; s += 32) total += __expf(lse_partial[s * stride + base] - lse_max);
    lse = lse_max + __logf(warp_sum(total));
  }
  const int64_t b = bh / p.heads_kv, hkv = bh % p.heads_kv;
  const int64_t i = r / group, h = hkv * group + r % group;
  Element* o = static_cast<Element*>(p.o) + b * p.o_layout.batch + i * p.o_layout.row + h * p.o_layout.head;
  for (int d = lane; d < p.head_dim_v; d += 32) {
    float value = 0.0f;
    if (lse != INFINITY) {
      for (int s = 0; s < splits; ++s) {
        const float weight = __expf(lse_partial[s * stride + base] - lse);
        if (weight > 0.0f) value += weight * o_partial[(s * stride + base) * p.head_dim_v + d];
      }
    }
    o[d] = from_float<Element>(value);
  }
  if (lane == 0 && p.lse != nullptr) p.lse[b * p.lse_layout.batch + i * p.lse_layout.row + h * p.lse_layout.head] = lse;
}

}  // namespace flashattn::cuda::decode
