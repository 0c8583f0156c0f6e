// The two products of a KV-cache key chunk (kvcache_impl.hpp) for bf16
// caches on CPUs with AVX512-BF16 (VDPBF16PS: 16 fp32 lanes, each += the two
// products of a bf16 pair), included by kvcache_avx512bf16.cpp only.
//
// Why: the AVX-512 build converts every K and V element of a chunk to fp32
// before its FMAs; at GQA-4 decode those conversions and the FMAs, not memory,
// set the speed (8-9 GB/s of K/V on two Zen 4 cores, whose memory copies at
// 28-33). Here K and V are read as bf16 straight from the cache and each
// instruction does twice the products:
//   scores  4 rows x 4 keys at a time, one accumulator per (row, key) over
//           the head dim in pairs of dims, the 16 reduced together into 16
//           scores (sum_lanes_of_16). Q is the staged query in bf16, which
//           holds it exactly (load_rotated_row rounds it to the cache dtype);
//           the scale comes after the dot product.
//   P V     keys in pairs: the rows of keys j and j + 1 interleaved 16 bits at
//           a time (VPUNPCKLWD / VPUNPCKHWD) pair V[j][c] with V[j + 1][c],
//           and P[r][j], P[r][j + 1] rounded to bf16 form the other pair.
//           Within a 128-bit block the unpacks hold dims 0-3 (low) and 4-7
//           (high) of that block's 8, so the accumulators keep dims in that
//           order and two permutes turn them into O's natural order and back.
// Exactness: bf16 x bf16 products are exact in fp32, so the scores differ from
// the fp32 path only in the order of their sums. P rounded to bf16 is the
// rounding that flash-attn's kernels (and this library's GPU kernels) make
// before P V; the row sums l stay in fp32. VDPBF16PS treats denormal inputs as
// zero and flushes denormal results: below 2^-126, nothing that a probability
// or an attention output of bf16 values can show.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/kvcache_chunk_avx512.hpp"  // sum_lanes_of_16

namespace flashattn {
namespace cpu {
namespace {

// Lanes [0, n) of a 32 x 16-bit vector (none for n <= 0).
inline __mmask32 pairs_mask(int64_t n) {
  return n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << (n > 0 ? n : 0)) - 1u);
}

inline __m512bh as_bf16(__m512i x) { return reinterpret_cast<__m512bh>(x); }

// s (nr, nk), row r at s + r * ld_s, = factor * q (nr, d) k^T: q rows of bf16
// at q + r * d, key j's bf16 row at k_rows[j]. 4 rows x 4 keys a step (each K
// vector loaded once for the 4 rows); past the last row or key the step
// repeats it, and those lanes are not stored.
inline void chunk_scores_bf16(const uint16_t* q, int nr, int64_t d, const uint16_t* const* k_rows, int nk,
                              float factor, float* s, int64_t ld_s) {
  constexpr int kRows = 4, kKeys = 4;
  const __m512 scale = _mm512_set1_ps(factor);
  for (int r0 = 0; r0 < nr; r0 += kRows) {
    const int rows = nr - r0 < kRows ? nr - r0 : kRows;
    const uint16_t* q_rows[kRows];
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) q_rows[r] = q + (r0 + (r < rows ? r : rows - 1)) * d;
    for (int j0 = 0; j0 < nk; j0 += kKeys) {
      const int keys = nk - j0 < kKeys ? nk - j0 : kKeys;
      const uint16_t* keys_of[kKeys];
#pragma GCC unroll 4
      for (int j = 0; j < kKeys; ++j) keys_of[j] = k_rows[j0 + (j < keys ? j : keys - 1)];
      __m512 acc[16];  // acc[4 r + j]: row r0 + r, key j0 + j
      for (__m512& a : acc) a = _mm512_setzero_ps();
      for (int64_t c = 0; c < d; c += 32) {
        const __mmask32 mask = pairs_mask(d - c);
        __m512bh k_pairs[kKeys];
#pragma GCC unroll 4
        for (int j = 0; j < kKeys; ++j) k_pairs[j] = as_bf16(_mm512_maskz_loadu_epi16(mask, keys_of[j] + c));
#pragma GCC unroll 4
        for (int r = 0; r < kRows; ++r) {
          const __m512bh q_pairs = as_bf16(_mm512_maskz_loadu_epi16(mask, q_rows[r] + c));
#pragma GCC unroll 4
          for (int j = 0; j < kKeys; ++j) {
            __m512& a = acc[kKeys * r + j];
            a = _mm512_dpbf16_ps(a, q_pairs, k_pairs[j]);
          }
        }
      }
      const __m512 sums = _mm512_mul_ps(sum_lanes_of_16(acc), scale);  // lane 4 r + j
      const __mmask16 stored = static_cast<__mmask16>((1u << keys) - 1u);
      for (int r = 0; r < rows; ++r)
        _mm512_mask_storeu_ps(s + (r0 + r) * ld_s + j0 - kKeys * r, static_cast<__mmask16>(stored << (kKeys * r)),
                              sums);
    }
  }
}

// Permutes between O's natural order and the unpacks' order (see the top): a
// 32-dim slice of O is `low` (dims 0-3 of each 8) and `high` (dims 4-7).
struct PairOrder {
  __m512 low, high;
};
inline PairOrder to_pair_order(__m512 first16, __m512 second16) {
  const __m512i low_index = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i high_index = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  return {_mm512_permutex2var_ps(first16, low_index, second16), _mm512_permutex2var_ps(first16, high_index, second16)};
}
inline __m512 first16_of(__m512 low, __m512 high) {
  return _mm512_permutex2var_ps(low, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23), high);
}
inline __m512 second16_of(__m512 low, __m512 high) {
  return _mm512_permutex2var_ps(low, _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31),
                                high);
}

