// Which instance of the mma decode kernel (split_kv_mma.cuh) a call runs: the
// launcher picks the instance with it (kvcache_launch.cuh). Plain C++, so that
// the CPU emulator (dev/kvcache_emulator) and a host-side heuristic can share it.
#pragma once

#include <cstdint>

#include "common/kvcache_params.hpp"

namespace flashattn::cuda::decode {

// Keys per warp step of the mma kernel: the k of its P V mma.
constexpr int kMmaSlabKeys = 16;

// How an mma kernel instance steps a lane's key streams through the cache:
// one offset per tensor in a contiguous cache; two block lookups per slab in
// a paged cache of pages at least one slab long, where a lane's streams touch
// at most two pages; a page and a block per stream otherwise.
enum class CacheWalk { kContiguous, kLongPages, kShortPages };

// The long-pages walk holds a row stride in bytes in 32 bits and multiplies it by
// rows with a 64-bit product (split_kv_mma.cuh, PagedTensor): the stride of 16-bit
// elements (fp16 and bf16, the mma kernel's types) fits when it is at most
// 2^31 - 1 elements, 2^32 - 2 bytes. Larger or negative row strides take the
// short-pages walk, whose offsets are 64-bit.
constexpr int64_t kLongPagesMaxRowStride = (int64_t(1) << 31) - 1;

constexpr bool long_pages_row_stride(int64_t row) { return row >= 0 && row <= kLongPagesMaxRowStride; }

constexpr CacheWalk cache_walk(const KvCacheParams& p) {
  if (!p.paged) return CacheWalk::kContiguous;
  const bool long_pages = p.page_rows >= kMmaSlabKeys && long_pages_row_stride(p.k_cache_layout.row) &&
                          long_pages_row_stride(p.v_cache_layout.row);
  return long_pages ? CacheWalk::kLongPages : CacheWalk::kShortPages;
}

}  // namespace flashattn::cuda::decode
