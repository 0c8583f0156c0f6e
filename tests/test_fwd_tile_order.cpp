// The persistent sm90 forward's tile order (src/cuda/sm90/tile_order.hpp),
// checked on the host: the CTAs' walks cover every tile index once and every
// index names a distinct (query tile, head, sequence); a section holds exactly
// its pairs; dense masks run a pair's query tiles in a row, ascending;
// diagonal masks take units of two tiles (m_blocks - 1 - j, then j) whose
// causal key counts add up to the same total, with the pairs taking turns at
// each j, so that CTAs striding over units carry loads at most one unit apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/sm90/tile_order.hpp"

namespace {

using flashattn::sm90::fwd_first_tile_index;
using flashattn::sm90::fwd_next_tile_index;
using flashattn::sm90::fwd_tile_at;
using flashattn::sm90::fwd_tile_indices_per_pair;
using flashattn::sm90::FwdTile;
using flashattn::sm90::FwdTileOrder;

template <bool kPaired>
FwdTileOrder make_order(int m_blocks, int heads, int batch, int section_pairs) {
  FwdTileOrder order;
  order.m_blocks = m_blocks;
  order.heads = heads;
  order.pairs = heads * batch;
  order.section_pairs = section_pairs;
  order.tiles = fwd_tile_indices_per_pair<kPaired>(m_blocks) * order.pairs;
  return order;
}

// Every index once over the walks of ctas CTAs; returns each CTA's indices.
template <bool kPaired>
std::vector<std::vector<int>> walks(const FwdTileOrder& order, int ctas) {
  std::vector<std::vector<int>> walk(ctas);
  std::vector<int> visits(order.tiles, 0);
  for (int cta = 0; cta < ctas; ++cta)
    for (int t = fwd_first_tile_index<kPaired>(cta); t < order.tiles; t = fwd_next_tile_index<kPaired>(t, ctas)) {
      walk[cta].push_back(t);
      ++visits[t];
    }
  for (int t = 0; t < order.tiles; ++t) EXPECT_EQ(visits[t], 1) << "tile index " << t << " over " << ctas << " CTAs";
  return walk;
}

template <bool kPaired>
void check_order(const FwdTileOrder& order, int batch) {
  const std::string shape = "m_blocks " + std::to_string(order.m_blocks) + ", heads " + std::to_string(order.heads) +
                            ", batch " + std::to_string(batch) + ", section " + std::to_string(order.section_pairs) +
                            (kPaired ? ", paired" : ", dense");
  SCOPED_TRACE(shape);
  const int m_blocks = order.m_blocks;
  const int section_tiles = order.section_pairs * fwd_tile_indices_per_pair<kPaired>(m_blocks);
  std::set<std::tuple<int, int, int>> seen;
  for (int t = 0; t < order.tiles; ++t) {
    const FwdTile tile = fwd_tile_at<kPaired>(order, t);
    ASSERT_TRUE(tile.m_block >= 0 && tile.m_block <= m_blocks && tile.h >= 0 && tile.h < order.heads &&
                tile.b >= 0 && tile.b < batch)
        << "tile " << t << ": " << tile.m_block << ", " << tile.h << ", " << tile.b;
    const int pair = tile.b * order.heads + tile.h;
    EXPECT_EQ(pair / order.section_pairs, t / section_tiles) << "tile " << t << " section";
    if (tile.m_block == m_blocks) {  // the empty partner of an odd count's middle tile
      ASSERT_TRUE(kPaired && m_blocks % 2 == 1 && t % 2 == 1) << "tile " << t << " past the end";
      EXPECT_EQ(fwd_tile_at<kPaired>(order, t - 1).m_block, m_blocks / 2) << "tile " << t;
      continue;
    }
    EXPECT_TRUE(seen.insert({tile.m_block, tile.h, tile.b}).second) << "tile " << t << " repeats";
    if (t % section_tiles == 0) continue;  // a section's first tile
    const FwdTile previous = fwd_tile_at<kPaired>(order, t - 1);
    const int previous_pair = previous.b * order.heads + previous.h;
    if (kPaired && t % 2 == 1) {  // a unit's second tile: the same pair, the mirror of the first
      EXPECT_EQ(pair, previous_pair) << "tile " << t;
      EXPECT_EQ(tile.m_block + previous.m_block, m_blocks - 1) << "tile " << t;
    } else if (kPaired) {  // a unit's first tile: the longest left, the pairs in turn
      const FwdTile previous_first = fwd_tile_at<kPaired>(order, t - 2);
      EXPECT_LE(tile.m_block, previous_first.m_block) << "tile " << t << ": longest first";
      if (tile.m_block == previous_first.m_block) {
        EXPECT_EQ(pair, previous_pair + 1) << "tile " << t << ": pairs in turn";
      }
      EXPECT_GE(2 * tile.m_block, m_blocks - 1) << "tile " << t << ": a unit starts with its long tile";
    } else if (pair == previous_pair) {
      EXPECT_EQ(tile.m_block, previous.m_block + 1) << "tile " << t << ": a pair's query tiles in a row";
    } else {
      EXPECT_EQ(pair, previous_pair + 1) << "tile " << t;
      EXPECT_EQ(tile.m_block, 0) << "tile " << t;
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), m_blocks * order.pairs);
}

TEST(FwdTileOrder, EveryTileOnceInEitherOrder) {
  for (int m_blocks : {1, 2, 3, 8, 31, 32, 128})
    for (int heads : {1, 5, 16})
      for (int batch : {1, 2, 4})
        for (int section_pairs : {1, 2, 3, 12, 64, 1000}) {
          const int pairs = heads * batch;
          const int section = section_pairs < pairs ? section_pairs : pairs;
          check_order<true>(make_order<true>(m_blocks, heads, batch, section), batch);
          check_order<false>(make_order<false>(m_blocks, heads, batch, section), batch);
        }
}

TEST(FwdTileOrder, EveryIndexOnceOverTheCtasWalks) {
  for (int m_blocks : {1, 3, 32, 128})
    for (int pairs : {1, 7, 128})
      for (int ctas : {1, 2, 132}) {
        SCOPED_TRACE("m_blocks " + std::to_string(m_blocks) + ", pairs " + std::to_string(pairs) + ", ctas " +
                     std::to_string(ctas));
        walks<true>(make_order<true>(m_blocks, pairs, 1, 5 < pairs ? 5 : pairs), ctas);
        walks<false>(make_order<false>(m_blocks, pairs, 1, 5 < pairs ? 5 : pairs), ctas);
      }
}

// Causal, square: query tile m sees m + 1 query tiles' worth of keys. With 132
// CTAs striding over units, every CTA's load is within one unit (m_blocks + 1)
// of every other's, on the shapes of issue 5's table (16k tokens, H D = 2048,
// 128-row tiles) and on a few odd ones.
TEST(FwdTileOrder, PairedUnitsBalanceACausalMask) {
  struct Shape {
    int m_blocks, heads, batch, section_pairs;
  };
  for (const Shape s : {Shape{8, 32, 16, 16}, Shape{32, 32, 4, 25}, Shape{128, 32, 1, 12}, Shape{32, 16, 4, 12},
                        Shape{128, 8, 1, 1}, Shape{33, 5, 3, 4}, Shape{7, 3, 1, 3}}) {
    SCOPED_TRACE("m_blocks " + std::to_string(s.m_blocks) + ", pairs " + std::to_string(s.heads * s.batch));
    const FwdTileOrder order = make_order<true>(s.m_blocks, s.heads, s.batch, s.section_pairs);
    const std::vector<std::vector<int>> walk = walks<true>(order, 132);
    std::vector<int> load;
    for (const std::vector<int>& indices : walk) {
      int keys = 0;
      for (int t : indices) {
        const int m_block = fwd_tile_at<true>(order, t).m_block;
        if (m_block < s.m_blocks) keys += m_block + 1;
      }
      load.push_back(keys);
    }
    const auto [lightest, heaviest] = std::minmax_element(load.begin(), load.end());
    EXPECT_LE(*heaviest - *lightest, s.m_blocks + 1) << "loads " << *lightest << " .. " << *heaviest;
  }
}

}  // namespace
