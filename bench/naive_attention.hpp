// Materialized attention (the N×N score matrix in memory), fp32, for the
// side-by-side benchmark. Dense layout only, no masks but causal top-left
// = bottom-right for Sq = Sk. Parallel over (batch, head) with OpenMP.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace bench {

struct NaiveShape {
  int64_t batch, heads, seqlen, head_dim;
  bool causal;
  size_t score_elements() const { return static_cast<size_t>(batch * heads * seqlen * seqlen); }
};

// q, k, v, o, dout, dq, dk, dv: (B, N, H, D) fp32. probs: (B, H, N, N), kept for the backward.
inline void naive_forward(const NaiveShape& s, const float* q, const float* k, const float* v, float* o,
                          std::vector<float>& probs, int threads) {
  const int64_t n = s.seqlen, d = s.head_dim, h_count = s.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  probs.assign(s.score_elements(), 0.0f);
#pragma omp parallel for num_threads(threads) collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < h_count; ++h) {
      float* p = probs.data() + (b * h_count + h) * n * n;
      const int64_t row_stride = h_count * d;
      const float* qb = q + (b * n * h_count + h) * d;
      const float* kb = k + (b * n * h_count + h) * d;
      const float* vb = v + (b * n * h_count + h) * d;
      float* ob = o + (b * n * h_count + h) * d;
      for (int64_t i = 0; i < n; ++i) {
        float* row = p + i * n;
        const int64_t visible = s.causal ? i + 1 : n;
        float row_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          float dot = 0.0f;
          for (int64_t t = 0; t < d; ++t) dot += qb[i * row_stride + t] * kb[j * row_stride + t];
          row[j] = dot * scale;
          row_max = std::max(row_max, row[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < visible; ++j) {
          row[j] = std::exp(row[j] - row_max);
          sum += row[j];
        }
        for (int64_t j = 0; j < visible; ++j) row[j] /= sum;
        float* out = ob + i * row_stride;
        for (int64_t t = 0; t < d; ++t) out[t] = 0.0f;
        for (int64_t j = 0; j < visible; ++j)
          for (int64_t t = 0; t < d; ++t) out[t] += row[j] * vb[j * row_stride + t];
      }
    }
  }
}

// Needs probs from naive_forward; dp_scratch is a second N×N buffer per (b, h).
inline void naive_backward(const NaiveShape& s, const float* q, const float* k, const float* v, const float* o,
                           const float* dout, const std::vector<float>& probs, std::vector<float>& dscores, float* dq,
                           float* dk, float* dv, int threads) {
  const int64_t n = s.seqlen, d = s.head_dim, h_count = s.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  dscores.assign(s.score_elements(), 0.0f);
#pragma omp parallel for num_threads(threads) collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < h_count; ++h) {
      const float* p = probs.data() + (b * h_count + h) * n * n;
      float* ds = dscores.data() + (b * h_count + h) * n * n;
      const int64_t row_stride = h_count * d;
      const int64_t base = (b * n * h_count + h) * d;
      for (int64_t i = 0; i < n; ++i) {
        float delta = 0.0f;
        for (int64_t t = 0; t < d; ++t) delta += dout[base + i * row_stride + t] * o[base + i * row_stride + t];
        for (int64_t j = 0; j < n; ++j) {
          float dp = 0.0f;
          for (int64_t t = 0; t < d; ++t) dp += dout[base + i * row_stride + t] * v[base + j * row_stride + t];
          ds[i * n + j] = p[i * n + j] * (dp - delta);
        }
      }
      for (int64_t i = 0; i < n; ++i)
        for (int64_t t = 0; t < d; ++t) dq[base + i * row_stride + t] = 0.0f;
      for (int64_t j = 0; j < n; ++j)
        for (int64_t t = 0; t < d; ++t) dk[base + j * row_stride + t] = dv[base + j * row_stride + t] = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const float dsij = ds[i * n + j] * scale, pij = p[i * n + j];
          for (int64_t t = 0; t < d; ++t) {
            dq[base + i * row_stride + t] += dsij * k[base + j * row_stride + t];
            dk[base + j * row_stride + t] += dsij * q[base + i * row_stride + t];
            dv[base + j * row_stride + t] += pij * dout[base + i * row_stride + t];
          }
        }
      }
    }
  }
}

}  // namespace bench
