// The two products of a KV-cache key chunk (kvcache_impl.hpp) in AVX-512
// intrinsics, for the AVX-512 build only (kvcache_avx512.cpp includes this
// under its target pragma). The portable loops leave them to the compiler,
// which reduced each (row, key) dot product through the stack and reloaded
// and stored O's row for every (key, row): at GQA-4 decode the chunk's
// arithmetic, not memory, set the speed (12 GB/s of K/V on two cores with
// the cache in L2). Here:
//   scores  two rows and 8 keys at a time: one accumulator per (row, key)
//           over the head dim, then the 16 accumulators reduced together into
//           the 16 scores (45 shuffles and adds instead of 16 separate
//           reductions)
//   P V     O's rows in registers, 4 rows x 64 columns at a time, each V
//           vector loaded once per key for the 4 rows
// The sums run in another order than the portable loops', so the bits differ
// between the builds (each is within the tests' bound of the fp64 reference).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/avx512_lanes.hpp"

namespace flashattn {
namespace cpu {
namespace {

// v[i] = the sum of the 16 lanes of a[i], i < 16.
inline __m512 sum_lanes_of_16(__m512 a[16]) {
  // Within each 128-bit block: b[i] holds, for a[2i] and a[2i + 1], sums of
  // lane pairs (0 + 2, 1 + 3), ordered (a[2i], a[2i + 1], a[2i], a[2i + 1]).
  __m512 b[8];
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  // c[i]: each 128-bit block holds the block's sums of a[4i .. 4i + 3], in order.
  __m512 c[4];
  for (int i = 0; i < 4; ++i) {
    const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
    const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
    c[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
  }
  // Across the four 128-bit blocks: pairs of blocks, then the pairs' sums.
  constexpr int kEven = 0x88, kOdd = 0xDD;  // blocks (0, 2, 0, 2) and (1, 3, 1, 3) of the two sources
  const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], kEven), _mm512_shuffle_f32x4(c[0], c[1], kOdd));
  const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], kEven), _mm512_shuffle_f32x4(c[2], c[3], kOdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, kEven), _mm512_shuffle_f32x4(d0, d1, kOdd));
}

// s (nr, nk), row r at s + r * ld_s, = q (nr, d) k^T with k (nk, d) rows:
// two rows and 8 keys at a time, 16 accumulators over the head dim (each K
// vector loaded once for both rows), reduced together into the 16 scores.
inline void chunk_scores(const float* q, int nr, int64_t d, const float* k, int nk, float* s, int64_t ld_s) {
  for (int r = 0; r < nr; r += 2) {
    const bool pair = r + 1 < nr;
    const float* q_rows[2] = {q + r * d, q + (pair ? r + 1 : r) * d};
    for (int j0 = 0; j0 < nk; j0 += 8) {
      const int keys = nk - j0 < 8 ? nk - j0 : 8;
      // Always 8 keys, so that the accumulators stay in registers: past the
      // chunk's last key they repeat it, and those lanes are not stored.
      const float* rows[8];
      for (int j = 0; j < 8; ++j) rows[j] = k + (j0 + (j < keys ? j : keys - 1)) * d;
      __m512 acc[16];
      for (__m512& a : acc) a = _mm512_setzero_ps();
      for (int64_t c = 0; c < d; c += 16) {
        const __mmask16 mask = lanes_mask(d - c);
        const __m512 q0 = _mm512_maskz_loadu_ps(mask, q_rows[0] + c);
        const __m512 q1 = _mm512_maskz_loadu_ps(mask, q_rows[1] + c);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          const __m512 kv = _mm512_maskz_loadu_ps(mask, rows[j] + c);
          acc[j] = _mm512_fmadd_ps(q0, kv, acc[j]);
          acc[8 + j] = _mm512_fmadd_ps(q1, kv, acc[8 + j]);
        }
      }
      const __m512 sums = sum_lanes_of_16(acc);  // lanes 0-7: row r, 8-15: row r + 1
      const __mmask16 stored = static_cast<__mmask16>((1u << keys) - 1u);
      _mm512_mask_storeu_ps(s + r * ld_s + j0, stored, sums);
      if (pair) _mm512_mask_storeu_ps(s + (r + 1) * ld_s + j0 - 8, static_cast<__mmask16>(stored << 8), sums);
    }
  }
}

// o (nr, dv) += p (nr, nk) v with p row r at p + r * ld_p and v (nk, dv) rows.
inline void chunk_accumulate(const float* p, int64_t ld_p, int nr, int nk, const float* v, int64_t dv, float* o) {
  constexpr int kRows = 4, kVectors = 4;  // 16 accumulators
  for (int r0 = 0; r0 < nr; r0 += kRows) {
    const int rows = nr - r0 < kRows ? nr - r0 : kRows;
    for (int64_t c0 = 0; c0 < dv; c0 += 16 * kVectors) {
      __mmask16 masks[kVectors];
      for (int t = 0; t < kVectors; ++t) masks[t] = lanes_mask(dv - c0 - 16 * t);
      __m512 acc[kRows][kVectors];
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
        for (int t = 0; t < kVectors; ++t)
          acc[r][t] = r < rows ? _mm512_maskz_loadu_ps(masks[t], o + (r0 + r) * dv + c0 + 16 * t) : _mm512_setzero_ps();
      for (int j = 0; j < nk; ++j) {
        __m512 vv[kVectors];
#pragma GCC unroll 4
        for (int t = 0; t < kVectors; ++t) vv[t] = _mm512_maskz_loadu_ps(masks[t], v + j * dv + c0 + 16 * t);
        // All 4 rows (past the last one the step repeats it, and those rows are not stored), and
        // only constant indices into acc: with a run-time row count GCC kept acc in memory.
#pragma GCC unroll 4
        for (int r = 0; r < kRows; ++r) {
          const __m512 weight = _mm512_set1_ps(p[(r0 + (r < rows ? r : rows - 1)) * ld_p + j]);
#pragma GCC unroll 4
          for (int t = 0; t < kVectors; ++t) acc[r][t] = _mm512_fmadd_ps(weight, vv[t], acc[r][t]);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
#pragma GCC unroll 4
        for (int t = 0; t < kVectors; ++t) _mm512_mask_storeu_ps(o + (r0 + r) * dv + c0 + 16 * t, masks[t], acc[r][t]);
      }
    }
  }
}

}  // namespace
}  // namespace cpu
}  // namespace flashattn
