#include "support/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "support/tensor.hpp"

namespace fatest {
namespace {

// T = double for the fp64 reference; T = float, rounding to the dtype after
// every tensor op, for the same-precision naive version.
template <typename T>
struct Numerics {
  fa_dtype dtype;
  bool round;
  T rd(T x) const { return round ? static_cast<T>(round_to_f(dtype, static_cast<float>(x))) : x; }
};

// One query row against every key of its sequence.
template <typename T>
struct Row {
  std::vector<T> t;  // tanh(u) of the softcap, per key
  std::vector<T> p;  // softmax probability (rounded), 0 where masked
  std::vector<T> z;  // dropout factor: 1/(1-p) kept, 0 dropped
  T lse = 0;
  bool empty = true;
};

// Per-sequence, per-head contiguous copies in T.
template <typename T>
std::vector<T> gather(const std::vector<double>& x, int64_t start, int64_t rows, int64_t heads, int64_t head,
                      int64_t dim) {
  std::vector<T> out(static_cast<size_t>(rows * dim));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < dim; ++d) out[r * dim + d] = static_cast<T>(x[((start + r) * heads + head) * dim + d]);
  return out;
}

template <typename T>
void score_row(const Geometry& g, const Semantics& s, const Numerics<T>& num, int64_t b, int64_t h, int64_t i,
               const T* qi, const std::vector<T>& kh, Row<T>& row) {
  const int64_t sk = g.seqlen_k[b];
  row.t.assign(sk, T(0));
  row.p.assign(sk, T(0));
  row.z.assign(sk, T(1));
  std::vector<T> x(sk, -std::numeric_limits<T>::infinity());
  const T scale = static_cast<T>(s.scale), cap = static_cast<T>(s.softcap);
  const int64_t shift = s.bottom_right ? g.seqlen_k[b] - g.seqlen_q[b] : 0;
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < sk; ++j) {
    if (!visible(g, s, b, i, j)) continue;
    T acc = 0;
    for (int64_t d = 0; d < g.D; ++d) acc += qi[d] * kh[j * g.D + d];
    T v = num.rd(num.rd(acc) * scale);
    if (cap > 0) {
      row.t[j] = num.rd(std::tanh(num.rd(v / cap)));
      v = num.rd(cap * row.t[j]);
    }
    // ALiBi bias added in fp32/fp64 (a torch bias tensor in fp32 promotes the scores).
    if (!s.slopes.empty()) v -= static_cast<T>(s.slopes[b * g.H + h]) * static_cast<T>(std::llabs(i + shift - j));
    x[j] = v;
    if (v > m) m = v;
  }
  row.empty = !(m > -std::numeric_limits<T>::infinity());
  if (row.empty) {
    row.lse = std::numeric_limits<T>::infinity();
    return;
  }
  T sum = 0;
  for (int64_t j = 0; j < sk; ++j) sum += std::exp(x[j] - m);
  row.lse = m + std::log(sum);
  const T keep_scale = static_cast<T>(1.0 / (1.0 - static_cast<double>(s.dropout_p)));
  for (int64_t j = 0; j < sk; ++j) {
    row.p[j] = num.rd(std::exp(x[j] - m) / sum);
    if (s.dropout_p > 0.0f)
      row.z[j] = fa_dropout_keep(s.seed, s.offset, b, h, g.H, i, j, s.dropout_p) ? keep_scale : T(0);
  }
}

