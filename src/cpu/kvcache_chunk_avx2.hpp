// The two products of a KV-cache key chunk (kvcache_impl.hpp) in AVX2 + FMA
// intrinsics, for the AVX2 build only (kvcache_avx2.cpp includes this under
// its target pragma). The same plan as kvcache_chunk_avx512.hpp at 8 lanes:
// the portable loops reduced each (row, key) dot product on its own and
// loaded and stored O's row for every (key, row), 35 % and 22 % of the AVX2
// build's time at GQA-4 decode (perf, session 27). Here:
//   scores  two rows and 4 keys at a time: 8 accumulators over the head dim
//           (each K vector loaded once for both rows), reduced together into
//           the 8 scores by horizontal adds
//   P V     O's rows in registers, 4 rows x 16 columns at a time, each V
//           vector loaded once per key for the 4 rows
// Past the last row or key a step repeats it, and those lanes are not stored.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace flashattn {
namespace cpu {
namespace {

// Lanes [0, count) of 8 as a maskload / maskstore mask (none for count <= 0).
inline __m256i lanes8_mask(int64_t count) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int n = count >= 8 ? 8 : count > 0 ? static_cast<int>(count) : 0;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
}

// Lane i = the sum of the 8 lanes of a[i], i < 8.
inline __m256 sum_lanes_of_8(const __m256 a[8]) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  // Each 128-bit half of u0 holds that half's sums of a[0..3] in order, of u1 those of a[4..7].
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// s (nr, nk), row r at s + r * ld_s, = q (nr, d) k^T with k (nk, d) rows.
inline void chunk_scores(const float* q, int nr, int64_t d, const float* k, int nk, float* s, int64_t ld_s) {
  constexpr int kKeys = 4;
  for (int r = 0; r < nr; r += 2) {
    const bool pair = r + 1 < nr;
    const float* q_rows[2] = {q + r * d, q + (pair ? r + 1 : r) * d};
    for (int j0 = 0; j0 < nk; j0 += kKeys) {
      const int keys = nk - j0 < kKeys ? nk - j0 : kKeys;
      const float* rows[kKeys];
#pragma GCC unroll 4
      for (int j = 0; j < kKeys; ++j) rows[j] = k + (j0 + (j < keys ? j : keys - 1)) * d;
      __m256 acc[8];  // acc[4 i + j]: row r + i, key j0 + j
#pragma GCC unroll 8
      for (__m256& a : acc) a = _mm256_setzero_ps();
      int64_t c = 0;
      for (; c + 8 <= d; c += 8) {
        const __m256 q0 = _mm256_loadu_ps(q_rows[0] + c), q1 = _mm256_loadu_ps(q_rows[1] + c);
#pragma GCC unroll 4
        for (int j = 0; j < kKeys; ++j) {
          const __m256 kv = _mm256_loadu_ps(rows[j] + c);
          acc[j] = _mm256_fmadd_ps(q0, kv, acc[j]);
          acc[kKeys + j] = _mm256_fmadd_ps(q1, kv, acc[kKeys + j]);
        }
      }
      if (c < d) {
        const __m256i mask = lanes8_mask(d - c);
        const __m256 q0 = _mm256_maskload_ps(q_rows[0] + c, mask), q1 = _mm256_maskload_ps(q_rows[1] + c, mask);
#pragma GCC unroll 4
        for (int j = 0; j < kKeys; ++j) {
          const __m256 kv = _mm256_maskload_ps(rows[j] + c, mask);
          acc[j] = _mm256_fmadd_ps(q0, kv, acc[j]);
          acc[kKeys + j] = _mm256_fmadd_ps(q1, kv, acc[kKeys + j]);
        }
      }
      const __m256 sums = sum_lanes_of_8(acc);  // lanes 0-3: row r, 4-7: row r + 1
      const __m128 low = _mm256_castps256_ps128(sums), high = _mm256_extractf128_ps(sums, 1);
      const __m128i stored = _mm256_castsi256_si128(lanes8_mask(keys));
      _mm_maskstore_ps(s + r * ld_s + j0, stored, low);
      if (pair) _mm_maskstore_ps(s + (r + 1) * ld_s + j0, stored, high);
    }
  }
}

// o (nr, dv) += p (nr, nk) v with p row r at p + r * ld_p and v (nk, dv) rows.
inline void chunk_accumulate(const float* p, int64_t ld_p, int nr, int nk, const float* v, int64_t dv, float* o) {
  constexpr int kRows = 4, kVectors = 2;  // 8 accumulators
  for (int r0 = 0; r0 < nr; r0 += kRows) {
    const int rows = nr - r0 < kRows ? nr - r0 : kRows;
    for (int64_t c0 = 0; c0 < dv; c0 += 8 * kVectors) {
      __m256i masks[kVectors];
#pragma GCC unroll 2
      for (int t = 0; t < kVectors; ++t) masks[t] = lanes8_mask(dv - c0 - 8 * t);
      __m256 acc[kRows][kVectors];
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 2
        for (int t = 0; t < kVectors; ++t)
          acc[r][t] = r < rows ? _mm256_maskload_ps(o + (r0 + r) * dv + c0 + 8 * t, masks[t]) : _mm256_setzero_ps();
      for (int j = 0; j < nk; ++j) {
        __m256 vv[kVectors];
#pragma GCC unroll 2
        for (int t = 0; t < kVectors; ++t) vv[t] = _mm256_maskload_ps(v + j * dv + c0 + 8 * t, masks[t]);
        // All 4 rows (past the last one the step repeats it), so that acc has constant indices only.
#pragma GCC unroll 4
        for (int r = 0; r < kRows; ++r) {
          const __m256 weight = _mm256_set1_ps(p[(r0 + (r < rows ? r : rows - 1)) * ld_p + j]);
#pragma GCC unroll 2
          for (int t = 0; t < kVectors; ++t) acc[r][t] = _mm256_fmadd_ps(weight, vv[t], acc[r][t]);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
#pragma GCC unroll 2
        for (int t = 0; t < kVectors; ++t) _mm256_maskstore_ps(o + (r0 + r) * dv + c0 + 8 * t, masks[t], acc[r][t]);
      }
    }
  }
}

}  // namespace
}  // namespace cpu
}  // namespace flashattn
