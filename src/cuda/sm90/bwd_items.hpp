// The order in which a CTA of the sm90 backward visits its items, and the
// deterministic mode's order of dQ adds: host and device code, so that the
// CPU tests (tests/test_bwd_item_order.cpp) check the properties the
// hand-off relies on (every wait on a CTA launched earlier, ranks without
// gaps) on shapes no GPU test covers.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"
#include "common/mask.hpp"

namespace flashattn::sm90 {

#if !defined(__CUDACC__)
// CUDA declares min and max for every integer type; the host-only build of
// the tests gets the two this header uses.
inline int min(int a, int b) { return a < b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
#endif

// The items of one CTA (key tile n_block): the query heads of its GQA group
// ascending, and for each the query tiles that see a key of the tile,
// descending (ascending in deterministic mode). Producer and consumers walk the same sequence. The mask's
// bounds are kept in 32 bits (CUDA sequence lengths are below 2^31) because
// the producer runs on 24 registers; for the same reason the order is a
// template argument.
//
// Deterministic mode adds the dQ of a query tile in a fixed key-tile order,
// descending, with query tiles ascending in each CTA and the CTAs of the last
// key tiles launched first (deterministic_launch_slot). Every wait is then on
// a CTA that started earlier, so none can wait on one that is not resident,
// and under a causal mask a CTA's first query tile is the diagonal one, where
// it comes first: the CTAs of one head hand over without waiting for each
// other. The default mode keeps query tiles descending (no order among the adds).
//
// Without a mask every CTA would start at query tile 0 and each would wait
// for the one before: a chain of hand-offs as long as the key tiles. There
// (pass.dq_copies == 2) CTA n starts at query tile first_query_tile =
// floor(n M / C) (M query tiles, C key tiles) and wraps around: tiles
// [first, M) add into dQ copy 0, tiles [0, first) into copy 1, each copy in
// descending key-tile order. That is the order in which the CTAs, running
// side by side, reach a query tile, so a hand-off rarely waits, and every
// wait is still on a CTA that started earlier. The convert pass sums the
// copies in a fixed order.
//
// Under a causal mask the descending order launches a head's longest CTAs
// (its first key tiles) last, and they set the end of the launch: about 7 % of
// the ideal at 16k tokens (dev/det_launch_sim.py). There (key_group_tiles > 0)
// the key tiles form groups of key_group_tiles, group g adding into dQ copy g
// in descending key-tile order of its own, and the groups launch in turn,
// the first (longest) one first (deterministic_launch_slot): the last CTAs
// launched are then the short ones of the last group, and every wait is still
// on a CTA launched earlier.
template <int kBlockM, int kBlockN>
struct BwdItems {
  int len_q, len_k;
  int n_block, m_blocks, h_end, first_query_tile;
  int first_visiting, last_visiting;  // the query tiles that see a key of n_block: [first, last]
  // shift + window_right, clamped to 32 bits (INT32_MAX without a right bound):
  // query row i sees keys below i + 1 + end_offset (and below len_k).
  int end_offset;
  int key_group, key_group_end;  // n_block's group and the key tile past it
  bool rotated;

  // rotated: pass.dq_copies == 2, which the host sets only where (M + 1) C
  // stays below 2^31. key_group_tiles: pass.key_group_tiles (0: one group).
  FA_HOST_DEVICE static BwdItems make(const MaskPolicy& mask, int n_block, int h_end, bool rotated,
                                      int key_group_tiles) {
    BwdItems items;
    items.len_q = static_cast<int>(mask.seqlen_q);
    items.len_k = static_cast<int>(mask.seqlen_k);
    items.n_block = n_block;
    items.m_blocks = (items.len_q + kBlockM - 1) / kBlockM;
    items.h_end = h_end;
    items.rotated = rotated;
    items.first_query_tile = rotated ? n_block * items.m_blocks / items.key_tiles() : 0;
    items.key_group = key_group_tiles > 0 ? n_block / key_group_tiles : 0;
    items.key_group_end = key_group_tiles > 0 ? (items.key_group + 1) * key_group_tiles : items.key_tiles();
    items.find_visiting_range(mask);
    const int64_t end_offset = mask.window_right >= 0 ? mask.shift + mask.window_right : INT32_MAX;
    items.end_offset = static_cast<int>(min(max(end_offset, int64_t(-INT32_MAX)), int64_t(INT32_MAX)));
    return items;
  }
  // Query tile m covers the keys [begin(m), end(m)) (last_visiting_block),
  // both nondecreasing in m, so the tiles that see a key of n_block, i.e.
  // end(m) > n_block kBlockN and begin(m) < min((n_block + 1) kBlockN, len_k),
  // are a range; found once here in 64 bits, the walk (next) then tests a
  // tile with two 32-bit comparisons.
  FA_HOST_DEVICE void find_visiting_range(const MaskPolicy& mask) {
    const int64_t low_key = int64_t(n_block) * kBlockN;
    const int64_t high_key = min(low_key + kBlockN, int64_t(len_k));
    first_visiting = 0;
    if (mask.window_right >= 0) {  // end(m) > low_key <=> min((m + 1) kBlockM, len_q) > threshold
      const int64_t threshold = low_key - mask.shift - mask.window_right;
      first_visiting = len_q <= threshold ? m_blocks
                       : threshold < kBlockM ? 0
                                             : static_cast<int>((threshold - kBlockM) / kBlockM + 1);
    }
    last_visiting = m_blocks - 1;
    if (mask.window_left >= 0) {  // begin(m) < high_key <=> m kBlockM < bound
      const int64_t bound = high_key - mask.shift + mask.window_left;
      last_visiting = bound <= 0 ? -1 : static_cast<int>(min((bound - 1) / kBlockM, int64_t(m_blocks - 1)));
    }
  }
  FA_HOST_DEVICE int key_tiles() const { return (len_k + kBlockN - 1) / kBlockN; }
  // The last key tile that query tile m_block visits; -1 when it does not
  // visit n_block. The key range is MaskPolicy's key_begin / key_end, here in
  // 32 bits: rows end before len_q < 2^31, and where end_offset would carry
  // the end past len_k the comparison picks len_k instead of adding.
  FA_HOST_DEVICE int last_visiting_block(int m_block) const {
    if (!visits(m_block)) return -1;
    const int m0 = m_block * kBlockM, row_end = len_q - m0 > kBlockM ? m0 + kBlockM : len_q;
    const int key_end = end_offset >= len_k - row_end ? len_k : row_end + end_offset;
    return (key_end - 1) / kBlockN;
  }
  // Whether query tile m_block sees a key of n_block (last_visiting_block >= 0).
  FA_HOST_DEVICE bool visits(int m_block) const { return m_block >= first_visiting && m_block <= last_visiting; }
  // The m_block before the first item.
  template <bool kAscending>
  FA_HOST_DEVICE int m_start() const {
    return kAscending ? -1 : m_blocks;
  }
  // Start with h = the group's first head and m_block = m_start<kAscending>().
  // Ascending, the query tiles of a head run from first_query_tile around to
  // the one before it. kEveryTileVisits: the mask has no window (every query
  // tile sees every key), which the dense kernels know at compile time; the
  // visibility test then drops out of the loop, whose state the 24-register
  // producer and releaser warps otherwise spill.
  template <bool kAscending, bool kEveryTileVisits = false>
  FA_HOST_DEVICE bool next(int& h, int& m_block) const {
    if (m_blocks == 0) return false;
    if (kAscending && m_block < 0) {
      m_block = first_query_tile;
      if (kEveryTileVisits || visits(m_block)) return true;
    }
    while (true) {
      m_block += kAscending ? 1 : -1;
      if (m_block < 0 || m_block >= m_blocks) {
        m_block = kAscending ? 0 : m_blocks - 1;
        if (!kAscending && ++h >= h_end) return false;
      }
      if (kAscending && m_block == first_query_tile && ++h >= h_end) return false;
      if (kEveryTileVisits || visits(m_block)) return true;
    }
  }
  // Deterministic mode: the dQ copy that query tile m_block adds into, and
  // this CTA's place in that copy's order (how many key tiles add before it).
  FA_HOST_DEVICE int dq_copy(int m_block) const {
    return rotated ? (m_block < first_query_tile ? 1 : 0) : key_group;
  }
  template <bool kEveryTileVisits = false>
  FA_HOST_DEVICE int dq_rank(int m_block) const {
    if (!rotated)
      return min(kEveryTileVisits ? key_tiles() - 1 : last_visiting_block(m_block), key_group_end - 1) - n_block;
    const int tiles = key_tiles();
    if (m_block < first_query_tile) return tiles - 1 - n_block;  // copy 1: the CTAs starting past m_block
    // Copy 0: the key tiles n with floor(n M / C) <= m_block, i.e. n < ceil((m_block + 1) C / M).
    const int starters = min(tiles, ((m_block + 1) * tiles + m_blocks - 1) / m_blocks);
    return starters - 1 - n_block;
  }
};

// A deterministic CTA's place in the grid: key tile and K/V head (in the pass).
struct BwdLaunchSlot {
  int n_block, kv_head;
};

// The deterministic mode's launch order. CTA number `slot` in launch order
// (blockIdx.x + key_tiles * blockIdx.y: x varies fastest) of a grid of
// key_tiles x kv_heads. Without groups (key_group_tiles == 0) the heads in
// turn, each's key tiles descending. With groups the groups in turn (key
// tiles [g S, g S + S), S = key_group_tiles), in each the heads in turn, each
// head's key tiles of the group descending.
FA_HOST_DEVICE BwdLaunchSlot deterministic_launch_slot(int slot, int key_tiles, int kv_heads,
                                                       int key_group_tiles) {
  if (key_group_tiles <= 0) return {key_tiles - 1 - slot % key_tiles, slot / key_tiles};
  const int full_group_slots = key_group_tiles * kv_heads;
  const int group = slot / full_group_slots, first = group * key_group_tiles;
  const int size = min(key_group_tiles, key_tiles - first), in_group = slot - group * full_group_slots;
  return {first + size - 1 - in_group % size, in_group / size};
}

}  // namespace flashattn::sm90