// P (nr, nk) as bf16 pairs: pairs[r * ld_pairs + i] holds keys 2i (low half)
// and 2i + 1 of row r, rounded to nearest even; an odd nk's last pair has 0
// for its missing key. p row r at p + r * ld_p, nk <= 32.
inline void pair_probabilities(const float* p, int64_t ld_p, int nr, int nk, uint32_t* pairs, int64_t ld_pairs) {
  const __mmask16 low_keys = nk >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << nk) - 1u);
  const __mmask16 high_keys = nk <= 16 ? __mmask16(0) : static_cast<__mmask16>((1u << (nk - 16)) - 1u);
  for (int r = 0; r < nr; ++r) {
    const __m512 first16 = _mm512_maskz_loadu_ps(low_keys, p + r * ld_p);
    const __m512 second16 = _mm512_maskz_loadu_ps(high_keys, p + r * ld_p + 16);
    // VCVTNE2PS2BF16 puts its second source in the low half: keys 0-31 in order, so 32-bit
    // word i holds keys 2i and 2i + 1.
    _mm512_storeu_si512(pairs + r * ld_pairs, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(second16, first16)));
  }
}

// o (nr, dv) = alpha[r] * o + P V for the chunk's keys: P as bf16 pairs
// (pair_probabilities), key j's bf16 V row at v_rows[j] (nk of them). O's
// rows in registers, 4 rows x 64 dims at a time, each pair of V rows
// interleaved once for the 4 rows.
inline void chunk_accumulate_bf16(const uint32_t* pairs, int64_t ld_pairs, const float* alpha, int nr, int nk,
                                  const uint16_t* const* v_rows, int64_t dv, float* o) {
  constexpr int kRows = 4, kSlices = 2;  // 32-dim slices: 2 x (low, high) x 4 rows = 16 accumulators
  for (int r0 = 0; r0 < nr; r0 += kRows) {
    const int rows = nr - r0 < kRows ? nr - r0 : kRows;
    for (int64_t c0 = 0; c0 < dv; c0 += 32 * kSlices) {
      __m512 low[kRows][kSlices], high[kRows][kSlices];
      __mmask16 masks[kSlices][2];
      __mmask32 pair_masks[kSlices];
#pragma GCC unroll 4
      for (int t = 0; t < kSlices; ++t) {
        const int64_t c = c0 + 32 * t;
        masks[t][0] = lanes_mask(dv - c);
        masks[t][1] = lanes_mask(dv - c - 16);
        pair_masks[t] = pairs_mask(dv - c);
      }
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) {
        const float* o_row = o + (r0 + (r < rows ? r : 0)) * dv;
        const __m512 scale = _mm512_set1_ps(r < rows ? alpha[r0 + r] : 0.0f);
#pragma GCC unroll 4
        for (int t = 0; t < kSlices; ++t) {
          const int64_t c = c0 + 32 * t;
          const __m512 first16 = _mm512_mul_ps(scale, _mm512_maskz_loadu_ps(masks[t][0], o_row + c));
          const __m512 second16 = _mm512_mul_ps(scale, _mm512_maskz_loadu_ps(masks[t][1], o_row + c + 16));
          const PairOrder slice = to_pair_order(first16, second16);
          low[r][t] = slice.low;
          high[r][t] = slice.high;
        }
      }
      for (int j = 0; j < nk; j += 2) {
        const bool pair = j + 1 < nk;
        __m512bh v_low[kSlices], v_high[kSlices];
#pragma GCC unroll 4
        for (int t = 0; t < kSlices; ++t) {
          const __m512i v0 = _mm512_maskz_loadu_epi16(pair_masks[t], v_rows[j] + c0 + 32 * t);
          // A lone last key pairs with zeros (its probability's partner is 0 too).
          const __m512i v1 =
              pair ? _mm512_maskz_loadu_epi16(pair_masks[t], v_rows[j + 1] + c0 + 32 * t) : _mm512_setzero_si512();
          v_low[t] = as_bf16(_mm512_unpacklo_epi16(v0, v1));
          v_high[t] = as_bf16(_mm512_unpackhi_epi16(v0, v1));
        }
        // All 4 rows, so that the accumulators stay in registers: past the last row the step
        // repeats it, and those rows are not stored.
#pragma GCC unroll 4
        for (int r = 0; r < kRows; ++r) {
          const int pair_row = r0 + (r < rows ? r : rows - 1);
          const __m512bh weights = as_bf16(_mm512_set1_epi32(static_cast<int>(pairs[pair_row * ld_pairs + j / 2])));
#pragma GCC unroll 4
          for (int t = 0; t < kSlices; ++t) {
            low[r][t] = _mm512_dpbf16_ps(low[r][t], weights, v_low[t]);
            high[r][t] = _mm512_dpbf16_ps(high[r][t], weights, v_high[t]);
          }
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) {  // constant indices keep the accumulators in registers
        if (r >= rows) break;
        float* o_row = o + (r0 + r) * dv;
#pragma GCC unroll 4
        for (int t = 0; t < kSlices; ++t) {
          const int64_t c = c0 + 32 * t;
          _mm512_mask_storeu_ps(o_row + c, masks[t][0], first16_of(low[r][t], high[r][t]));
          _mm512_mask_storeu_ps(o_row + c + 16, masks[t][1], second16_of(low[r][t], high[r][t]));
        }
      }
    }
  }
}

}  // namespace
}  // namespace cpu
}  // namespace flashattn
