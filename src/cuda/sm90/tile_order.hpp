// The persistent sm90 forward's tile order: host and device code, so that a
// CPU test (tests/test_fwd_tile_order.cpp) checks it on shapes no GPU test
// covers. See tile_scheduler.cuh for how the kernel walks it.
#pragma once

#include "common/host_device.hpp"

namespace flashattn::sm90 {

// The persistent tile order, computed on the host (launch.cuh). Tiles are
// grouped in sections of section_pairs consecutive (sequence, head) pairs that
// run one after another: the host sizes a section so that its K/V fit in about
// half the L2, so a section's K/V come from DRAM once and serve all its query
// tiles. h runs fastest across pairs: the query heads of a GQA group, which
// share K/V, are neighbours.
//
// Without a diagonal mask a pair's query tiles run one after another, as in
// the grid of one tile per CTA, so a wave reads the K/V of a few pairs, not of
// the whole section; every tile costs the same, and CTA c takes tiles c,
// c + G, c + 2 G, ... (G CTAs).
//
// Diagonal masks pair the query tiles: unit j of a pair is its tile
// m_blocks - 1 - j, then its tile j. Under a causal mask the two see
// m_blocks + 1 query tiles' worth of keys together, whatever j, so every unit
// costs the same and CTA c takes units c, c + G, ... Striding over single
// tiles in longest-first order instead gave each CTA a mix of lengths that
// drifts with c (CTA 0 got the longest tile of every wave at hdim 256, 16k):
// 1.16-1.8x the mean load in a simulation of the issue-5 shapes, the size of
// the persistent kernels' deficit at causal. Inside a section the pairs take
// turns at each j, so one wave covers every pair of the section. An odd
// m_blocks leaves the middle tile alone: its unit's second index names tile
// m_blocks, past every sequence, which producer and consumers skip.
struct FwdTileOrder {
  int group = 1;          // query heads per K/V head, set in both modes: the producer, on 24
                          // registers, should not divide params.heads / heads_kv in 64 bits
  int m_blocks = 0;       // query tiles per (sequence, head): ceil(max seqlen_q / kBlockM)
  int heads = 0;          // query heads per sequence
  int pairs = 0;          // (sequence, head) pairs: heads x batch
  int section_pairs = 1;  // pairs per section, >= 1
  int tiles = 0;          // tile indices: fwd_tile_indices_per_pair x pairs
};

struct FwdTile {
  int m_block, h, b;
};

// Tile indices a CTA takes in a row: two (a unit) under a diagonal mask.
template <bool kPaired>
constexpr int fwd_tiles_per_unit() {
  return kPaired ? 2 : 1;
}

// Tile indices of one pair: m_blocks, rounded up to whole units.
template <bool kPaired>
FA_HOST_DEVICE int fwd_tile_indices_per_pair(int m_blocks) {
  return kPaired ? 2 * ((m_blocks + 1) / 2) : m_blocks;
}

// The tile indices CTA cta of ctas walks: its units cta, cta + ctas, ...
template <bool kPaired>
FA_HOST_DEVICE int fwd_first_tile_index(int cta) {
  return fwd_tiles_per_unit<kPaired>() * cta;
}
template <bool kPaired>
FA_HOST_DEVICE int fwd_next_tile_index(int t, int ctas) {
  if constexpr (!kPaired) return t + ctas;
  return (t & 1) == 0 ? t + 1 : t - 1 + 2 * ctas;  // the unit's second tile, else the next unit's first
}

template <bool kPaired>
FA_HOST_DEVICE FwdTile fwd_tile_at(const FwdTileOrder& order, int t) {
  const int section_tiles = order.section_pairs * fwd_tile_indices_per_pair<kPaired>(order.m_blocks);
  const int section = t / section_tiles;
  const int first_pair = section * order.section_pairs;
  const int left = order.pairs - first_pair;  // the last section may be short
  const int pairs = order.section_pairs < left ? order.section_pairs : left;
  const int r = t - section * section_tiles;
  FwdTile tile;
  int pair;
  if constexpr (kPaired) {
    const int unit = r >> 1;
    const int j = unit / pairs;
    pair = first_pair + unit - j * pairs;
    const int long_tile = order.m_blocks - 1 - j;
    tile.m_block = (r & 1) == 0 ? long_tile : (j == long_tile ? order.m_blocks : j);
  } else {
    tile.m_block = r % order.m_blocks;
    pair = first_pair + r / order.m_blocks;
  }
  tile.b = pair / order.heads;
  tile.h = pair - tile.b * order.heads;
  return tile;
}

}  // namespace flashattn::sm90