template <typename T>
FwdOut forward_impl(const Geometry& g, const Semantics& s, const Numerics<T>& num, const std::vector<double>& q,
                    const std::vector<double>& k, const std::vector<double>& v) {
  FwdOut out;
  out.o.assign(static_cast<size_t>(g.total_q * g.H * g.Dv), 0.0);
  out.lse.assign(static_cast<size_t>(g.total_q * g.H), std::numeric_limits<double>::infinity());
  Row<T> row;
  for (int64_t b = 0; b < g.B; ++b) {
    const int64_t sq = g.seqlen_q[b], sk = g.seqlen_k[b];
    for (int64_t h = 0; h < g.H; ++h) {
      const int64_t hk = h / (g.H / g.Hkv);
      const std::vector<T> qh = gather<T>(q, g.start_q[b], sq, g.H, h, g.D);
      const std::vector<T> kh = gather<T>(k, g.start_k[b], sk, g.Hkv, hk, g.D);
      const std::vector<T> vh = gather<T>(v, g.start_k[b], sk, g.Hkv, hk, g.Dv);
      for (int64_t i = 0; i < sq; ++i) {
        score_row(g, s, num, b, h, i, &qh[i * g.D], kh, row);
        const int64_t r = g.start_q[b] + i;
        out.lse[r * g.H + h] = static_cast<double>(row.lse);
        if (row.empty) continue;
        std::vector<T> acc(g.Dv, T(0));
        for (int64_t j = 0; j < sk; ++j) {
          const T pd = num.rd(row.p[j] * row.z[j]);
          if (pd == T(0)) continue;
          for (int64_t d = 0; d < g.Dv; ++d) acc[d] += pd * vh[j * g.Dv + d];
        }
        for (int64_t d = 0; d < g.Dv; ++d) out.o[(r * g.H + h) * g.Dv + d] = static_cast<double>(num.rd(acc[d]));
      }
    }
  }
  return out;
}

template <typename T>
BwdOut backward_impl(const Geometry& g, const Semantics& s, const Numerics<T>& num, const std::vector<double>& q,
                     const std::vector<double>& k, const std::vector<double>& v, const std::vector<double>& dout) {
  BwdOut out;
  out.dq.assign(static_cast<size_t>(g.total_q * g.H * g.D), 0.0);
  std::vector<T> dk_sum(static_cast<size_t>(g.total_k * g.Hkv * g.D), T(0));
  std::vector<T> dv_sum(static_cast<size_t>(g.total_k * g.Hkv * g.Dv), T(0));
  const T scale = static_cast<T>(s.scale), cap = static_cast<T>(s.softcap);
  Row<T> row;
  for (int64_t b = 0; b < g.B; ++b) {
    const int64_t sq = g.seqlen_q[b], sk = g.seqlen_k[b];
    for (int64_t h = 0; h < g.H; ++h) {
      const int64_t hk = h / (g.H / g.Hkv);
      const std::vector<T> qh = gather<T>(q, g.start_q[b], sq, g.H, h, g.D);
      const std::vector<T> kh = gather<T>(k, g.start_k[b], sk, g.Hkv, hk, g.D);
      const std::vector<T> vh = gather<T>(v, g.start_k[b], sk, g.Hkv, hk, g.Dv);
      const std::vector<T> doh = gather<T>(dout, g.start_q[b], sq, g.H, h, g.Dv);
      std::vector<T> dk_h(static_cast<size_t>(sk * g.D), T(0)), dv_h(static_cast<size_t>(sk * g.Dv), T(0));
      std::vector<T> dacc(sk);
      for (int64_t i = 0; i < sq; ++i) {
        score_row(g, s, num, b, h, i, &qh[i * g.D], kh, row);
        if (row.empty) continue;  // no key seen: no gradient flows through this row
        const T* doi = &doh[i * g.Dv];
        std::vector<T> dp(sk, T(0));
        T p_dp = 0;
        for (int64_t j = 0; j < sk; ++j) {
          if (row.p[j] == T(0) && !visible(g, s, b, i, j)) continue;
          const T pd = num.rd(row.p[j] * row.z[j]);
          T acc = 0;
          for (int64_t d = 0; d < g.Dv; ++d) {
            acc += doi[d] * vh[j * g.Dv + d];
            dv_h[j * g.Dv + d] += pd * doi[d];
          }
          dp[j] = num.rd(num.rd(acc) * row.z[j]);
          p_dp += row.p[j] * dp[j];
        }
        for (int64_t j = 0; j < sk; ++j) {
          const double terms = std::max(std::fabs(row.p[j] * dp[j]), std::fabs(row.p[j] * p_dp));
          out.ds_terms_max = std::max(out.ds_terms_max, terms);
          T ds = num.rd(row.p[j] * (dp[j] - p_dp));
          if (cap > 0) {
            const T dt = num.rd(ds * cap);
            const T du = num.rd(dt * (T(1) - row.t[j] * row.t[j]));
            ds = num.rd(du / cap);
          }
          dacc[j] = num.rd(ds * scale);
        }
        std::vector<T> dqi(g.D, T(0));
        for (int64_t j = 0; j < sk; ++j) {
          if (dacc[j] == T(0)) continue;
          for (int64_t d = 0; d < g.D; ++d) {
            dqi[d] += dacc[j] * kh[j * g.D + d];
            dk_h[j * g.D + d] += dacc[j] * qh[i * g.D + d];
          }
        }
        const int64_t r = g.start_q[b] + i;
        for (int64_t d = 0; d < g.D; ++d) out.dq[(r * g.H + h) * g.D + d] = static_cast<double>(num.rd(dqi[d]));
      }
      // Each head's dK, dV is one matmul result (rounded); GQA sums them over the group.
      for (int64_t j = 0; j < sk; ++j) {
        const int64_t r = g.start_k[b] + j;
        for (int64_t d = 0; d < g.D; ++d) dk_sum[(r * g.Hkv + hk) * g.D + d] += num.rd(dk_h[j * g.D + d]);
        for (int64_t d = 0; d < g.Dv; ++d) dv_sum[(r * g.Hkv + hk) * g.Dv + d] += num.rd(dv_h[j * g.Dv + d]);
      }
    }
  }
  out.dk.resize(dk_sum.size());
  out.dv.resize(dv_sum.size());
  for (size_t e = 0; e < dk_sum.size(); ++e) out.dk[e] = static_cast<double>(num.rd(dk_sum[e]));
  for (size_t e = 0; e < dv_sum.size(); ++e) out.dv[e] = static_cast<double>(num.rd(dv_sum[e]));
  return out;
}

}  // namespace

