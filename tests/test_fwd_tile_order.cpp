// The persistent sm90 forward's tile order (src/cuda/sm90/tile_order.hpp),
// checked on the host: every tile index names a distinct (query tile, head,
// sequence), so the CTAs striding over [0, tiles) cover each tile once; a
// section holds exactly its pairs; diagonal masks go longest first inside a
// section with the pairs taking turns; dense masks run a pair's query tiles in
// a row, ascending.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>

#include "cuda/sm90/tile_order.hpp"

namespace {

using flashattn::sm90::fwd_tile_at;
using flashattn::sm90::FwdTile;
using flashattn::sm90::FwdTileOrder;

FwdTileOrder make_order(int m_blocks, int heads, int batch, int section_pairs) {
  FwdTileOrder order;
  order.m_blocks = m_blocks;
  order.heads = heads;
  order.pairs = heads * batch;
  order.section_pairs = section_pairs;
  order.tiles = m_blocks * order.pairs;
  return order;
}

template <bool kLongestFirst>
void check_order(const FwdTileOrder& order, int batch) {
  const std::string shape = "m_blocks " + std::to_string(order.m_blocks) + ", heads " + std::to_string(order.heads) +
                            ", batch " + std::to_string(batch) + ", section " + std::to_string(order.section_pairs) +
                            (kLongestFirst ? ", longest first" : ", dense");
  SCOPED_TRACE(shape);
  std::set<std::tuple<int, int, int>> seen;
  for (int t = 0; t < order.tiles; ++t) {
    const FwdTile tile = fwd_tile_at<kLongestFirst>(order, t);
    ASSERT_TRUE(tile.m_block >= 0 && tile.m_block < order.m_blocks && tile.h >= 0 && tile.h < order.heads &&
                tile.b >= 0 && tile.b < batch)
        << "tile " << t << ": " << tile.m_block << ", " << tile.h << ", " << tile.b;
    EXPECT_TRUE(seen.insert({tile.m_block, tile.h, tile.b}).second) << "tile " << t << " repeats";
    const int pair = tile.b * order.heads + tile.h;
    EXPECT_EQ(pair / order.section_pairs, t / (order.section_pairs * order.m_blocks)) << "tile " << t << " section";
    if (t == 0 || t % (order.section_pairs * order.m_blocks) == 0) continue;  // a section's first tile
    const FwdTile previous = fwd_tile_at<kLongestFirst>(order, t - 1);
    const int previous_pair = previous.b * order.heads + previous.h;
    if (kLongestFirst) {
      EXPECT_LE(tile.m_block, previous.m_block) << "tile " << t << ": longest first";
      if (tile.m_block == previous.m_block) {
        EXPECT_EQ(pair, previous_pair + 1) << "tile " << t << ": pairs in turn";
      }
    } else if (pair == previous_pair) {
      EXPECT_EQ(tile.m_block, previous.m_block + 1) << "tile " << t << ": a pair's query tiles in a row";
    } else {
      EXPECT_EQ(pair, previous_pair + 1) << "tile " << t;
      EXPECT_EQ(tile.m_block, 0) << "tile " << t;
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), order.tiles);
}

TEST(FwdTileOrder, EveryTileOnceInEitherOrder) {
  for (int m_blocks : {1, 3, 8, 32, 128})
    for (int heads : {1, 5, 16})
      for (int batch : {1, 2, 4})
        for (int section_pairs : {1, 2, 3, 12, 64, 1000}) {
          const int pairs = heads * batch;
          const FwdTileOrder order = make_order(m_blocks, heads, batch, section_pairs < pairs ? section_pairs : pairs);
          check_order<true>(order, batch);
          check_order<false>(order, batch);
        }
}

}  // namespace
