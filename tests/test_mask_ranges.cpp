// The visible ranges that the GPU kernels test elements and tiles against
// (src/common/mask.hpp): each row's keys, each key's queries, the clamped
// offsets into a tile and the wholly visible key tiles, checked against
// MaskPolicy::visible and tile_fully_visible over every small shape, both
// alignments and a set of windows.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/mask.hpp"

namespace {

using flashattn::MaskPolicy;

template <class Check>
void for_each_mask(Check check) {
  const int64_t windows[] = {-1, 0, 1, 3, 16};
  for (int64_t seqlen_q = 1; seqlen_q <= 19; seqlen_q += 3)
    for (int64_t seqlen_k = 0; seqlen_k <= 21; seqlen_k += 3)
      for (bool bottom_right : {false, true})
        for (int64_t left : windows)
          for (int64_t right : windows) check(MaskPolicy::make(seqlen_q, seqlen_k, bottom_right, left, right));
}

TEST(MaskRanges, RowKeysAreTheVisibleKeys) {
  for_each_mask([](const MaskPolicy& mask) {
    for (int64_t i = 0; i < mask.seqlen_q + 2; ++i)
      for (int64_t j = -2; j < mask.seqlen_k + 2; ++j) {
        const bool in_range = j >= mask.key_begin(i) && j < mask.key_end(i + 1);
        ASSERT_EQ(in_range, mask.visible(i, j)) << "Sq " << mask.seqlen_q << " Sk " << mask.seqlen_k << " shift "
                                                << mask.shift << " window (" << mask.window_left << ", "
                                                << mask.window_right << "), i " << i << ", j " << j;
      }
  });
}

TEST(MaskRanges, KeyQueriesAreTheQueriesThatSeeIt) {
  for_each_mask([](const MaskPolicy& mask) {
    for (int64_t j = -2; j < mask.seqlen_k + 2; ++j)
      for (int64_t i = 0; i < mask.seqlen_q + 2; ++i) {
        const bool in_range = i >= mask.query_begin(j) && i < mask.query_end(j);
        ASSERT_EQ(in_range, mask.visible(i, j)) << "Sq " << mask.seqlen_q << " Sk " << mask.seqlen_k << " shift "
                                                << mask.shift << " window (" << mask.window_left << ", "
                                                << mask.window_right << "), i " << i << ", j " << j;
      }
  });
}

// An element at offset e of a tile row starting at column base is visible
// exactly when e lies between the clamped offsets of the row's range.
TEST(MaskRanges, ClampedOffsetsKeepTheTileElements) {
  constexpr int kWidth = 8;
  for_each_mask([](const MaskPolicy& mask) {
    for (int64_t i = 0; i < mask.seqlen_q; ++i)
      for (int64_t base = 0; base < mask.seqlen_k + kWidth; base += 3) {
        const int first = MaskPolicy::offset_in_tile(mask.key_begin(i), base, kWidth);
        const int end = MaskPolicy::offset_in_tile(mask.key_end(i + 1), base, kWidth);
        for (int e = 0; e < kWidth; ++e)
          ASSERT_EQ(e >= first && e < end, mask.visible(i, base + e)) << "i " << i << ", base " << base << ", e " << e;
      }
  });
}

TEST(MaskRanges, WholeKeyTilesAreTheFullyVisibleTiles) {
  for (int block_n : {1, 4, 8}) {
    for_each_mask([block_n](const MaskPolicy& mask) {
      for (int64_t row_begin = 0; row_begin < mask.seqlen_q; ++row_begin)
        for (int64_t rows = 1; row_begin + rows <= mask.seqlen_q; rows += 2) {
          const MaskPolicy::TileRange whole = mask.fully_visible_key_tiles(row_begin, row_begin + rows, block_n);
          for (int64_t n = 0; n * block_n < mask.seqlen_k + block_n; ++n) {
            const bool fully = mask.tile_fully_visible(row_begin, row_begin + rows, n * block_n, (n + 1) * block_n);
            ASSERT_EQ(n >= whole.first && n < whole.end, fully)
                << "rows [" << row_begin << ", " << row_begin + rows << "), tile " << n << " of " << block_n;
          }
        }
    });
  }
}

}  // namespace
