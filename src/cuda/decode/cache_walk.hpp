// Which instance of the mma decode kernel (split_kv_mma.cuh) a call runs: the
// launcher picks the instance with it (kvcache_launch.cuh). Plain C++, so that
// the CPU emulator (dev/kvcache_emulator) and a host-side heuristic can share it.
#pragma once

#include <cstdint>

#include "common/kvcache_params.hpp"

namespace flashattn::cuda::decode {

// Keys per warp step of the mma kernel: the k of its P V mma.
constexpr int kMmaSlabKeys = 16;
// Warps per block of the mma kernel, each streaming its own slabs through its own ring.
constexpr int kMmaWarps = 4;

// The depth of the mma kernel's cp.async ring (SplitKvMmaTraits): the split plan takes kStandard
// where the device's shared memory per block holds it, else kCompact (mma_ring, kvcache_launch.hpp).
// (A deeper ring for grids of one block per SM timed 0-4 % slower on the H200, dev/kvcache_decode.md v15, and
// five stages at hdim 128 12-16 % slower at B = 8 on the H100, session 40.)
enum class Ring { kCompact, kStandard };

// Stages of a warp's ring, kStages - 1 slabs of K and V in flight: the standard ring fits two blocks
// per SM on an H100/A100 (96 KiB at hdim 128); the compact one, one slab in flight at hdim 128, fits
// the 99 KiB of an sm_86/sm_89 block.
constexpr int mma_ring_stages(Ring ring, int head_dim_class) {
  return ring == Ring::kCompact ? (head_dim_class <= 64 ? 4 : 2) : (head_dim_class <= 64 ? 4 : 3);
}

// Bytes of K and V that one block of the mma kernel has requested at a time (bf16/fp16):
// hdim 128, standard ring: 4 warps x 2 slabs x 8 KiB = 64 KiB.
constexpr int64_t mma_bytes_in_flight(Ring ring, int head_dim_class) {
  return int64_t(kMmaWarps) * (mma_ring_stages(ring, head_dim_class) - 1) * 2 * kMmaSlabKeys * head_dim_class * 2;
}

// How an mma kernel instance steps a lane's key streams through the cache:
// one offset per tensor in a contiguous cache; two block lookups per slab in
// a paged cache of pages at least one slab long, where a lane's streams touch
// at most two pages; a page and a block per stream otherwise. kContiguousWide
// walks a contiguous cache as kContiguous, its copies asking the L2 for 256
// bytes around each chunk (cp_async_16_l2_256): the launcher takes it where the
// grid has more blocks than the GPU has SMs and the DRAM is below 4 TB/s
// (KvCachePlan::wide_fetch).
enum class CacheWalk { kContiguous, kContiguousWide, kLongPages, kShortPages };

constexpr bool paged_walk(CacheWalk walk) { return walk == CacheWalk::kLongPages || walk == CacheWalk::kShortPages; }

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
