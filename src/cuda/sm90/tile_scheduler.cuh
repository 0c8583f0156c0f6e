// Which (query tile, head, sequence) a CTA of the sm90 forward works on, and
// what a tile needs: sequence bounds, mask and key-tile range. Producer and
// consumers of a CTA walk the same sequence of tiles with the same functions,
// so they agree on every tile without talking to each other.
//
// Two modes, chosen at compile time (kPersistent):
//   one tile per CTA: grid (m_blocks, heads, batch), m reversed for diagonal
//     masks (the last query tiles see the most keys, so they start first; the
//     hardware hands each free SM the next CTA, which balances the lengths);
//   persistent: grid = min(units, SMs) (one CTA per SM fits the register file),
//     CTA c takes units c, c + gridDim.x, c + 2 gridDim.x, ... of FwdTileOrder,
//     a unit being one tile, or under a diagonal mask two tiles of equal total
//     length (tile_order.hpp). Static striding needs no counter in global
//     memory, so the launch needs no workspace and replays unchanged in CUDA
//     graphs and on concurrent streams.
#pragma once

#include "cuda/sm80/kernel_traits.cuh"  // SequenceBounds, sequence_bounds
#include "cuda/sm90/tile_order.hpp"

namespace flashattn::sm90 {

template <bool kPersistent, bool kMaskDiagonal>
struct FwdTileScheduler {
  __device__ __forceinline__ static int first() {
    return kPersistent ? fwd_first_tile_index<kMaskDiagonal>(static_cast<int>(blockIdx.x)) : 0;
  }
  __device__ __forceinline__ static int next(int t) {
    return kPersistent ? fwd_next_tile_index<kMaskDiagonal>(t, static_cast<int>(gridDim.x)) : t + 1;
  }
  __device__ __forceinline__ static bool valid(const FwdTileOrder& order, int t) {
    return kPersistent ? t < order.tiles : t == 0;
  }
  __device__ __forceinline__ static FwdTile tile(const FwdTileOrder& order, int t) {
    if constexpr (kPersistent) {
      return fwd_tile_at<kMaskDiagonal>(order, t);
    } else {
      FwdTile tile;
      tile.m_block = kMaskDiagonal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
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
