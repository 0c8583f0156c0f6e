// The portable kernel set: plain loops in the order the compiler vectorizes
// (contiguous innermost), for any CPU.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/half.hpp"
#include "cpu/bwd_impl.hpp"
#include "cpu/fwd_impl.hpp"
#include "cpu/kernels.hpp"
#include "cpu/staged_operands.hpp"

namespace flashattn {
namespace cpu {
namespace {

struct GenericKernels : StagedOperands {
  explicit GenericKernels(void* /*scratch: unused*/) {}

  static void gemm(int m, int n, int k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
                   float* c, int64_t ldc, bool accumulate) {
    for (int i = 0; i < m; ++i) {
      float* c_row = c + i * ldc;
      if (!accumulate)
        for (int j = 0; j < n; ++j) c_row[j] = 0.0f;
      for (int l = 0; l < k; ++l) {
        const float a_il = a[i * a_row + l * a_col];
        const float* b_row = b + l * ldb;
        for (int j = 0; j < n; ++j) c_row[j] += a_il * b_row[j];
      }
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
    for (int i = 0; i < n; ++i) x[i] = std::exp2(x[i] * mul - sub[i]);
  }

  static void column_max(const float* x, int64_t ld, int rows, int n, float* out) {
    for (int i = 0; i < n; ++i) out[i] = kNegInf;
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < n; ++i) out[i] = std::max(out[i], x[r * ld + i]);
  }

  static void exp2_tile_sum(float* x, int64_t ld, int rows, int n, float mul, const float* sub, float* sum,
                            int /*pin_slot*/, bool /*finite*/) {
    for (int r = 0; r < rows; ++r) {
      float* row = x + r * ld;
      for (int i = 0; i < n; ++i) {
        row[i] = std::exp2(row[i] * mul - sub[i]);
        sum[i] += row[i];
      }
    }
  }

  static void transpose(const float* in, int64_t ld_in, int rows, int cols, float* out, int64_t ld_out) {
    transpose_reference(in, ld_in, rows, cols, out, ld_out);
  }

  static void exp2_sub_scalar(float* x, int n, float mul, float sub) {
    for (int i = 0; i < n; ++i) x[i] = std::exp2(x[i] * mul - sub);
  }

  static void load_row(const void* src, fa_dtype dtype, float* dst, int n) {
    if (dtype == FA_DTYPE_FP32) {
      const float* s = static_cast<const float*>(src);
      for (int i = 0; i < n; ++i) dst[i] = s[i];
    } else if (dtype == FA_DTYPE_BF16) {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
    } else {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = fp16_to_float(s[i]);
    }
  }

  static void store_row(const float* src, fa_dtype dtype, void* dst, int n) {
    if (dtype == FA_DTYPE_FP32) {
      float* d = static_cast<float*>(dst);
      for (int i = 0; i < n; ++i) d[i] = src[i];
    } else if (dtype == FA_DTYPE_BF16) {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
    } else {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = float_to_fp16(src[i]);
    }
  }
};

}  // namespace

IsaBackend generic_backend() {
  return IsaBackend{"generic", &run_fwd<GenericKernels>, &run_bwd<GenericKernels>};
}

}  // namespace cpu
}  // namespace flashattn