bool visible(const Geometry& g, const Semantics& s, int64_t b, int64_t i, int64_t j) {
  const int64_t shift = s.bottom_right ? g.seqlen_k[b] - g.seqlen_q[b] : 0;
  const int64_t right = s.causal ? 0 : s.window_right;
  if (j < 0 || j >= g.seqlen_k[b]) return false;
  if (s.window_left >= 0 && j < i + shift - s.window_left) return false;
  if (right >= 0 && j > i + shift + right) return false;
  return true;
}

FwdOut attention_forward(const Geometry& g, const Semantics& s, const std::vector<double>& q,
                         const std::vector<double>& k, const std::vector<double>& v, fa_dtype dtype, bool fp64) {
  if (fp64) return forward_impl<double>(g, s, Numerics<double>{dtype, false}, q, k, v);
  return forward_impl<float>(g, s, Numerics<float>{dtype, dtype != FA_DTYPE_FP32}, q, k, v);
}

BwdOut attention_backward(const Geometry& g, const Semantics& s, const std::vector<double>& q,
                          const std::vector<double>& k, const std::vector<double>& v,
                          const std::vector<double>& dout, fa_dtype dtype, bool fp64) {
  if (fp64) return backward_impl<double>(g, s, Numerics<double>{dtype, false}, q, k, v, dout);
  return backward_impl<float>(g, s, Numerics<float>{dtype, dtype != FA_DTYPE_FP32}, q, k, v, dout);
}

double weighted_output(const Geometry& g, const Semantics& s, const std::vector<double>& q,
                       const std::vector<double>& k, const std::vector<double>& v, const std::vector<double>& w) {
  const FwdOut f = reference_forward(g, s, q, k, v);
  double total = 0.0;
  for (size_t e = 0; e < f.o.size(); ++e) total += f.o[e] * w[e];
  return total;
}

}  // namespace fatest
