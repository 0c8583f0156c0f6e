// The AVX-512 kernel set (see kernels.hpp for the contract). Included only
// by translation units that compile it under an AVX-512 target pragma
// (isa_avx512.cpp, isa_amx.cpp); the anonymous namespace keeps each copy
// private to its unit.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "cpu/avx512_lanes.hpp"
#include "cpu/exp2_poly.hpp"
#include "cpu/scratch.hpp"
#include "cpu/staged_operands.hpp"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace cpu {
namespace {

// A (kRows x 32) block of C in 2 * kRows zmm accumulators: per step of the
// k loop, two vectors of B are loaded and each A element is broadcast once
// and feeds two FMAs. kGemmRows = 12 keeps 24 accumulators + 2 B registers
// of the 32 zmm, and 14 loads per 24 FMAs (12 cycles on two FMA ports).
constexpr int kGemmRows = 12;
template <int kRows>
void gemm_block(int k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c,
                int64_t ldc, __mmask16 mask0, __mmask16 mask1, bool accumulate) {
  // Every loop over r is unrolled so the accumulators stay in registers.
  __m512 acc0[kRows], acc1[kRows];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    acc0[r] = _mm512_setzero_ps();
    acc1[r] = _mm512_setzero_ps();
  }
  for (int l = 0; l < k; ++l) {
    const float* b_row = b + l * ldb;
    const __m512 b0 = _mm512_maskz_loadu_ps(mask0, b_row);
    const __m512 b1 = _mm512_maskz_loadu_ps(mask1, b_row + 16);
    const float* a_col_l = a + l * a_col;
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const __m512 a_rl = _mm512_set1_ps(a_col_l[r * a_row]);
      acc0[r] = _mm512_fmadd_ps(a_rl, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(a_rl, b1, acc1[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    float* c_row = c + r * ldc;
    if (accumulate) {
      acc0[r] = _mm512_add_ps(acc0[r], _mm512_maskz_loadu_ps(mask0, c_row));
      acc1[r] = _mm512_add_ps(acc1[r], _mm512_maskz_loadu_ps(mask1, c_row + 16));
    }
    _mm512_mask_storeu_ps(c_row, mask0, acc0[r]);
    _mm512_mask_storeu_ps(c_row + 16, mask1, acc1[r]);
  }
}

// 2^x with the polynomials of exp2_poly.hpp. Results below 2^-125
// (masked scores: x = -inf) are 0: x is clamped at -125 so that vscalefps
// never underflows, and those lanes are zeroed. An underflowing vscalefps
// takes a microcode assist (~150 cycles) without FTZ, and masked tiles are
// full of them: causal bf16 forward was 2-3x slower per FLOP than full.
// NaN stays NaN (vmaxps returns its second operand, x, for a NaN).
template <int kDegree>
__m512 exp2_ps(__m512 x) {
  static_assert(kDegree == 6 || kDegree == 4, "exp2_ps: degree 6 or 4");
  const __m512 lowest = _mm512_set1_ps(-125.0f);
  const __mmask16 kept = _mm512_cmp_ps_mask(x, lowest, _CMP_NLT_UQ);  // x >= -125 or NaN
  x = _mm512_max_ps(lowest, x);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  constexpr const auto& kCoefficients = Exp2Poly<kDegree>::kCoefficients;
  __m512 p = _mm512_set1_ps(kCoefficients[0]);
  for (int i = 1; i <= kDegree; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kCoefficients[i]));
  return _mm512_maskz_scalef_ps(kept, p, n);
}

// 2^x for an x that is never -inf (the raw scores of a tile without a mask),
// in 3 operations besides the polynomial (exp2_ps: 5): vreduceps gives
// f = x - floor(x) and vscalefps takes floor(x) from x itself. x is clamped
// at -125 so that vscalefps never underflows: an x below it gives
// 2^-125 p(f), not 0 (a relative change of the row sum below 2^-120). NaN
// stays NaN; +inf gives +inf.
template <int kDegree>
__m512 exp2_unmasked_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-125.0f), x);
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  constexpr const auto& kCoefficients = Exp2UnitPoly<kDegree>::kCoefficients;
  __m512 p = _mm512_set1_ps(kCoefficients[0]);
  for (int i = 1; i <= kDegree; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kCoefficients[i]));
  return _mm512_scalef_ps(p, x);
}

__m512 bf16_to_ps(__m256i bits) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)); }

