// The split count of a decode call (src/cuda/decode/split_plan.hpp), checked on the host with
// the figures of the two GPUs it was fitted on: 132 SMs, one block of the mma kernel per SM on a
// contiguous cache, 64 KiB in flight per block at hdim 128 (standard ring).
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/decode/split_plan.hpp"

namespace {

using namespace flashattn::cuda::decode;

constexpr int kSlots = 132;
constexpr double kH100Dram = 2.0 * 2619e6 * 5120 / 8;  // memory clock 2619 MHz, 5120-bit bus: 3.35 TB/s
constexpr double kH200Dram = 2.0 * 3201e6 * 6144 / 8;  // 3201 MHz, 6144 bits: 4.92 TB/s
constexpr int64_t kInFlight128 = 64 * 1024;

int splits(int64_t blocks, int64_t capacity, double dram) {
  return choose_splits(blocks, capacity, kSlots, grid_draws_the_dram(blocks, kInFlight128, dram));
}

TEST(SplitPlan, RingFigures) {
  EXPECT_EQ(mma_bytes_in_flight(Ring::kStandard, 128), kInFlight128);  // 4 warps x 2 slabs x 8 KiB
  EXPECT_EQ(mma_bytes_in_flight(Ring::kCompact, 128), 32 * 1024);
  EXPECT_EQ(mma_bytes_in_flight(Ring::kStandard, 64), 48 * 1024);      // 4 warps x 3 slabs x 4 KiB
  EXPECT_EQ(mma_smem_bytes(Ring::kStandard, 128), 104 * 1024);         // ncu: 106.50 KB a block
  EXPECT_EQ(mma_smem_bytes(Ring::kCompact, 128), 72 * 1024);
}

TEST(SplitPlan, UnsplitGridThatDrawsTheDram) {
  // 64 blocks (B = 8, 8 KV heads) pull ~3.5 TB/s: 90 % of an H100's peak, not of an H200's.
  EXPECT_TRUE(grid_draws_the_dram(64, kInFlight128, kH100Dram));
  EXPECT_FALSE(grid_draws_the_dram(64, kInFlight128, kH200Dram));
  EXPECT_FALSE(grid_draws_the_dram(48, kInFlight128, kH100Dram));
  EXPECT_TRUE(grid_draws_the_dram(88, kInFlight128, kH200Dram));
  EXPECT_FALSE(grid_draws_the_dram(1 << 20, kInFlight128, 0.0));  // a device that does not say
}

TEST(SplitPlan, EightBatchRowsSplitOnTheH200Only) {
  for (int64_t keys : {2048, 4096, 8192, 32768}) {
    EXPECT_EQ(splits(64, keys, kH100Dram), 1) << keys;
    EXPECT_EQ(splits(64, keys, kH200Dram), 2) << keys;  // 128 blocks: one per SM
    EXPECT_EQ(splits(64, keys, 0.0), 2) << keys;
  }
}

TEST(SplitPlan, PagedCachesStayUnsplitUpTo16kKeys) {
  // A paged cache counts two blocks per SM (264 slots): B = 8 takes four splits by waves where the
  // DRAM rule does not cover it.
  auto paged_splits = [](int64_t keys, double dram) {
    const int64_t blocks = 64;
    return choose_splits(blocks, keys, 2 * kSlots,
                         dram_rule_covers(true, keys) && grid_draws_the_dram(blocks, kInFlight128, dram));
  };
  EXPECT_TRUE(dram_rule_covers(false, int64_t(1) << 40));
  EXPECT_TRUE(dram_rule_covers(true, 16384));
  EXPECT_FALSE(dram_rule_covers(true, 16385));
  for (int64_t keys : {4096, 8192, 16384}) {
    EXPECT_EQ(paged_splits(keys, kH100Dram), 1) << keys;
    EXPECT_EQ(paged_splits(keys, kH200Dram), 4) << keys;
  }
  for (int64_t keys : {32768, 131072}) EXPECT_EQ(paged_splits(keys, kH100Dram), 4) << keys;
}

TEST(SplitPlan, SmallGridsSplitOnBoth) {
  // B = 1: 8 blocks pull 0.44 TB/s; 16 splits fill 128 of 132 SMs (four tiles a split at 4k keys).
  for (double dram : {kH100Dram, kH200Dram}) {
    EXPECT_EQ(splits(8, 4096, dram), 16);
    EXPECT_EQ(splits(8, 131072, dram), 16);
    EXPECT_EQ(splits(32, 4096, dram), 4);  // B = 4
  }
}

TEST(SplitPlan, NoSplitWhereTheGridIsFullOrTheCacheShort) {
  for (double dram : {0.0, kH100Dram, kH200Dram}) {
    EXPECT_EQ(splits(128, 32768, dram), 1);  // B = 16: 128 blocks of 132 slots
    EXPECT_EQ(splits(512, 4096, dram), 1);
    EXPECT_EQ(splits(8, 255, dram), 1);      // under four tiles of keys
    EXPECT_EQ(splits(8, 512, dram), 2);      // two splits of four tiles
  }
}

}  // namespace
