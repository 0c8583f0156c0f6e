// What the KV-cache (decode) kernels share: element conversions, cp.async,
// warp reductions, the bounded cache row of a batch row, rotary, the append
// kernel, the key range of a split and the fp32 workspace of split calls.
// The split-KV kernels: split_kv_mma.cuh (tensor cores, the default),
// split_kv_warp.cuh and split_kv_tiles.cuh (CUDA cores).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/kvcache_params.hpp"
#include "cuda/decode/kvcache_launch.hpp"

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

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(gmem), "r"(src_bytes));
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

// The fp32 workspace of a call with splits > 1 (the layout is KvCachePlan's):
//   o        (splits, B * Hkv, rows_padded, Dv)  each split's O / l
//   lse      (splits, B * Hkv, rows_padded)      each split's LSE, -inf for a row that saw no key
//   arrivals (B * Hkv, row blocks)               split blocks done, zero when a launch starts
struct SplitPartials {
  float* o = nullptr;
  float* lse = nullptr;
  unsigned int* arrivals = nullptr;
  int rows_padded = 0;
};

}  // namespace flashattn::cuda::decode
