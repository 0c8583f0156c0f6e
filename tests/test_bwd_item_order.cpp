// The sm90 backward's item order and deterministic dQ order (src/cuda/sm90/
// bwd_items.hpp), checked on the host over many shapes and masks: every CTA
// visits exactly the query tiles that see one of its keys, in both orders;
// the adds into each (head, query tile, dQ copy) have ranks 0..k-1 by
// descending key tile, so every wait is on a CTA launched earlier; a
// simulated launch (in the kernel's launch order, deterministic_launch_slot)
// finishes with any number of resident CTAs; and where the order is meant to
// match the CTAs' arrival (causal masks, the rotated order without a mask)
// CTAs running side by side never wait. Under masks the key tiles are also
// checked in groups, each adding into a dQ copy of its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/sm90/bwd_items.hpp"

namespace {

using flashattn::MaskPolicy;
using flashattn::sm90::BwdItems;
using flashattn::sm90::deterministic_launch_slot;

struct Shape {
  int len_q, len_k;
  bool bottom_right;
  int window_left, window_right;  // causal: (-1, 0)
  int group;                      // query heads per CTA (GQA)
  std::string name() const {
    return "q" + std::to_string(len_q) + "_k" + std::to_string(len_k) + (bottom_right ? "_br" : "_tl") + "_w" +
           std::to_string(window_left) + "_" + std::to_string(window_right) + "_g" + std::to_string(group);
  }
  bool dense() const { return window_left < 0 && window_right < 0; }
  MaskPolicy mask() const { return MaskPolicy::make(len_q, len_k, bottom_right, window_left, window_right); }
};

struct Item {
  int h, m_block, copy, rank;
};

// The items of CTA n_block in the order the kernel walks them; with
// kEveryTileVisits as the dense kernels walk them (no visibility test).
template <int kBlockM, int kBlockN, bool kEveryTileVisits = false>
std::vector<Item> walk(const Shape& shape, int n_block, bool deterministic, bool rotated, int key_group_tiles = 0) {
  const auto items = BwdItems<kBlockM, kBlockN>::make(shape.mask(), n_block, shape.group, rotated, key_group_tiles);
  std::vector<Item> out;
  int h = 0;
  int m_block = deterministic ? items.template m_start<true>() : items.template m_start<false>();
  while (deterministic ? items.template next<true, kEveryTileVisits>(h, m_block)
                       : items.template next<false, kEveryTileVisits>(h, m_block)) {
    out.push_back({h, m_block, items.dq_copy(m_block), items.template dq_rank<kEveryTileVisits>(m_block)});
    if (out.size() > 1u << 20) break;  // a walk that does not end
  }
  return out;
}

// Whether some query of tile m_block sees some key of tile n_block.
template <int kBlockM, int kBlockN>
bool tile_visible(const MaskPolicy& mask, int m_block, int n_block) {
  for (int64_t i = int64_t(m_block) * kBlockM; i < std::min<int64_t>((m_block + 1) * kBlockM, mask.seqlen_q); ++i)
    for (int64_t j = int64_t(n_block) * kBlockN; j < std::min<int64_t>((n_block + 1) * kBlockN, mask.seqlen_k); ++j)
      if (mask.visible(i, j)) return true;
  return false;
}

// Runs the deterministic hand-off: CTAs (indexed by key tile) launch in the
// order of deterministic_launch_slot for one K/V head, at most `resident` at
// a time (a finished one frees its place for the next); in each step every
// resident CTA adds its next item if the semaphore of its (head, query tile,
// copy) has reached its rank. A release is seen from the
// next step on, as the kernel's releases land during the next item. Returns
// the number of waits (a CTA that could not add), or -1 when no CTA can move
// (a deadlock).
int64_t simulate(const std::vector<std::vector<Item>>& ctas, int resident, int key_group_tiles) {
  const int count = static_cast<int>(ctas.size());
  std::map<std::tuple<int, int, int>, int> semaphores;
  std::vector<size_t> next(count, 0);
  int launched = 0, finished = 0;
  std::vector<int> running;
  int64_t waits = 0;
  while (finished < count) {
    while (static_cast<int>(running.size()) < resident && launched < count)
      running.push_back(deterministic_launch_slot(launched++, count, 1, key_group_tiles).n_block);
    bool moved = false;
    std::vector<int> still;
    std::vector<std::tuple<int, int, int>> released;
    for (int n : running) {
      if (next[n] < ctas[n].size()) {
        const Item& item = ctas[n][next[n]];
        if (semaphores[{item.h, item.m_block, item.copy}] == item.rank) {
          released.push_back({item.h, item.m_block, item.copy});
          ++next[n];
          moved = true;
        } else {
          ++waits;
        }
      }
      if (next[n] == ctas[n].size()) {
        ++finished;
        moved = true;
      } else {
        still.push_back(n);
      }
    }
    running = still;
    for (const auto& where : released) ++semaphores[where];
    if (!moved) return -1;
  }
  return waits;
}

template <int kBlockM, int kBlockN>
void check_shape(const Shape& shape, bool rotated, int key_group_tiles = 0) {
  SCOPED_TRACE(shape.name() + " block " + std::to_string(kBlockM) + "x" + std::to_string(kBlockN) +
               (rotated ? " rotated" : "") + " key groups of " + std::to_string(key_group_tiles));
  const MaskPolicy mask = shape.mask();
  const int m_blocks = (shape.len_q + kBlockM - 1) / kBlockM, n_blocks = (shape.len_k + kBlockN - 1) / kBlockN;
  std::vector<std::vector<Item>> ctas;
  // (head, query tile, copy) -> the key tiles adding there and their ranks
  std::map<std::tuple<int, int, int>, std::map<int, int>> adders;
  for (int n = 0; n < n_blocks; ++n) {
    const std::vector<Item> det = walk<kBlockM, kBlockN>(shape, n, true, rotated, key_group_tiles);
    const std::vector<Item> plain = walk<kBlockM, kBlockN>(shape, n, false, rotated, key_group_tiles);
    std::set<std::pair<int, int>> expected, seen_det, seen_plain;
    for (int h = 0; h < shape.group; ++h)
      for (int m = 0; m < m_blocks; ++m)
        if (tile_visible<kBlockM, kBlockN>(mask, m, n)) expected.insert({h, m});
    for (const Item& item : det) EXPECT_TRUE(seen_det.insert({item.h, item.m_block}).second) << "twice: " << n;
    for (const Item& item : plain) EXPECT_TRUE(seen_plain.insert({item.h, item.m_block}).second) << "twice: " << n;
    EXPECT_EQ(seen_det, expected) << "key tile " << n << ", deterministic order";
    EXPECT_EQ(seen_plain, expected) << "key tile " << n << ", default order";
    for (size_t i = 1; i < det.size(); ++i) EXPECT_LE(det[i - 1].h, det[i].h) << "heads ascending";
    for (const Item& item : det) {
      if (rotated)
        EXPECT_TRUE(item.copy == 0 || item.copy == 1) << "the rotated order's two copies";
      else
        EXPECT_EQ(item.copy, key_group_tiles > 0 ? n / key_group_tiles : 0) << "key tile " << n << "'s group";
      adders[{item.h, item.m_block, item.copy}][n] = item.rank;
    }
    ctas.push_back(det);
  }
  for (const auto& [where, ranks] : adders) {
    // Ranks 0..k-1, the highest key tile first: a CTA waits only on CTAs launched before it.
    int expected_rank = 0;
    for (auto it = ranks.rbegin(); it != ranks.rend(); ++it)
      EXPECT_EQ(it->second, expected_rank++) << "head " << std::get<0>(where) << ", query tile "
                                             << std::get<1>(where) << ", copy " << std::get<2>(where)
                                             << ", key tile " << it->first;
  }
  if (::testing::Test::HasFailure()) return;
  for (int resident : {1, 2, 5, n_blocks})
    EXPECT_GE(simulate(ctas, resident, key_group_tiles), 0) << resident << " resident";
  // Side by side, the order matches the arrival: no CTA waits.
  const bool causal_square = shape.window_left < 0 && shape.window_right == 0 && shape.len_q == shape.len_k;
  if ((rotated && m_blocks >= n_blocks) || causal_square) {
    EXPECT_EQ(simulate(ctas, n_blocks, key_group_tiles), 0);
  }
}

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int group : {1, 2})
    for (auto [len_q, len_k] : std::vector<std::pair<int, int>>{
             {1, 1}, {64, 64}, {100, 700}, {700, 100}, {1000, 1000}, {1000, 1500}, {130, 3000}, {2048, 2048},
             {300, 9000}, {9000, 5000}})
      for (bool bottom_right : {true, false})
        for (auto [left, right] : std::vector<std::pair<int, int>>{
                 {-1, -1}, {-1, 0}, {200, 0}, {-1, 130}, {0, 0}, {2147483000, 2147483000}, {0, 2147483000}})
          out.push_back({len_q, len_k, bottom_right, left, right, group});
  return out;
}

