// Naive attention for the tests (never part of the library): the full score
// row of every query is formed, softmaxed and multiplied out, forward and
// backward. Two flavours share one implementation:
//   * the fp64 reference (all math in double), the ground truth;
//   * the same-precision naive version: fp32 math, and for fp16/bf16 every
//     tensor-op result (Q K^T, the scale, tanh, softmax, dropout, P V and the
//     backward products) rounded to the dtype, the way a plain torch
//     implementation in that dtype would. Its error against the fp64 reference
//     sets the tolerance of the library under test.
// Tensors are logical, row-major: q (Tq,H,D), k (Tk,Hkv,D), v (Tk,Hkv,Dv),
// o/dout (Tq,H,Dv), lse (Tq,H); dense batches are rows b*S .. b*S+S-1.
#pragma once

#include <cstdint>
#include <vector>

#include "flashattn/flashattn.h"

namespace fatest {

struct Geometry {
  int64_t B = 0, H = 0, Hkv = 0, D = 0, Dv = 0;
  std::vector<int64_t> seqlen_q, seqlen_k, start_q, start_k;  // per sequence
  int64_t total_q = 0, total_k = 0;
};

struct Semantics {
  double scale = 1.0;  // resolved (never 0)
  double softcap = 0.0;
  bool causal = false;
  bool bottom_right = true;
  int64_t window_left = -1, window_right = -1;
  std::vector<double> slopes;  // B*H ALiBi slopes, empty when off
  float dropout_p = 0.0f;
  uint64_t seed = 0, offset = 0;
};

// Row i of sequence b sees key j (the header's formula, written independently of src/).
bool visible(const Geometry& g, const Semantics& s, int64_t b, int64_t i, int64_t j);

struct FwdOut {
  std::vector<double> o, lse;  // lse: +inf for rows that see no key
};
struct BwdOut {
  std::vector<double> dq, dk, dv;
  // Largest |P_ij dP_ij| and |P_ij D_i|: the terms that dS = P (dP - D) cancels. Where they cancel
  // exactly (a row that sees one key: dS = 0), an implementation's fp32 rounding of them remains.
  double ds_terms_max = 0;
};

// dtype FA_DTYPE_FP32 selects fp64 math when `fp64` is set, else the same-precision version.
FwdOut attention_forward(const Geometry& g, const Semantics& s, const std::vector<double>& q,
                         const std::vector<double>& k, const std::vector<double>& v, fa_dtype dtype, bool fp64);
BwdOut attention_backward(const Geometry& g, const Semantics& s, const std::vector<double>& q,
                          const std::vector<double>& k, const std::vector<double>& v,
                          const std::vector<double>& dout, fa_dtype dtype, bool fp64);

inline FwdOut reference_forward(const Geometry& g, const Semantics& s, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v) {
  return attention_forward(g, s, q, k, v, FA_DTYPE_FP32, true);
}
inline BwdOut reference_backward(const Geometry& g, const Semantics& s, const std::vector<double>& q,
                                 const std::vector<double>& k, const std::vector<double>& v,
                                 const std::vector<double>& dout) {
  return attention_backward(g, s, q, k, v, dout, FA_DTYPE_FP32, true);
}

// Sum over all elements of O * W (the scalar whose gradient the backward computes when dout = W).
double weighted_output(const Geometry& g, const Semantics& s, const std::vector<double>& q,
                       const std::vector<double>& k, const std::vector<double>& v, const std::vector<double>& w);

}  // namespace fatest
