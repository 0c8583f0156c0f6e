// Register-level pieces of the AMX kernel sets (isa_amx.cpp): the tile
// configuration, bf16 pairs and 16 x 16 word transposes for the packed
// layouts, the bf16 pieces of fp32 operands, and the packing of bf16 rows
// straight into those layouts. Included only by isa_amx.cpp, under its
// AVX-512 + AMX target pragma; the anonymous namespace keeps it private there.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/avx512_kernels.hpp"

namespace flashattn {
namespace cpu {
namespace {

int round_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }

// Palette 1, all eight tiles 16 rows x 64 bytes.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
  AmxTileConfig() {
    for (int t = 0; t < 8; ++t) {
      bytes_per_row[t] = 64;
      rows[t] = 16;
    }
  }
};

// Words 0..15 (a) and 16..31 (b) of x as 16 pairs (a[j], b[j]).
__m512i interleave_halves(__m512i x) {
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, x);
}

// Interleaves two rows of 16 fp32 into 16 bf16 pairs (r0[j], r1[j]).
__m512i pair_rows(__m512 r0, __m512 r1) {
  return interleave_halves(reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(r1, r0)));  // r0 in words 0..15
}

__m512 load_or_zero(const float* row, bool present, __mmask16 mask) {
  return present ? _mm512_maskz_loadu_ps(mask, row) : _mm512_setzero_ps();
}

// kPieces = 1: bf16 tensors, each operand rounded to bf16 (exact for Q, K,
// V, dO). kPieces = 3: fp32 tensors, each operand split into x = x0 + x1 +
// x2 (+ r) with bf16 pieces of decreasing size (split_pieces: r = 0 below
// 2^100, else |r| <= 2^-24 |x|, fp32's own unit roundoff). A B is then
// the sum of the 6 piece products whose size is >= 2^-16 |A B| (the 3
// dropped ones are <= 2^-24 |A B|, like fp32 rounding; < 2^-23 with one
// operand split by truncation, split_pieces_as). Products of bf16 are
// exact in fp32 and TDPBF16PS accumulates in fp32, so the result carries the
// error of an fp32 sum of 6 k terms. The 5 small products go first, over
// all of k, while the running sum is small (its roundings are then 2^-8 of
// the main sum's), and the main one x0 y0 last. Within a k step the small
// ones are ordered so that each reloads only one operand piece.
template <int kPieces>
struct SplitProducts;
template <>
struct SplitProducts<1> {
  static constexpr int kSmall = 0;
  static constexpr int a[1] = {0};
  static constexpr int b[1] = {0};
};
template <>
struct SplitProducts<3> {
  static constexpr int kSmall = 5;
  static constexpr int a[5] = {2, 1, 1, 0, 0};
  static constexpr int b[5] = {0, 0, 1, 1, 2};
};

__m512 round_to_bf16(__m512 x) { return bf16_to_ps(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x))); }

// The bf16 pieces of x, as fp32 lanes, by Veltkamp splitting: with
// c = 2^16 + 1, hi = c x - (c x - x) keeps the top 8 significant bits of x
// (rounded to nearest) and x - hi is exact with at most 15 bits; split
// again, the three pieces hold every bit of x, each representable in bf16
// (a piece below 2^-126 flushes to 0 in the bf16 conversion: an absolute
// error under 2^-126), in 8 vector operations. A vector with a lane where
// c x could overflow (|x| >= 2^100), an infinity or a NaN takes three
// roundings to bf16 instead, with |x - x0 - x1 - x2| <= 2^-24 |x|; there an
// infinite or NaN x0 takes all of x, and the other pieces are 0 (inf - inf
// would make them NaN).
template <int kPieces>
void split_pieces(__m512 x, __m512 pieces[kPieces]) {
  if constexpr (kPieces == 1) {
    pieces[0] = x;
  } else {
    const __mmask16 moderate = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(0x1p100f), _CMP_LT_OQ);
    if (moderate == 0xFFFF) {
      // Each operation rounded on its own: GCC's plain _mm512_mul_ps and
      // _mm512_sub_ps are vector arithmetic it may fuse into an FMA
      // (-ffp-contract=fast), which computes c x - x exactly and breaks the split.
      constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
      const __m512 splitter = _mm512_set1_ps(65537.0f);
      __m512 rest = x;
      for (int i = 0; i + 1 < kPieces; ++i) {
        const __m512 scaled = _mm512_mul_round_ps(rest, splitter, kNearest);
        pieces[i] = _mm512_sub_round_ps(scaled, _mm512_sub_round_ps(scaled, rest, kNearest), kNearest);
        rest = _mm512_sub_round_ps(rest, pieces[i], kNearest);
      }
      pieces[kPieces - 1] = rest;
      return;
    }
    constexpr int kNanOrInf = 0x01 | 0x08 | 0x10 | 0x80;  // vfpclassps: QNaN, +Inf, -Inf, SNaN
    pieces[0] = round_to_bf16(x);
    const __mmask16 finite = static_cast<__mmask16>(~_mm512_fpclass_ps_mask(pieces[0], kNanOrInf));
    __m512 rest = _mm512_maskz_sub_ps(finite, x, pieces[0]);
    for (int i = 1; i < kPieces; ++i) {
      pieces[i] = round_to_bf16(rest);
      rest = _mm512_sub_ps(rest, pieces[i]);
    }
  }
}