TEST(BwdItemOrder, EveryShapeAndTile) {
  for (const Shape& shape : shapes()) {
    check_shape<64, 128>(shape, false);   // class 128
    check_shape<128, 128>(shape, false);  // class 64
    check_shape<64, 64>(shape, false);    // class 256
    if (shape.dense()) {
      check_shape<64, 128>(shape, true);
      check_shape<128, 128>(shape, true);
      check_shape<64, 64>(shape, true);
    } else {
      // The host's two groups, four, and the extremes: one key tile per
      // group, and two.
      for (int block_n : {128, 64}) {
        const int n_blocks = (shape.len_k + block_n - 1) / block_n;
        for (int group_tiles : {(n_blocks + 1) / 2, (n_blocks + 3) / 4, 1, 2}) {
          if (block_n == 128) {
            check_shape<64, 128>(shape, false, group_tiles);
            check_shape<128, 128>(shape, false, group_tiles);
          } else {
            check_shape<64, 64>(shape, false, group_tiles);
          }
        }
      }
    }
  }
}

template <int kBlockM, int kBlockN>
void expect_dense_walks_equal(const Shape& shape) {
  const int key_tiles = (shape.len_k + kBlockN - 1) / kBlockN;
  for (int n = 0; n < key_tiles; ++n)
    for (bool deterministic : {false, true})
      for (bool rotated : {false, true}) {
        if (rotated && !deterministic) continue;
        const auto generic = walk<kBlockM, kBlockN>(shape, n, deterministic, rotated);
        const auto dense = walk<kBlockM, kBlockN, true>(shape, n, deterministic, rotated);
        ASSERT_EQ(generic.size(), dense.size()) << shape.name() << " key tile " << n;
        for (size_t i = 0; i < generic.size(); ++i) {
          EXPECT_EQ(generic[i].h, dense[i].h);
          EXPECT_EQ(generic[i].m_block, dense[i].m_block);
          EXPECT_EQ(generic[i].copy, dense[i].copy);
          EXPECT_EQ(generic[i].rank, dense[i].rank) << shape.name() << " key tile " << n << " item " << i;
        }
      }
}

