// Which (query tile, head, sequence) a CTA of the sm90 forward works on, and
// what a tile needs: sequence bounds, mask and key-tile range. Producer and
// consumers of a CTA walk the same sequence of tiles with the same functions,
// so they agree on every tile without talking to each other.
//
// Two modes, chosen at compile time (kPersistent):
//   one tile per CTA: grid (m_blocks, heads, batch), m reversed for diagonal
//     masks (the last query tiles see the most keys, so they start first);
//   persistent: grid = min(tiles, SMs) (one CTA per SM fits the register file),
//     CTA c takes tiles c, c + gridDim.x, c + 2 gridDim.x, ... of FwdTileOrder.
//     Static striding needs no counter in global memory, so the launch needs no
//     workspace and replays unchanged in CUDA graphs and on concurrent streams.
#pragma once

#include "cuda/sm80/kernel_traits.cuh"  // SequenceBounds, sequence_bounds

namespace flashattn::sm90 {

// The persistent tile order, computed on the host (launch.cuh). Tiles are
// grouped in sections of section_pairs consecutive (sequence, head) pairs that
// run one after another: the host sizes a section so that its K/V fit in about
// half the L2, so a section's K/V come from DRAM once and serve all its query
// tiles. Inside a section the query tiles go longest first for diagonal masks
// (LPT: the short tiles fill the ragged end), and the pairs of the section take
// turns at each query-tile index, so tiles of equal length sit next to each
// other and one wave covers every pair of the section. Without a diagonal
// mask a pair's query tiles run one after another, as in the grid of one tile
// per CTA, so a wave reads the K/V of a few pairs, not of the whole section.
// h runs fastest across pairs: the query heads of a GQA group, which share
// K/V, are neighbours.
struct FwdTileOrder {
  int group = 1;          // query heads per K/V head, set in both modes: the producer, on 24
                          // registers, should not divide params.heads / heads_kv in 64 bits
  int m_blocks = 0;       // query tiles per (sequence, head): ceil(max seqlen_q / kBlockM)
  int heads = 0;          // query heads per sequence
  int pairs = 0;          // (sequence, head) pairs: heads x batch
  int section_pairs = 1;  // pairs per section, >= 1
  int tiles = 0;          // m_blocks x pairs
};

struct FwdTile {
  int m_block, h, b;
};

template <bool kLongestFirst>
__device__ __forceinline__ FwdTile fwd_tile_at(const FwdTileOrder& order, int t) {
  const int section_tiles = order.section_pairs * order.m_blocks;
  const int section = t / section_tiles;
  const int first_pair = section * order.section_pairs;
  const int pairs = min(order.section_pairs, order.pairs - first_pair);  // the last section may be short
  const int r = t - section * section_tiles;
  const int m_index = kLongestFirst ? r / pairs : r % order.m_blocks;
  const int pair = first_pair + (kLongestFirst ? r - m_index * pairs : r / order.m_blocks);
  FwdTile tile;
  tile.m_block = kLongestFirst ? order.m_blocks - 1 - m_index : m_index;
  tile.b = pair / order.heads;
  tile.h = pair - tile.b * order.heads;
  return tile;
}

template <bool kPersistent, bool kLongestFirst>
struct FwdTileScheduler {
  __device__ __forceinline__ static int first() { return kPersistent ? static_cast<int>(blockIdx.x) : 0; }
  __device__ __forceinline__ static int next(int t) { return kPersistent ? t + static_cast<int>(gridDim.x) : t + 1; }
  __device__ __forceinline__ static bool valid(const FwdTileOrder& order, int t) {
    return kPersistent ? t < order.tiles : t == 0;
  }
  __device__ __forceinline__ static FwdTile tile(const FwdTileOrder& order, int t) {
    if constexpr (kPersistent) {
      return fwd_tile_at<kLongestFirst>(order, t);
    } else {
      FwdTile tile;
      tile.m_block = kLongestFirst ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
      tile.h = blockIdx.y;
      tile.b = blockIdx.z;
      return tile;
    }
  }
};

// The mask of a tile's sequence and the key tiles its rows [m0, m0 + rows)
// visit: [first, last), walked from the last; empty when no row sees a key
// (then the tile loads nothing and writes O = 0, LSE = +inf). Producer and
// consumers both derive a tile's loop from these two functions. The consumers
// hold the results as loose values, and `empty` is the comparison of the key
// bounds, not of the block numbers: a struct holding mask and bounds, or
// empty() recomputed from first / last, cost the hdim-256 causal softcap/ALiBi
// kernel 64 bytes of spills under ptxas 13.0 (0 as written).
__device__ __forceinline__ MaskPolicy tile_mask(const FwdParams& params, const sm80::SequenceBounds& seq) {
  return MaskPolicy::make(seq.len_q, seq.len_k, params.align_bottom_right, params.window_left, params.window_right);
}

struct KeyBlockRange {
  int first, last;
  bool empty;  // no row sees a key; then first = last = 0
};

template <int kBlockN>
__device__ __forceinline__ KeyBlockRange key_block_range(const MaskPolicy& mask, int m0, int rows) {
  const int64_t key_begin = mask.key_begin(m0), key_end = mask.key_end(m0 + rows);
  const bool no_keys = key_end <= key_begin;
  return {no_keys ? 0 : static_cast<int>(key_begin / kBlockN),
          no_keys ? 0 : static_cast<int>((key_end + kBlockN - 1) / kBlockN), no_keys};
}

}  // namespace flashattn::sm90
