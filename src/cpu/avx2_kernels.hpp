// The AVX2 + FMA + F16C kernel set (see kernels.hpp for the contract), for
// CPUs without AVX-512 (AMD Zen 2/3, Intel before Skylake-SP). Included only
// by isa_avx2.cpp, which compiles it under its target pragma; the anonymous
// namespace keeps it private to that unit. Every dtype is computed in fp32:
// load_row widens bf16 (a shift) and fp16 (F16C), store_row rounds to
// nearest even.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/half.hpp"
#include "cpu/exp2_poly.hpp"
#include "cpu/scratch.hpp"
#include "cpu/staged_operands.hpp"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace cpu {
namespace {

// C (m, n) is computed in (kAvx2GemmRows x 16) blocks of 2 * kAvx2GemmRows
// ymm accumulators: per step of the k loop two vectors of B are loaded and
// each A element is broadcast once and feeds two FMAs. Six rows keep 12
// accumulators + 2 B registers + 1 broadcast of the 16 ymm, and 8 loads per
// 12 FMAs (6 cycles on two FMA pipes, loads at 2 per cycle leave slack).
constexpr int kAvx2GemmRows = 6;
constexpr int kAvx2GemmCols = 16;
// The largest k of any gemm of the passes (head dim, kBlockM, kBlockN).
constexpr int kAvx2MaxGemmDepth = kMaxGemmDim > kMaxGemmRows ? kMaxGemmDim : kMaxGemmRows;

// Lanes [0, count) of a ymm set, for masked loads and stores at the edges.
__m256i avx2_lanes_mask(int count) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), lane);
}

// B's columns [0, cols) of k rows (stride ldb) copied into a contiguous
// (k, 16) panel, zero past cols. Unpacked, the panel's rows lie ldb floats
// apart, and the B operands of the passes have ldb = kBlockM = 256 or
// kBlockN = 128 (1 KiB or 512 B): their rows fall into 4 or 8 of the 64 sets
// of a 32 KiB 8-way L1, 32 or 64 lines for a panel of up to 256 rows that
// every 6-row block of C reads again. Packed, it is k * 64 contiguous bytes.
void pack_b_panel(int k, const float* b, int64_t ldb, int cols, float* panel) {
  if (cols >= kAvx2GemmCols) {
    for (int l = 0; l < k; ++l) {
      const float* row = b + l * ldb;
      _mm256_store_ps(panel + l * kAvx2GemmCols, _mm256_loadu_ps(row));
      _mm256_store_ps(panel + l * kAvx2GemmCols + 8, _mm256_loadu_ps(row + 8));
    }
    return;
  }
  const __m256i mask0 = avx2_lanes_mask(cols);
  const __m256i mask1 = avx2_lanes_mask(cols - 8);
  for (int l = 0; l < k; ++l) {
    const float* row = b + l * ldb;
    _mm256_store_ps(panel + l * kAvx2GemmCols, _mm256_maskload_ps(row, mask0));
    _mm256_store_ps(panel + l * kAvx2GemmCols + 8, _mm256_maskload_ps(row + 8, mask1));
  }
}

// One (kRows x 16) block of C from a packed B panel; cols < 16 at the right
// edge. A element (r, l) at a[r * a_row + l * a_col], as in gemm.
template <int kRows>
void avx2_gemm_block(int k, const float* a, int64_t a_row, int64_t a_col, const float* panel, float* c, int64_t ldc,
                     int cols, bool accumulate) {
  // Every loop over r is unrolled so the accumulators stay in registers.
  __m256 acc0[kRows], acc1[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    acc0[r] = _mm256_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
  }
  for (int l = 0; l < k; ++l) {
    const __m256 b0 = _mm256_load_ps(panel + l * kAvx2GemmCols);
    const __m256 b1 = _mm256_load_ps(panel + l * kAvx2GemmCols + 8);
    const float* a_col_l = a + l * a_col;
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m256 a_rl = _mm256_broadcast_ss(a_col_l + r * a_row);
      acc0[r] = _mm256_fmadd_ps(a_rl, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(a_rl, b1, acc1[r]);
    }
  }
  if (cols >= kAvx2GemmCols) {
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      float* c_row = c + r * ldc;
      if (accumulate) {
        acc0[r] = _mm256_add_ps(acc0[r], _mm256_loadu_ps(c_row));
        acc1[r] = _mm256_add_ps(acc1[r], _mm256_loadu_ps(c_row + 8));
      }
      _mm256_storeu_ps(c_row, acc0[r]);
      _mm256_storeu_ps(c_row + 8, acc1[r]);
    }
    return;
  }
  const __m256i mask0 = avx2_lanes_mask(cols);
  const __m256i mask1 = avx2_lanes_mask(cols - 8);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    float* c_row = c + r * ldc;
    if (accumulate) {
      acc0[r] = _mm256_add_ps(acc0[r], _mm256_maskload_ps(c_row, mask0));
      acc1[r] = _mm256_add_ps(acc1[r], _mm256_maskload_ps(c_row + 8, mask1));
    }
    _mm256_maskstore_ps(c_row, mask0, acc0[r]);
    _mm256_maskstore_ps(c_row + 8, mask1, acc1[r]);
  }
}

