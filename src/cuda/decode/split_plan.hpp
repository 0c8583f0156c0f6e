// How many splits of the cache a decode call's grid gets (backend_kvcache.cpp plans it). Plain C++,
// so that the host tests (tests/test_split_plan.cpp) and the CPU emulator can include it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/decode/cache_walk.hpp"

namespace flashattn::cuda::decode {

// Keys per split come in multiples of kKeysPerTile (the tile of split_kv_kernel).
constexpr int kKeysPerTile = 64;
// Most splits of one call (combine_kernel keeps a weight per split in shared memory).
constexpr int kMaxSplits = 128;

// The mma kernel's shared memory per block (SplitKvMmaTraits::smem_bytes, which asserts that it
// agrees): the ring, then Q staged as fp32 (16 rows, hdim); the block merge reuses the ring.
constexpr int64_t mma_smem_bytes(Ring ring, int head_dim_class) {
  return int64_t(kMmaWarps) * mma_ring_stages(ring, head_dim_class) * 2 * kMmaSlabKeys * head_dim_class * 2 +
         int64_t(16) * head_dim_class * 4;
}

// A DRAM round trip under load as one block of the mma kernel sees it: its bytes in flight over it are
// the rate at which one block streams the cache. Fitted to session 29's H200 sweep: one split at B = 8,
// 32k keys (64 blocks of 64 KiB in flight, hdim 128) read 55.5 GB/s a block (302 us), 64 KiB / 55.5 GB/s.
constexpr double kLoadedRoundTripSeconds = 1.2e-6;

// Whether `blocks` blocks of the mma kernel, each streaming its cache alone, draw at least 90 % of the
// DRAM's peak bandwidth (0: unknown, never). Where they do, splitting the cache adds blocks that the DRAM
// cannot serve any faster, and costs the partials and the combine. Session 30's sweeps (dev/kvcache_decode.md):
// B = 8 (64 blocks, which pull ~3.5 TB/s by this count) on an H100 (3.35 TB/s peak) one split against two
// 27.6 / 30.7 us at 2k keys, 50.1 / 53.4 at 4k, 347.1 / 351.4 at 32k; on an H200 (4.8 TB/s) two splits win,
// 248 against 302 us at 32k (session 29).
inline bool grid_draws_the_dram(int64_t blocks, int64_t bytes_in_flight, double dram_bytes_per_second) {
  if (dram_bytes_per_second <= 0.0) return false;
  const double pull = double(blocks) * double(bytes_in_flight) / kLoadedRoundTripSeconds;
  return pull >= 0.9 * dram_bytes_per_second;
}

// Whether the DRAM rule above may keep a call's grid unsplit: on a contiguous cache always; on a paged
// one up to kPagedUnsplitKeys keys of capacity. The long-pages walk reads its block-table entries two
// steps ahead, so a paged block alone on an SM streams ~1 % slower than two sharing it, which the
// split's partials and combine outweigh on short caches only (session 41, H100, paged 16, B = 8, one
// split against the four the wave rule takes: 4k keys 49.0 / 51.8 us, 8k 92.3 / 94.2, 16k 178.9 /
// 179.0, 32k 348.3 / 348.0, 128k 1378.6 / 1362.7).
constexpr int64_t kPagedUnsplitKeys = 16384;
constexpr bool dram_rule_covers(bool paged, int64_t capacity) { return !paged || capacity <= kPagedUnsplitKeys; }

// The fewest splits whose wave efficiency (blocks / (waves * slots)) is within 95 % of
// the best; no split when B * Hkv * row blocks already fill the GPU, or draw its DRAM
// (unsplit_draws_the_dram: grid_draws_the_dram of the unsplit grid). A split gets at
// least four tiles of keys. flash-attn's rule takes 85 %; on the H200 that chose 28-29
// splits at B = 1 (8 KV heads, 264 slots), 232 blocks, and the sweep of session 8 timed
// 32 splits 10 % faster at 32k keys (56.0 vs 61.7 us); at B = 8, 4k both rules take 4,
// the best count of the sweep. With two tiles a split, B = 1 with 4k keys took 31
// splits (22.0 us in session 9's sweep, some splits with three tiles); 16 splits of
// four tiles took 19.3 us, the best of that sweep, since each block's fixed cost
// outweighs a tile (dev/kvcache_decode.md). slots: the SMs times
// split_blocks_per_sm (one mma block per SM on a contiguous cache since session 14).
inline int choose_splits(int64_t blocks, int64_t capacity, int slots, bool unsplit_draws_the_dram) {
  const int64_t max_by_keys = std::max<int64_t>(1, capacity / (4 * kKeysPerTile));
  const int max_splits = static_cast<int>(std::min<int64_t>({kMaxSplits, max_by_keys, slots}));
  if (blocks >= int64_t(slots) * 8 / 10 || max_splits <= 1 || unsplit_draws_the_dram) return 1;
  double best = 0.0;
  double efficiency[kMaxSplits + 1] = {};
  for (int s = 1; s <= max_splits; ++s) {
    const double waves = double(blocks * s) / slots;
    efficiency[s] = waves / std::ceil(waves);
    best = std::max(best, efficiency[s]);
  }
  for (int s = 1; s <= max_splits; ++s)
    if (efficiency[s] >= 0.95 * best) return s;
  return 1;
}

}  // namespace flashattn::cuda::decode
