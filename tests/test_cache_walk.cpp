// Which walk of the mma decode kernel a call takes (src/cuda/decode/cache_walk.hpp),
// checked on the host: the long-pages walk only for pages of at least one slab
// whose K and V row strides fit its 32-bit row stride in bytes.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/decode/cache_walk.hpp"

namespace {

using flashattn::KvCacheParams;
using flashattn::cuda::decode::cache_walk;
using flashattn::cuda::decode::CacheWalk;

KvCacheParams paged(int64_t page_rows, int64_t k_row, int64_t v_row) {
  KvCacheParams p;
  p.paged = true;
  p.page_rows = page_rows;
  p.k_cache_layout = {page_rows * k_row, k_row, 128};
  p.v_cache_layout = {page_rows * v_row, v_row, 128};
  return p;
}

TEST(KvCacheWalk, ContiguousCache) {
  KvCacheParams p;
  p.k_cache_layout = {int64_t(1) << 40, int64_t(1) << 33, 128};
  p.v_cache_layout = p.k_cache_layout;
  EXPECT_EQ(cache_walk(p), CacheWalk::kContiguous);
}

TEST(KvCacheWalk, PageRows) {
  EXPECT_EQ(cache_walk(paged(1, 1024, 1024)), CacheWalk::kShortPages);
  EXPECT_EQ(cache_walk(paged(15, 1024, 1024)), CacheWalk::kShortPages);
  EXPECT_EQ(cache_walk(paged(16, 1024, 1024)), CacheWalk::kLongPages);
  EXPECT_EQ(cache_walk(paged(1000, 1024, 1024)), CacheWalk::kLongPages);
}

TEST(KvCacheWalk, RowStrideBound) {
  const int64_t largest = (int64_t(1) << 31) - 1;  // 2^32 - 2 bytes of 16-bit elements
  EXPECT_EQ(cache_walk(paged(16, largest, largest)), CacheWalk::kLongPages);
  EXPECT_EQ(cache_walk(paged(16, largest + 1, 1024)), CacheWalk::kShortPages);
  EXPECT_EQ(cache_walk(paged(16, 1024, largest + 1)), CacheWalk::kShortPages);
  EXPECT_EQ(cache_walk(paged(16, -1024, 1024)), CacheWalk::kShortPages);
  EXPECT_EQ(cache_walk(paged(16, 0, 0)), CacheWalk::kLongPages);
}

}  // namespace
