// The flat parameter block of attention against a KV cache (fa_fwd_kvcache),
// and the index arithmetic every backend shares: where cache position p of
// batch row b lives (contiguous or paged), how many keys row b attends to,
// the rotary position of a query or new key. Built once from the validated C
// arguments (src/kvcache/validate_kvcache.cpp).
#pragma once

#include <cstdint>

#include "common/host_device.hpp"
#include "common/mask.hpp"
#include "common/params.hpp"

namespace flashattn {

struct KvCacheParams {
  fa_dtype dtype = FA_DTYPE_FP32;
  int32_t device_index = 0;

  int64_t batch = 0;       // B of q
  int64_t heads = 0;       // H
  int64_t heads_kv = 0;    // Hkv
  int64_t head_dim = 0;    // D
  int64_t head_dim_v = 0;  // Dv
  int64_t seqlen_q = 0;    // Sq
  int64_t seqlen_new = 0;  // S_new, 0 without k_new

  bool paged = false;
  int64_t cache_batch = 0;  // B_cache, or num_blocks when paged
  int64_t page_rows = 0;    // S_cache, or page_size when paged
  int64_t max_blocks = 0;   // block_table columns (paged)
  int64_t capacity = 0;     // positions per cache row: S_cache or max_blocks * page_size

  const void* q = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  // batch = stride of a cache row (contiguous) or of a page (paged).
  TensorLayout q_layout, k_cache_layout, v_cache_layout, k_new_layout, v_new_layout, o_layout, lse_layout;

  const int32_t* cache_seqlens = nullptr;    // null: every row filled to capacity
  const int32_t* cache_batch_idx = nullptr;  // null: identity
  const int32_t* cache_leftpad = nullptr;    // null: 0
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;  // elements between rows of block_table

  const void* rotary_cos = nullptr;  // null: no rotary
  const void* rotary_sin = nullptr;
  int64_t rotary_dim = 0;
  int64_t rotary_cos_stride = 0, rotary_sin_stride = 0;  // elements between positions
  bool rotary_interleaved = true;

  float softmax_scale = 1.0f;
  float softcap = 0.0f;
  bool causal = false;
  bool align_bottom_right = true;
  int32_t window_left = -1;
  int32_t window_right = -1;
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;

  int32_t num_splits = 0;   // 0: the backend chooses
  int32_t num_threads = 1;  // CPU
  void* stream = nullptr;   // CUDA

  int64_t group() const { return heads / heads_kv; }
};

// Per batch row: the cache row, the filled length, the left pad and the keys attended.
struct CacheRow {
  int64_t cache_index = 0;  // cache row (contiguous); b itself when paged (the block table row)
  int64_t filled = 0;       // cache_seqlens[b]: where k_new goes
  int64_t leftpad = 0;      // key j lives at position leftpad + j
  int64_t keys = 0;         // N_b = filled - leftpad + S_new

  // Batch row b's entries of the index tensors, as read (a null tensor's entry is not read). Apart
  // from of(p, b) so that a kernel can issue these loads, then others, before their first use.
  struct Entries {
    int32_t cache_index = 0, filled = 0, leftpad = 0;
  };
  FA_HOST_DEVICE static Entries read(const KvCacheParams& p, int64_t b) {
    Entries e;
    if (p.cache_batch_idx != nullptr) e.cache_index = p.cache_batch_idx[b];
    if (p.cache_seqlens != nullptr) e.filled = p.cache_seqlens[b];
    if (p.cache_leftpad != nullptr) e.leftpad = p.cache_leftpad[b];
    return e;
  }
  FA_HOST_DEVICE static CacheRow of(const KvCacheParams& p, int64_t b, const Entries& e) {
    CacheRow row;
    row.cache_index = p.cache_batch_idx != nullptr ? e.cache_index : b;
    row.filled = p.cache_seqlens != nullptr ? e.filled : p.capacity;
    row.leftpad = p.cache_leftpad != nullptr ? e.leftpad : 0;
    row.keys = row.filled - row.leftpad + p.seqlen_new;
    return row;
  }
  FA_HOST_DEVICE static CacheRow of(const KvCacheParams& p, int64_t b) { return of(p, b, read(p, b)); }

  // The mask of this row's queries against its N_b keys.
  FA_HOST_DEVICE MaskPolicy mask(const KvCacheParams& p) const {
    return MaskPolicy::make(p.seqlen_q, keys, p.align_bottom_right, p.window_left, p.window_right);
  }
};

// Element offset of (cache position `position`, kv head h) of batch row b in a
// cache with `layout`; -1 when a paged row's block index is outside the cache.
FA_HOST_DEVICE int64_t cache_offset(const KvCacheParams& p, const TensorLayout& layout, const CacheRow& row,
                                           int64_t b, int64_t position, int64_t h) {
  if (!p.paged) return row.cache_index * layout.batch + position * layout.row + h * layout.head;
  const int64_t block = p.block_table[b * p.block_table_stride + position / p.page_rows];
  if (block < 0 || block >= p.cache_batch) return -1;
  return block * layout.batch + (position % p.page_rows) * layout.row + h * layout.head;
}

// Rotary position of query row i (flash-attn: every query sits at the cache
// length unless a causal or local mask orders them).
FA_HOST_DEVICE int64_t query_rotary_position(const KvCacheParams& p, const CacheRow& row, int64_t i) {
  const bool ordered = p.window_left >= 0 || p.window_right >= 0;
  return row.filled + (ordered ? i : 0);
}

// Rotary partner of dim d (d < rotary_dim) and its pair index (the cos/sin column).
// Interleaved: (2i, 2i+1); NeoX: (i, i + rotary_dim / 2).
struct RotaryPair {
  int64_t first = 0, second = 0, column = 0;
};
FA_HOST_DEVICE RotaryPair rotary_pair(int64_t rotary_dim, bool interleaved, int64_t d) {
  RotaryPair pair;
  const int64_t half = rotary_dim / 2;
  if (interleaved) {
    pair.column = d / 2;
    pair.first = 2 * pair.column;
    pair.second = pair.first + 1;
  } else {
    pair.column = d < half ? d : d - half;
    pair.first = pair.column;
    pair.second = pair.column + half;
  }
  return pair;
}

// Rotated value of dim d (first or second member of its pair). With half
// inputs the products are exact in fp32, so the one rounding of the
// difference makes the result independent of FMA contraction; fp32 inputs use
// fp64 (exact products) for the same reason.
template <typename Wide>
FA_HOST_DEVICE Wide rotate(Wide x_first, Wide x_second, Wide cos_value, Wide sin_value, bool is_first) {
  return is_first ? x_first * cos_value - x_second * sin_value : x_first * sin_value + x_second * cos_value;
}

}  // namespace flashattn