// Round to nearest even on the bit pattern, NaN kept quiet: the vector form
// of float_to_bf16 in common/half.hpp.
__m256i ps_to_bf16(__m512 x) {
  const __m512i word = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(word, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(word, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(word, 16), _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(word, _mm512_set1_epi32(0x7FFFFFFF)),
                                                   _mm512_set1_epi32(0x7F800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet));
}

// In-register transpose of a 16 x 16 block of 32-bit words.
void transpose16x16(__m512i rows[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(rows[i], rows[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(rows[i], rows[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    rows[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    rows[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    rows[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    rows[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(rows[i], rows[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(rows[i], rows[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_i32x4(rows[i + 8], rows[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(rows[i + 8], rows[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    rows[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    rows[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
    rows[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    rows[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

// The last m % kGemmRows rows: one instantiation per count.
template <int kRows>
void gemm_rest(int rows, int k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c,
               int64_t ldc, __mmask16 mask0, __mmask16 mask1, bool accumulate) {
  if constexpr (kRows > 0) {
    if (rows == kRows) {
      gemm_block<kRows>(k, a, a_row, a_col, b, ldb, c, ldc, mask0, mask1, accumulate);
      return;
    }
    gemm_rest<kRows - 1>(rows, k, a, a_row, a_col, b, ldb, c, ldc, mask0, mask1, accumulate);
  }
}

template <int kExp2Degree>
struct Avx512KernelSet : StagedOperands {
  explicit Avx512KernelSet(void* /*scratch: unused*/) {}

  static void gemm(int m, int n, int k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
                   float* c, int64_t ldc, bool accumulate) {
    for (int j0 = 0; j0 < n; j0 += 32) {
      const __mmask16 mask0 = lanes_mask(n - j0);
      const __mmask16 mask1 = lanes_mask(n - j0 - 16);
      const float* b_cols = b + j0;
      int i0 = 0;
      for (; i0 + kGemmRows <= m; i0 += kGemmRows)
        gemm_block<kGemmRows>(k, a + i0 * a_row, a_row, a_col, b_cols, ldb, c + i0 * ldc + j0, ldc, mask0, mask1,
                              accumulate);
      if (i0 < m)
        gemm_rest<kGemmRows - 1>(m - i0, k, a + i0 * a_row, a_row, a_col, b_cols, ldb, c + i0 * ldc + j0, ldc, mask0,
                                 mask1, accumulate);
    }
  }

  static void gemm_exact_a(int m, int n, int k, float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
                           float* c, int64_t ldc) {
    gemm(m, n, k, a, a_row, a_col, b, ldb, c, ldc, true);
  }

  static void gemm_exact_b(int m, int n, int k, const float* a, int64_t a_row, int64_t a_col, float* b, int64_t ldb,
                           float* c, int64_t ldc) {
    gemm(m, n, k, a, a_row, a_col, b, ldb, c, ldc, true);
  }

  static void exp2_sub_vec(float* x, int n, float mul, const float* sub) { exp2_sub_vec_as<false>(x, n, mul, sub); }

  // The same where no x is -inf (exp2_unmasked_ps, one degree less on [0, 1)).
  static void exp2_sub_vec_unmasked(float* x, int n, float mul, const float* sub) {
    exp2_sub_vec_as<true>(x, n, mul, sub);
  }

  template <bool kFinite>
  static void exp2_sub_vec_as(float* x, int n, float mul, const float* sub) {
    const __m512 factor = _mm512_set1_ps(mul);
    for (int i = 0; i < n; i += 16) {
      const __mmask16 mask = lanes_mask(n - i);
      const __m512 v = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(mask, x + i), factor, _mm512_maskz_loadu_ps(mask, sub + i));
      _mm512_mask_storeu_ps(x + i, mask, kFinite ? exp2_unmasked_ps<kExp2Degree - 1>(v) : exp2_ps<kExp2Degree>(v));
    }
  }

  // Columns in panels of kPanelColumns: the panel's running values stay in
  // zmm registers down all rows, so each element of x is read once (was:
  // a load and store of the sum per row).
  static constexpr int kPanelVectors = 4;
  static constexpr int kPanelColumns = 16 * kPanelVectors;

  static void column_max(const float* x, int64_t ld, int rows, int n, float* out) {
    for (int i0 = 0; i0 < n; i0 += kPanelColumns) {
      __mmask16 mask[kPanelVectors];
      __m512 best[kPanelVectors];
      for (int v = 0; v < kPanelVectors; ++v) {
        mask[v] = lanes_mask(n - i0 - 16 * v);
        best[v] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      }
      for (int r = 0; r < rows; ++r) {
        const float* row = x + r * ld + i0;
        // vmaxps returns its second operand when either is NaN: a NaN
        // element leaves best as it was, like std::max(best, element).
        for (int v = 0; v < kPanelVectors; ++v)
          best[v] = _mm512_max_ps(_mm512_maskz_loadu_ps(mask[v], row + 16 * v), best[v]);
      }
      for (int v = 0; v < kPanelVectors; ++v) _mm512_mask_storeu_ps(out + i0 + 16 * v, mask[v], best[v]);
    }
  }

  // One element's probability, the sum of a panel's column and the
  // subtrahends, shared with the AMX kernel set's packing form. kFinite: no
  // score is -inf (exp2_unmasked_ps, one degree less on [0, 1)).
  template <bool kFinite>
  static __m512 probability(__m512 score, __m512 factor, __m512 subtrahend, __mmask16 mask) {
    const __m512 x = _mm512_fmsub_ps(score, factor, subtrahend);
    return _mm512_maskz_mov_ps(mask, kFinite ? exp2_unmasked_ps<kExp2Degree - 1>(x) : exp2_ps<kExp2Degree>(x));
  }

  static void exp2_tile_sum(float* x, int64_t ld, int rows, int n, float mul, const float* sub, float* sum,
                            int /*pin_slot*/, bool finite) {
    if (finite)
      exp2_tile_sum_as<true>(x, ld, rows, n, mul, sub, sum);
    else
      exp2_tile_sum_as<false>(x, ld, rows, n, mul, sub, sum);
  }

  template <bool kFinite>
  static void exp2_tile_sum_as(float* x, int64_t ld, int rows, int n, float mul, const float* sub, float* sum) {
    const __m512 factor = _mm512_set1_ps(mul);
    for (int i0 = 0; i0 < n; i0 += kPanelColumns) {
      __mmask16 mask[kPanelVectors];
      __m512 subtrahend[kPanelVectors], total[kPanelVectors];
      for (int v = 0; v < kPanelVectors; ++v) {
        mask[v] = lanes_mask(n - i0 - 16 * v);
        subtrahend[v] = _mm512_maskz_loadu_ps(mask[v], sub + i0 + 16 * v);
        total[v] = _mm512_setzero_ps();
      }
      for (int r = 0; r < rows; ++r) {
        float* row = x + r * ld + i0;
        for (int v = 0; v < kPanelVectors; ++v) {
          const __m512 p =
              probability<kFinite>(_mm512_maskz_loadu_ps(mask[v], row + 16 * v), factor, subtrahend[v], mask[v]);
          _mm512_mask_storeu_ps(row + 16 * v, mask[v], p);
          total[v] = _mm512_add_ps(total[v], p);
        }
      }
      for (int v = 0; v < kPanelVectors; ++v) {
        float* s = sum + i0 + 16 * v;
        _mm512_mask_storeu_ps(s, mask[v], _mm512_add_ps(_mm512_maskz_loadu_ps(mask[v], s), total[v]));
      }
    }
  }

  // out (cols, rows) = in (rows, cols) transposed, in 16 x 16 blocks.
  static void transpose(const float* in, int64_t ld_in, int rows, int cols, float* out, int64_t ld_out) {
    for (int i0 = 0; i0 < rows; i0 += 16) {
      const int block_rows = rows - i0 < 16 ? rows - i0 : 16;
      for (int j0 = 0; j0 < cols; j0 += 16) {
        const __mmask16 col_mask = lanes_mask(cols - j0);
        __m512i block[16];
        for (int i = 0; i < 16; ++i)
          block[i] = i < block_rows ? _mm512_castps_si512(_mm512_maskz_loadu_ps(col_mask, in + (i0 + i) * ld_in + j0))
                                    : _mm512_setzero_si512();
        transpose16x16(block);
        const __mmask16 row_mask = lanes_mask(block_rows);
        for (int j = 0; j < 16 && j0 + j < cols; ++j)
          _mm512_mask_storeu_ps(out + (j0 + j) * ld_out + i0, row_mask, _mm512_castsi512_ps(block[j]));
      }
    }
  }

  static void exp2_sub_scalar(float* x, int n, float mul, float sub) {
    const __m512 factor = _mm512_set1_ps(mul);
    const __m512 subtrahend = _mm512_set1_ps(sub);
    for (int i = 0; i < n; i += 16) {
      const __mmask16 mask = lanes_mask(n - i);
      const __m512 v = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(mask, x + i), factor, subtrahend);
      _mm512_mask_storeu_ps(x + i, mask, exp2_ps<kExp2Degree>(v));
    }
  }

  static void load_row(const void* src, fa_dtype dtype, float* dst, int n) {
    if (dtype == FA_DTYPE_FP32) {
      const float* s = static_cast<const float*>(src);
      for (int i = 0; i < n; i += 16) {
        const __mmask16 mask = lanes_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, mask, _mm512_maskz_loadu_ps(mask, s + i));
      }
      return;
    }
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int i = 0; i < n; i += 16) {
      const __mmask16 mask = lanes_mask(n - i);
      const __m256i bits = _mm256_maskz_loadu_epi16(mask, s + i);
      _mm512_mask_storeu_ps(dst + i, mask, dtype == FA_DTYPE_BF16 ? bf16_to_ps(bits) : _mm512_cvtph_ps(bits));
    }
  }

  static void store_row(const float* src, fa_dtype dtype, void* dst, int n) {
    if (dtype == FA_DTYPE_FP32) {
      float* d = static_cast<float*>(dst);
      for (int i = 0; i < n; i += 16) {
        const __mmask16 mask = lanes_mask(n - i);
        _mm512_mask_storeu_ps(d + i, mask, _mm512_maskz_loadu_ps(mask, src + i));
      }
      return;
    }
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int i = 0; i < n; i += 16) {
      const __mmask16 mask = lanes_mask(n - i);
      const __m512 v = _mm512_maskz_loadu_ps(mask, src + i);
      const __m256i bits =
          dtype == FA_DTYPE_BF16 ? ps_to_bf16(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_mask_storeu_epi16(d + i, mask, bits);
    }
  }
};

// fp32 accuracy: the kernel set of fp32 and fp16 tensors.
using Avx512Kernels = Avx512KernelSet<6>;

}  // namespace
}  // namespace cpu
}  // namespace flashattn
