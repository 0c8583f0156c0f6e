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
FA_HOST_DEVICE FwdTile fwd_tile_at(const FwdTileOrder& order, int t) {
  const int section_tiles = order.section_pairs * order.m_blocks;
  const int section = t / section_tiles;
  const int first_pair = section * order.section_pairs;
  const int left = order.pairs - first_pair;  // the last section may be short
  const int pairs = order.section_pairs < left ? order.section_pairs : left;
  const int r = t - section * section_tiles;
  const int m_index = kLongestFirst ? r / pairs : r % order.m_blocks;
  const int pair = first_pair + (kLongestFirst ? r - m_index * pairs : r / order.m_blocks);
  FwdTile tile;
  tile.m_block = kLongestFirst ? order.m_blocks - 1 - m_index : m_index;
  tile.b = pair / order.heads;
  tile.h = pair - tile.b * order.heads;
  return tile;
}

}  // namespace flashattn::sm90