TEST(BwdItemOrder, DenseKernelsWalkTheSameItems) {
  for (const Shape& shape : shapes()) {
    if (!shape.dense()) continue;
    expect_dense_walks_equal<64, 128>(shape);
    expect_dense_walks_equal<128, 128>(shape);
    expect_dense_walks_equal<64, 64>(shape);
  }
}

TEST(BwdItemOrder, LaunchSlotsCoverTheGridInGroups) {
  for (int key_tiles : {1, 2, 5, 12, 128})
    for (int kv_heads : {1, 3, 16})
      for (int group_tiles : {0, 1, 3, (key_tiles + 3) / 4, key_tiles}) {
        SCOPED_TRACE(std::to_string(key_tiles) + " key tiles, " + std::to_string(kv_heads) + " heads, groups of " +
                     std::to_string(group_tiles));
        std::set<std::pair<int, int>> seen;
        int previous_group = 0;
        std::map<int, int> last_tile_of_head;  // within the current group
        for (int slot = 0; slot < key_tiles * kv_heads; ++slot) {
          const auto [n, h] = deterministic_launch_slot(slot, key_tiles, kv_heads, group_tiles);
          ASSERT_TRUE(n >= 0 && n < key_tiles && h >= 0 && h < kv_heads) << "slot " << slot << ": " << n << ", " << h;
          EXPECT_TRUE(seen.insert({n, h}).second) << "slot " << slot << " repeats " << n << ", " << h;
          const int group = group_tiles > 0 ? n / group_tiles : 0;
          EXPECT_GE(group, previous_group) << "groups launch in turn, slot " << slot;
          if (group != previous_group) last_tile_of_head.clear();
          previous_group = group;
          const auto it = last_tile_of_head.find(h);
          if (it != last_tile_of_head.end()) {
            EXPECT_LT(n, it->second) << "a head's key tiles descend in a group";
          }
          last_tile_of_head[h] = n;
        }
      }
}

TEST(BwdItemOrder, RotationRemovesTheChainWithoutAMask) {
  // Without a mask and without the rotation every CTA starts on query tile 0
  // and key tile n waits for the n before it.
  const Shape shape{1024, 1024, true, -1, -1, 1};
  std::vector<std::vector<Item>> plain, rotated;
  for (int n = 0; n < 1024 / 128; ++n) {
    plain.push_back(walk<64, 128>(shape, n, true, false));
    rotated.push_back(walk<64, 128>(shape, n, true, true));
  }
  EXPECT_GT(simulate(plain, 8, 0), 0);
  EXPECT_EQ(simulate(rotated, 8, 0), 0);
}

}  // namespace