// The same pieces by truncation, for an operand whose partner in every
// product was split by rounding (split_pieces): piece i is the top 16 bits
// of the rest (sign, exponent and 7 mantissa bits: a bf16 value as it
// stands), the rest after it exact; the last takes what is left, at most 8
// significant bits. A piece is then at most 2^-7 of the one before (2^-8 by
// rounding), so the piece products dropped against a rounded partner stay
// below 2^-23 of the product (two truncated operands could reach 2^-20, which
// the callers never multiply). 4 vector operations for three pieces against
// split_pieces' 10. An infinite or NaN lane keeps all of x in piece 0 and
// zeros in the others, as in split_pieces (inf - inf would make the rests
// NaN); the other lanes of its vector are split as usual, so a NaN leaves
// the bits of its neighbours alone.
enum class Split { kRound, kTruncate };

template <int kPieces, Split kSplit>
void split_pieces_as(__m512 x, __m512 pieces[kPieces]) {
  if constexpr (kPieces == 1 || kSplit == Split::kRound) {
    split_pieces<kPieces>(x, pieces);
  } else {
    constexpr int kNanOrInf = 0x01 | 0x08 | 0x10 | 0x80;  // vfpclassps: QNaN, +Inf, -Inf, SNaN
    const __mmask16 nonfinite = _mm512_fpclass_ps_mask(x, kNanOrInf);
    const __m512 upper = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
    __m512 rest = nonfinite == 0 ? x : _mm512_maskz_mov_ps(static_cast<__mmask16>(~nonfinite), x);
    for (int i = 0; i + 1 < kPieces; ++i) {
      pieces[i] = _mm512_and_ps(rest, upper);
      rest = _mm512_sub_ps(rest, pieces[i]);
    }
    pieces[kPieces - 1] = rest;
    if (nonfinite != 0) pieces[0] = _mm512_mask_mov_ps(pieces[0], nonfinite, x);
  }
}

// Two rows of probabilities (p >= 0: keys 2t and 2t + 1 of P^T) as pair row
// t of a packed B operand's three planes, split by truncation as in
// split_pieces_as. A truncated piece is the upper half of its word, so a
// pair's words are (row 2t's piece >> 16) | (row 2t + 1's piece & 0xFFFF0000):
// no conversion and no word permutation (pair_rows), 15 vector operations
// against 26 for split_pieces and pair_rows. The last rest has at most 8
// significant bits, all in its word's upper half, unless it is subnormal
// (p below about 2^-110, scores ~76 below the row's maximum, as ALiBi over
// a long row gives): its bits then reach into the lower half, which for row
// 2t + 1 would land in row 2t's word, so that piece is masked too (row 2t's
// lower half is shifted out; the dropped bits are below 2^-126). No infinity
// check: the forward's probabilities are at most 2^8 (a NaN lane stays NaN in
// its own lane).
inline void store_truncated_pairs(__m512 p0, __m512 p1, uint32_t* pair_row, int64_t plane) {
  const __m512i upper = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512i rest0 = _mm512_castps_si512(p0), rest1 = _mm512_castps_si512(p1);
  for (int piece = 0; piece < 3; ++piece) {
    const bool last = piece == 2;
    const __m512i head0 = last ? rest0 : _mm512_and_si512(rest0, upper);
    const __m512i head1 = _mm512_and_si512(rest1, upper);
    _mm512_storeu_si512(pair_row + piece * plane, _mm512_or_si512(_mm512_srli_epi32(head0, 16), head1));
    if (last) break;
    rest0 = _mm512_castps_si512(_mm512_sub_ps(_mm512_castsi512_ps(rest0), _mm512_castsi512_ps(head0)));
    rest1 = _mm512_castps_si512(_mm512_sub_ps(_mm512_castsi512_ps(rest1), _mm512_castsi512_ps(head1)));
  }
}

