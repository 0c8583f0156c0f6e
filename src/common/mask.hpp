// One masking policy for every backend: causal, sliding window, sequence
// bounds and the ALiBi distance all derive from the same shifted diagonal.
// Row i of a sequence is aligned with key i + shift, shift = Sk - Sq for
// bottom-right alignment (flash-attn) and 0 for top-left (torch SDPA).
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace flashattn {

struct MaskPolicy {
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t shift = 0;
  int64_t window_left = -1;   // -1: unbounded
  int64_t window_right = -1;  // -1: unbounded; causal means 0

  FA_HOST_DEVICE static MaskPolicy make(int64_t seqlen_q, int64_t seqlen_k, bool align_bottom_right,
                                        int64_t window_left, int64_t window_right) {
    MaskPolicy mask;
    mask.seqlen_q = seqlen_q;
    mask.seqlen_k = seqlen_k;
    mask.shift = align_bottom_right ? seqlen_k - seqlen_q : 0;
    mask.window_left = window_left;
    mask.window_right = window_right;
    return mask;
  }

  FA_HOST_DEVICE bool visible(int64_t i, int64_t j) const {
    if (j < 0 || j >= seqlen_k) return false;
    const int64_t diagonal = i + shift;
    if (window_left >= 0 && j < diagonal - window_left) return false;
    if (window_right >= 0 && j > diagonal + window_right) return false;
    return true;
  }

  // Keys [first, last) that some row of [row_begin, row_end) can see; empty when first >= last.
  FA_HOST_DEVICE int64_t key_begin(int64_t row_begin) const {
    const int64_t begin = window_left >= 0 ? row_begin + shift - window_left : 0;
    return begin < 0 ? 0 : begin;
  }
  FA_HOST_DEVICE int64_t key_end(int64_t row_end) const {
    const int64_t end = window_right >= 0 ? row_end - 1 + shift + window_right + 1 : seqlen_k;
    return end > seqlen_k ? seqlen_k : end;
  }

  // The queries i >= 0 that see key j: [query_begin(j), query_end(j)), empty
  // when the first is not below the second (visible(i, j) exactly there).
  FA_HOST_DEVICE int64_t query_begin(int64_t j) const {
    if (j < 0 || j >= seqlen_k || window_right < 0) return 0;
    const int64_t begin = j - shift - window_right;
    return begin < 0 ? 0 : begin;
  }
  FA_HOST_DEVICE int64_t query_end(int64_t j) const {
    if (j < 0 || j >= seqlen_k) return 0;
    return window_left >= 0 ? j - shift + window_left + 1 : kUnbounded;
  }
  static constexpr int64_t kUnbounded = INT64_MAX / 2;

  // A bound of a visible range as an offset from base, clamped to [0, width]:
  // kernels test an element at offset e < width of a tile row against two of
  // these with 32-bit compares instead of calling visible() with 64-bit indices.
  FA_HOST_DEVICE static int offset_in_tile(int64_t bound, int64_t base, int width) {
    const int64_t offset = bound - base;
    return offset < 0 ? 0 : offset > width ? width : static_cast<int>(offset);
  }

  // The key tiles of width block_n that every row of [row_begin, row_end) sees
  // whole: tile n = [n block_n, (n + 1) block_n) for first <= n < end (empty
  // when first >= end), the tiles tile_fully_visible accepts. Kernels compare a
  // tile index against these instead of evaluating that per tile.
  struct TileRange {
    int64_t first, end;
  };
  FA_HOST_DEVICE TileRange fully_visible_key_tiles(int64_t row_begin, int64_t row_end, int block_n) const {
    const int64_t begin = key_begin(row_end - 1), end = key_end(row_begin + 1);
    return {(begin + block_n - 1) / block_n, end > 0 ? end / block_n : 0};
  }

  // True when every (i, j) of the tile is visible, so the tile runs unmasked.
  FA_HOST_DEVICE bool tile_fully_visible(int64_t row_begin, int64_t row_end, int64_t col_begin,
                                         int64_t col_end) const {
    if (col_begin < 0 || col_end > seqlen_k) return false;
    if (window_left >= 0 && col_begin < row_end - 1 + shift - window_left) return false;
    if (window_right >= 0 && col_end - 1 > row_begin + shift + window_right) return false;
    return true;
  }

  // |i + shift - j|, the ALiBi distance.
  FA_HOST_DEVICE float alibi_distance(int64_t i, int64_t j) const {
    const int64_t d = i + shift - j;
    return static_cast<float>(d < 0 ? -d : d);
  }
};

}  // namespace flashattn
