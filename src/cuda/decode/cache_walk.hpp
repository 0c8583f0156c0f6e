// Which instance of the mma decode kernel (split_kv_mma.cuh) a call runs: the
// launcher picks the instance with it (kvcache_launch.cuh). Plain C++, so that
// the CPU emulator (dev/kvcache_emulator) and a host-side heuristic can share it.
#pragma once

#include "common/kvcache_params.hpp"

namespace flashattn::cuda::decode {

// Keys per warp step of the mma kernel: the k of its P V mma.
constexpr int kMmaSlabKeys = 16;

// How an mma kernel instance steps a lane's key streams through the cache:
// one offset per tensor in a contiguous cache; two block lookups per slab in
// a paged cache of pages at least one slab long, where a lane's streams touch
// at most two pages; a page and a block per stream otherwise.
enum class CacheWalk { kContiguous, kLongPages, kShortPages };

constexpr CacheWalk cache_walk(const KvCacheParams& p) {
  if (!p.paged) return CacheWalk::kContiguous;
  return p.page_rows >= kMmaSlabKeys ? CacheWalk::kLongPages : CacheWalk::kShortPages;
}

}  // namespace flashattn::cuda::decode