// The last m % kAvx2GemmRows rows: one instantiation per count.
template <int kRows>
void avx2_gemm_rest(int rows, int k, const float* a, int64_t a_row, int64_t a_col, const float* panel, float* c,
                    int64_t ldc, int cols, bool accumulate) {
  if constexpr (kRows > 0) {
    if (rows == kRows) {
      avx2_gemm_block<kRows>(k, a, a_row, a_col, panel, c, ldc, cols, accumulate);
      return;
    }
    avx2_gemm_rest<kRows - 1>(rows, k, a, a_row, a_col, panel, c, ldc, cols, accumulate);
  }
}

// 2^x with the polynomials of exp2_poly.hpp. 2^n is built in the
// exponent field, so x is clamped to [-125, 128]: results below 2^-125
// (masked scores, x = -inf) are zeroed instead of computed, which also keeps
// the multiply away from denormals; x >= 128 gives +inf. NaN stays NaN: max
// and min return their second operand, x, for a NaN, and n's integer form
// then scales by 1.
template <int kDegree>
__m256 avx2_exp2_ps(__m256 x) {
  static_assert(kDegree == 6 || kDegree == 4, "avx2_exp2_ps: degree 6 or 4");
  const __m256 lowest = _mm256_set1_ps(-125.0f);
  const __m256 kept = _mm256_cmp_ps(x, lowest, _CMP_NLT_UQ);  // x >= -125 or NaN
  x = _mm256_min_ps(_mm256_set1_ps(128.0f), _mm256_max_ps(lowest, x));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  constexpr const auto& kCoefficients = Exp2Poly<kDegree>::kCoefficients;
  __m256 p = _mm256_set1_ps(kCoefficients[0]);
  for (int i = 1; i <= kDegree; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kCoefficients[i]));
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23));
  return _mm256_and_ps(kept, _mm256_mul_ps(p, scale));
}

