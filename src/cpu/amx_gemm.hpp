// The AMX kernel sets' gemm engine (isa_amx.cpp): the packed layouts'
// packers from fp32 (or fp32 split into bf16 pieces) and the blocks of
// tiles that multiply them. Included only by isa_amx.cpp, under its
// AVX-512 + AMX target pragma; the anonymous namespace keeps it private
// there. The layouts are described at the top of isa_amx.cpp.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/amx_pieces.hpp"

namespace flashattn {
namespace cpu {
namespace {

// A gemm on packed operands (A planes of (m16, k32), B pairs with its
// column tile stride and plane) into C (m16, n16), ldc, as blocks of up to
// 32 x 32 that run_block runs one at a time, row blocks outer.
struct PackedGemm {
  const uint16_t* a = nullptr;
  int64_t a_row_length = 0, a_plane = 0;
  const uint32_t* b = nullptr;
  int64_t b_col_stride = 0, b_plane = 0;
  int m16 = 0, n16 = 0, k32 = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
  // A's k in chunks of a_chunk_k (a multiple of 32) a_chunk_stride elements
  // apart (one chunk per key tile of a shared operand); 0: one run.
  int a_chunk_k = 0;
  int64_t a_chunk_stride = 0;
  int col_blocks() const { return (n16 + 31) / 32; }
  int blocks() const { return (m16 + 31) / 32 * col_blocks(); }
};

// The C block at (i0, j0) of (16 * kRowTiles, 16 * kColTiles) in tiles
// 0-3: per piece product and 32-wide k step, A and B tiles are loaded once
// and feed kRowTiles * kColTiles products.
template <int kPieces, int kRowTiles, int kColTiles>
void amx_block(const PackedGemm& g, int i0, int j0) {
  const int64_t ldc = g.ldc;
  float* c00 = g.c + i0 * ldc + j0;
  const int64_t c_stride = ldc * 4;
  if (g.accumulate) {
    _tile_loadd(0, c00, c_stride);
    if (kColTiles > 1) _tile_loadd(1, c00 + 16, c_stride);
    if (kRowTiles > 1) _tile_loadd(2, c00 + 16 * ldc, c_stride);
    if (kRowTiles > 1 && kColTiles > 1) _tile_loadd(3, c00 + 16 * ldc + 16, c_stride);
  } else {
    _tile_zero(0);
    if (kColTiles > 1) _tile_zero(1);
    if (kRowTiles > 1) _tile_zero(2);
    if (kRowTiles > 1 && kColTiles > 1) _tile_zero(3);
  }
  constexpr int64_t kTileStride = 64;  // bytes per tile row: tiles are contiguous
  const uint16_t* a_rows = g.a + i0 * g.a_row_length;
  const uint32_t* b_cols = g.b + static_cast<int64_t>(j0 / 16) * g.b_col_stride;
  const auto load_a = [&](int piece, int l) {
    const int64_t k_offset =
        g.a_chunk_k == 0 ? l / 32 * 512 : l / g.a_chunk_k * g.a_chunk_stride + l % g.a_chunk_k / 32 * 512;
    _tile_loadd(4, a_rows + piece * g.a_plane + k_offset, kTileStride);
    if (kRowTiles > 1) _tile_loadd(5, a_rows + piece * g.a_plane + 16 * g.a_row_length + k_offset, kTileStride);
  };
  const auto load_b = [&](int piece, int l) {
    const uint32_t* b_tile = b_cols + piece * g.b_plane + l / 32 * 256;
    _tile_loadd(6, b_tile, kTileStride);
    if (kColTiles > 1) _tile_loadd(7, b_tile + g.b_col_stride, kTileStride);
  };
  const auto multiply = [] {
    _tile_dpbf16ps(0, 4, 6);
    if (kColTiles > 1) _tile_dpbf16ps(1, 4, 7);
    if (kRowTiles > 1) _tile_dpbf16ps(2, 5, 6);
    if (kRowTiles > 1 && kColTiles > 1) _tile_dpbf16ps(3, 5, 7);
  };
  using Products = SplitProducts<kPieces>;
  if constexpr (Products::kSmall > 0) {
    for (int l = 0; l < g.k32; l += 32) {
#pragma GCC unroll 8
      for (int step = 0; step < Products::kSmall; ++step) {
        if (step == 0 || Products::a[step] != Products::a[step - 1]) load_a(Products::a[step], l);
        if (step == 0 || Products::b[step] != Products::b[step - 1]) load_b(Products::b[step], l);
        multiply();
      }
    }
  }
  for (int l = 0; l < g.k32; l += 32) {
    load_a(0, l);
    load_b(0, l);
    multiply();
  }
  _tile_stored(0, c00, c_stride);
  if (kColTiles > 1) _tile_stored(1, c00 + 16, c_stride);
  if (kRowTiles > 1) _tile_stored(2, c00 + 16 * ldc, c_stride);
  if (kRowTiles > 1 && kColTiles > 1) _tile_stored(3, c00 + 16 * ldc + 16, c_stride);
}

template <int kPieces>
void run_block(const PackedGemm& g, int index) {
  const int i0 = index / g.col_blocks() * 32, j0 = index % g.col_blocks() * 32;
  const bool two_rows = i0 + 32 <= g.m16, two_cols = j0 + 32 <= g.n16;
  if (two_rows && two_cols)
    amx_block<kPieces, 2, 2>(g, i0, j0);
  else if (two_rows)
    amx_block<kPieces, 2, 1>(g, i0, j0);
  else if (two_cols)
    amx_block<kPieces, 1, 2>(g, i0, j0);
  else
    amx_block<kPieces, 1, 1>(g, i0, j0);
}

// Blocks of up to three gemms, run in order a share at a time
// (run_share) between steps of vector work.
template <int kPieces>
struct BlockSchedule {
  PackedGemm gemms[3];
  int count = 0, total = 0, done = 0;
  int current = 0, first_block = 0;  // the next block: gemms[current], its first_block'th
  void add(const PackedGemm& g) {
    gemms[count++] = g;
    total += g.blocks();
  }
  // Runs blocks until share / shares of all have run.
  void run_share(int share, int shares) {
    for (const int target = total * share / shares; done < target; ++done) {
      if (first_block == gemms[current].blocks()) {
        ++current;
        first_block = 0;
      }
      run_block<kPieces>(gemms[current], first_block);
      ++first_block;
    }
  }
};

// A element (i, l) at a[i * a_row + l * a_col] -> dst planes (m16, k32).
template <int kPieces, Split kSplit = Split::kRound>
void pack_a(int m, int k, const float* a, int64_t a_row, int64_t a_col, int m16, int k32, uint16_t* dst_rows) {
  const int64_t plane = static_cast<int64_t>(m16) * k32;
  if (a_col == 1) {
    for (int i = 0; i < m16; ++i) {
      uint16_t* dst = dst_rows + static_cast<int64_t>(i / 16) * 16 * k32 + (i % 16) * 32;
      const float* src = a + i * a_row;
      for (int l = 0; l < k32; l += 32) {
        __m512 lo[kPieces], hi[kPieces];
        split_pieces_as<kPieces, kSplit>(load_or_zero(src + l, i < m, lanes_mask(k - l)), lo);
        split_pieces_as<kPieces, kSplit>(load_or_zero(src + l + 16, i < m, lanes_mask(k - l - 16)), hi);
        for (int piece = 0; piece < kPieces; ++piece)
          _mm512_storeu_si512(dst + piece * plane + l / 32 * 512,
                              reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi[piece], lo[piece])));
      }
    }
    return;
  }
  // Transposed source (a_row == 1, the only other layout the algorithm uses): pair rows l, l+1 of the (k, m) source,
  // then transpose 16 x 16 blocks of pairs into rows of A.
  const int pairs = k32 / 2;
  for (int i0 = 0; i0 < m16; i0 += 16) {
    const __mmask16 mask = lanes_mask(m - i0);
    for (int t0 = 0; t0 < pairs; t0 += 16) {
      __m512i block[kPieces][16];
      for (int t = 0; t < 16; ++t) {
        const int l = 2 * (t0 + t);
        __m512 r0[kPieces], r1[kPieces];
        split_pieces_as<kPieces, kSplit>(load_or_zero(a + l * a_col + i0 * a_row, l < k, mask), r0);
        split_pieces_as<kPieces, kSplit>(load_or_zero(a + (l + 1) * a_col + i0 * a_row, l + 1 < k, mask), r1);
        for (int piece = 0; piece < kPieces; ++piece) block[piece][t] = pair_rows(r0[piece], r1[piece]);
      }
      for (int piece = 0; piece < kPieces; ++piece) {
        transpose16x16(block[piece]);
        for (int i = 0; i < 16; ++i)
          _mm512_storeu_si512(dst_rows + piece * plane + static_cast<int64_t>(i0) * k32 + t0 / 16 * 512 + i * 32,
                              block[piece][i]);
      }
    }
  }
}

// B (k, n) row-major -> dst planes (k32 / 2, n16) of pairs; column tile
// j / 16 starts at j * k32 / 2.
template <int kPieces, Split kSplit = Split::kRound>
void pack_b(int k, int n, const float* b, int64_t ldb, int k32, int n16, uint32_t* dst_rows) {
  const int64_t plane = static_cast<int64_t>(n16) * (k32 / 2);
  // One tile (16 pair rows, 16 columns) at a time: its KiB is written in
  // order (row by row, a 4 KiB stride would alias in L1).
  for (int t0 = 0; t0 < k32 / 2; t0 += 16) {
    for (int j = 0; j < n16; j += 16) {
      const __mmask16 mask = lanes_mask(n - j);
      uint32_t* dst = dst_rows + static_cast<int64_t>(j) * (k32 / 2) + t0 / 16 * 256;
      for (int t = t0; t < t0 + 16; ++t) {
        const int l = 2 * t;
        __m512 r0[kPieces], r1[kPieces];
        split_pieces_as<kPieces, kSplit>(load_or_zero(b + l * ldb + j, l < k, mask), r0);
        split_pieces_as<kPieces, kSplit>(load_or_zero(b + (l + 1) * ldb + j, l + 1 < k, mask), r1);
        for (int piece = 0; piece < kPieces; ++piece)
          _mm512_storeu_si512(dst + piece * plane + (t - t0) * 16, pair_rows(r0[piece], r1[piece]));
      }
    }
  }
}

}  // namespace
}  // namespace cpu
}  // namespace flashattn