// Packing bf16 rows straight into the layouts of isa_amx.cpp, as pack_a and
// pack_b pack the same values staged as fp32 (kPieces = 1): `rows` rows of
// `cols` bf16 (an even count), row r at base + r * stride bytes; padding is
// zero. No conversion and no fp32 staging pass.
__mmask32 words_mask(int count) {
  return count >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << (count > 0 ? count : 0)) - 1u);
}

// The rows as an A operand: (m16, k32) in 16 x 32 tiles, row tiles outer.
void pack_bf16_rows_a(const char* base, int64_t stride, int rows, int cols, int m16, int k32, uint16_t* dst_rows) {
  for (int i = 0; i < m16; ++i) {
    uint16_t* dst = dst_rows + static_cast<int64_t>(i / 16) * 16 * k32 + (i % 16) * 32;
    const char* row = base + i * stride;
    for (int l = 0; l < k32; l += 32) {
      const __m512i words = i < rows ? _mm512_maskz_loadu_epi16(words_mask(cols - l), row + l * 2) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + l / 32 * 512, words);
    }
  }
}

// Their transpose (cols, rows) as an A operand: rows 2t, 2t + 1 interleaved
// into pairs, then 16 x 16 transposes of the pairs.
void pack_bf16_rows_transposed_a(const char* base, int64_t stride, int rows, int cols, int m16, int k32,
                                 uint16_t* dst_rows) {
  const auto half_row = [&](int r, int c0, __mmask16 mask) {
    return r < rows ? _mm256_maskz_loadu_epi16(mask, base + r * stride + c0 * 2) : _mm256_setzero_si256();
  };
  for (int c0 = 0; c0 < m16; c0 += 16) {
    const __mmask16 mask = lanes_mask(cols - c0);
    for (int t0 = 0; t0 < k32 / 2; t0 += 16) {
      __m512i block[16];
      for (int t = 0; t < 16; ++t) {
        const int r = 2 * (t0 + t);
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(half_row(r, c0, mask)), half_row(r + 1, c0, mask), 1);
        block[t] = interleave_halves(both);
      }
      transpose16x16(block);
      for (int c = 0; c < 16; ++c)
        _mm512_storeu_si512(dst_rows + static_cast<int64_t>(c0) * k32 + t0 / 16 * 512 + c * 32, block[c]);
    }
  }
}

// Their transpose (cols, rows) as a B operand: pair (B[2t][j], B[2t + 1][j])
// is word t of row j, so each 16 x 16 block of words is transposed into
// place; column tile j / 16 starts at j * k32 / 2.
void pack_bf16_rows_transposed_b(const char* base, int64_t stride, int rows, int cols, int k32, int n16,
                                 uint32_t* dst_rows) {
  const int pairs = k32 / 2;
  for (int j0 = 0; j0 < n16; j0 += 16) {
    for (int t0 = 0; t0 < pairs; t0 += 16) {
      const __mmask16 mask = lanes_mask(cols / 2 - t0);
      __m512i block[16];
      for (int r = 0; r < 16; ++r)
        block[r] = j0 + r < rows ? _mm512_maskz_loadu_epi32(mask, base + (j0 + r) * stride + t0 * 4)
                                 : _mm512_setzero_si512();
      transpose16x16(block);
      uint32_t* dst = dst_rows + static_cast<int64_t>(j0) * pairs + t0 * 16;
      for (int t = 0; t < 16; ++t) _mm512_storeu_si512(dst + t * 16, block[t]);
    }
  }
}

}  // namespace
}  // namespace cpu
}  // namespace flashattn