__m256 avx2_bf16_to_ps(__m128i bits) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// Round to nearest even on the bit pattern, NaN kept quiet: the vector form
// of float_to_bf16 in common/half.hpp.
__m128i avx2_ps_to_bf16(__m256 x) {
  const __m256i word = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(word, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(word, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(word, 16), _mm256_set1_epi32(0x40));
  // Magnitudes above the infinity pattern are NaNs; both sides are below
  // 2^31, so the signed compare is exact.
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(word, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  const __m256i bits = _mm256_blendv_epi8(rounded, quiet, is_nan);  // each lane in [0, 0xFFFF]
  return _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
}

template <int kExp2Degree>
struct Avx2KernelSet : StagedOperands {
  explicit Avx2KernelSet(void* /*scratch: unused*/) {}

  // Per 16-column panel of B: pack it (16 KiB at most, on the stack), then
  // run down all rows of A with it, so the panel stays in L1 while A streams
  // from L2.
  static void gemm(int m, int n, int k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
                   float* c, int64_t ldc, bool accumulate) {
    alignas(32) float panel[kAvx2MaxGemmDepth * kAvx2GemmCols];
    for (int j0 = 0; j0 < n; j0 += kAvx2GemmCols) {
      const int cols = n - j0;
      pack_b_panel(k, b + j0, ldb, cols, panel);
      int i0 = 0;
      for (; i0 + kAvx2GemmRows <= m; i0 += kAvx2GemmRows)
        avx2_gemm_block<kAvx2GemmRows>(k, a + i0 * a_row, a_row, a_col, panel, c + i0 * ldc + j0, ldc, cols,
                                       accumulate);
      if (i0 < m)
        avx2_gemm_rest<kAvx2GemmRows - 1>(m - i0, k, a + i0 * a_row, a_row, a_col, panel, c + i0 * ldc + j0, ldc,
                                          cols, accumulate);
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

  static void exp2_sub_vec_unmasked(float* x, int n, float mul, const float* sub) { exp2_sub_vec(x, n, mul, sub); }

  static void exp2_sub_vec(float* x, int n, float mul, const float* sub) {
    const __m256 factor = _mm256_set1_ps(mul);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_fmsub_ps(_mm256_loadu_ps(x + i), factor, _mm256_loadu_ps(sub + i));
      _mm256_storeu_ps(x + i, avx2_exp2_ps<kExp2Degree>(v));
    }
    if (i < n) {
      const __m256i mask = avx2_lanes_mask(n - i);
      const __m256 v = _mm256_fmsub_ps(_mm256_maskload_ps(x + i, mask), factor, _mm256_maskload_ps(sub + i, mask));
      _mm256_maskstore_ps(x + i, mask, avx2_exp2_ps<kExp2Degree>(v));
    }
  }

  static void exp2_row_sum(float* x, int n, float mul, const float* sub, float* sum) {
    const __m256 factor = _mm256_set1_ps(mul);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_fmsub_ps(_mm256_loadu_ps(x + i), factor, _mm256_loadu_ps(sub + i));
      const __m256 e = avx2_exp2_ps<kExp2Degree>(v);
      _mm256_storeu_ps(x + i, e);
      _mm256_storeu_ps(sum + i, _mm256_add_ps(_mm256_loadu_ps(sum + i), e));
    }
    if (i < n) {
      const __m256i mask = avx2_lanes_mask(n - i);
      const __m256 v = _mm256_fmsub_ps(_mm256_maskload_ps(x + i, mask), factor, _mm256_maskload_ps(sub + i, mask));
      const __m256 e = avx2_exp2_ps<kExp2Degree>(v);
      _mm256_maskstore_ps(x + i, mask, e);
      _mm256_maskstore_ps(sum + i, mask, _mm256_add_ps(_mm256_maskload_ps(sum + i, mask), e));
    }
  }

  static void exp2_tile_sum(float* x, int64_t ld, int rows, int n, float mul, const float* sub, float* sum,
                            int /*pin_slot*/, bool /*finite*/) {
    for (int r = 0; r < rows; ++r) exp2_row_sum(x + r * ld, n, mul, sub, sum);
  }

  static void column_max(const float* x, int64_t ld, int rows, int n, float* out) {
    for (int i = 0; i < n; ++i) out[i] = -std::numeric_limits<float>::infinity();
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < n; ++i) out[i] = std::max(out[i], x[r * ld + i]);
  }

  static void transpose(const float* in, int64_t ld_in, int rows, int cols, float* out, int64_t ld_out) {
    transpose_reference(in, ld_in, rows, cols, out, ld_out);
  }

  static void exp2_sub_scalar(float* x, int n, float mul, float sub) {
    const __m256 factor = _mm256_set1_ps(mul);
    const __m256 subtrahend = _mm256_set1_ps(sub);
    int i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(x + i, avx2_exp2_ps<kExp2Degree>(_mm256_fmsub_ps(_mm256_loadu_ps(x + i), factor, subtrahend)));
    if (i < n) {
      const __m256i mask = avx2_lanes_mask(n - i);
      const __m256 v = _mm256_fmsub_ps(_mm256_maskload_ps(x + i, mask), factor, subtrahend);
      _mm256_maskstore_ps(x + i, mask, avx2_exp2_ps<kExp2Degree>(v));
    }
  }

  // Vectors of 8, then the scalar conversions of common/half.hpp for the
  // tail (no masked 16-bit loads in AVX2).
  static void load_row(const void* src, fa_dtype dtype, float* dst, int n) {
    int i = 0;
    if (dtype == FA_DTYPE_FP32) {
      const float* s = static_cast<const float*>(src);
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(s + i));
      for (; i < n; ++i) dst[i] = s[i];
      return;
    }
    const uint16_t* s = static_cast<const uint16_t*>(src);
    if (dtype == FA_DTYPE_BF16) {
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, avx2_bf16_to_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
      for (; i < n; ++i) dst[i] = bf16_to_float(s[i]);
      return;
    }
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
    for (; i < n; ++i) dst[i] = fp16_to_float(s[i]);
  }

  static void store_row(const float* src, fa_dtype dtype, void* dst, int n) {
    int i = 0;
    if (dtype == FA_DTYPE_FP32) {
      float* d = static_cast<float*>(dst);
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_loadu_ps(src + i));
      for (; i < n; ++i) d[i] = src[i];
      return;
    }
    uint16_t* d = static_cast<uint16_t*>(dst);
    if (dtype == FA_DTYPE_BF16) {
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), avx2_ps_to_bf16(_mm256_loadu_ps(src + i)));
      for (; i < n; ++i) d[i] = float_to_bf16(src[i]);
      return;
    }
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; ++i) d[i] = float_to_fp16(src[i]);
  }
};

// fp32 accuracy: the kernel set of fp32 and fp16 tensors.
using Avx2Kernels = Avx2KernelSet<6>;
// bf16 tensors: their outputs round to 2^-9, far above the degree-4
// polynomial's 2.9e-6 (the AMX bf16 set makes the same choice).
using Avx2Bf16Kernels = Avx2KernelSet<4>;

}  // namespace
}  // namespace cpu
}  // namespace flashattn
