// The end of a split-KV block: the online-softmax states that the warps (or
// lane groups) of one block kept for the same rows are merged exactly, and
// the result is written as the output (one split) or as an fp32 partial for
// combine_kernel (several splits).
#pragma once

#include "cuda/decode/kvcache_kernel.cuh"

namespace flashattn::cuda::decode {

// States in shared memory, fp32, m in natural-log units:
//   o (kStates, kRows, kHeadDim)   sum_j exp(s_j - m) v_j
//   m (kStates, kRows)             running maximum (-inf: no key seen)
//   l (kStates, kRows)             sum_j exp(s_j - m)
// Merge: M = max m, L = sum l e^(m - M), O = sum o e^(m - M) / L.
template <int kStates, int kRows, int kHeadDim>
struct BlockStates {
  float* o;
  float* m;
  float* l;
  __device__ explicit BlockStates(float* smem)
      : o(smem), m(smem + kStates * kRows * kHeadDim), l(smem + kStates * kRows * (kHeadDim + 1)) {}
  static constexpr size_t bytes() { return size_t(kStates) * kRows * (kHeadDim + 2) * sizeof(float); }
};

// Writes rows r0 .. r0 + nrows - 1 of (batch row b, kv head hkv), split `split` of `splits`.
// Needs a __syncthreads() between the state writes and this call.
template <int kStates, int kRows, int kHeadDim, typename Element>
__device__ void merge_and_store(const KvCacheParams& p, const BlockStates<kStates, kRows, kHeadDim>& states,
                                int nrows, int64_t r0, int64_t b, int64_t hkv, float* o_partial, float* lse_partial,
                                int rows_padded) {
  const int split = blockIdx.x, splits = gridDim.x;
  const int dv_count = static_cast<int>(p.head_dim_v);
  const int64_t heads_per_kv = p.heads / p.heads_kv;
  for (int e = threadIdx.x; e < nrows * dv_count; e += blockDim.x) {
    const int r = e / dv_count, d = e % dv_count;
    float max_m = -INFINITY;
    for (int st = 0; st < kStates; ++st) max_m = fmaxf(max_m, states.m[st * kRows + r]);
    float total_l = 0.0f, total_o = 0.0f;
    if (max_m != -INFINITY) {
      for (int st = 0; st < kStates; ++st) {
        const float weight = __expf(states.m[st * kRows + r] - max_m);
        total_l += weight * states.l[st * kRows + r];
        total_o += weight * states.o[(st * kRows + r) * kHeadDim + d];
      }
    }
    const float value = total_l > 0.0f ? total_o / total_l : 0.0f;
    if (splits == 1) {
      const int64_t i = (r0 + r) / heads_per_kv, h = hkv * heads_per_kv + (r0 + r) % heads_per_kv;
      static_cast<Element*>(p.o)[b * p.o_layout.batch + i * p.o_layout.row + h * p.o_layout.head + d] =
          from_float<Element>(value);
    } else {
      o_partial[((int64_t(split) * gridDim.z + blockIdx.z) * rows_padded + r0 + r) * dv_count + d] = value;
    }
  }
  // LSE of each row (+inf in the output, -inf in a partial, for a row that saw no key).
  for (int r = threadIdx.x; r < nrows; r += blockDim.x) {
    float max_m = -INFINITY, total_l = 0.0f;
    for (int st = 0; st < kStates; ++st) max_m = fmaxf(max_m, states.m[st * kRows + r]);
    if (max_m != -INFINITY)
      for (int st = 0; st < kStates; ++st) total_l += __expf(states.m[st * kRows + r] - max_m) * states.l[st * kRows + r];
    const bool seen = total_l > 0.0f;
    if (splits == 1) {
      if (p.lse != nullptr) {
        const int64_t i = (r0 + r) / heads_per_kv, h = hkv * heads_per_kv + (r0 + r) % heads_per_kv;
        p.lse[b * p.lse_layout.batch + i * p.lse_layout.row + h * p.lse_layout.head] =
            seen ? max_m + __logf(total_l) : INFINITY;
      }
    } else {
      lse_partial[(int64_t(split) * gridDim.z + blockIdx.z) * rows_padded + r0 + r] =
          seen ? max_m + __logf(total_l) : -INFINITY;
    }
  }
}

}  // namespace flashattn::cuda::decode
