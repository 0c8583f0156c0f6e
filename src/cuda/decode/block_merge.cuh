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
// Needs a __syncthreads() between the state writes and this call. Warp w merges rows w, w + warps,
// ..., lane c its columns c, c + 32, ...: a GQA-4 decode block has 4 real rows, and with the rows
// one after another (each thread a column) their dependent chains of shared loads, exponentials and
// sums came one after another on every call's critical path. The arithmetic of an element is the
// same in either order.
template <int kStates, int kRows, int kHeadDim, typename Element>
__device__ void merge_and_store(const KvCacheParams& p, const BlockStates<kStates, kRows, kHeadDim>& states,
                                int nrows, int64_t r0, int64_t b, int64_t hkv, float* o_partial, float* lse_partial,
                                int rows_padded) {
  constexpr int kColumnsPerLane = (kHeadDim + 31) / 32;
  const int split = blockIdx.x, splits = gridDim.x;
  const int warps = static_cast<int>(blockDim.x / 32), warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int dv_count = static_cast<int>(p.head_dim_v);
  const uint32_t group = static_cast<uint32_t>(p.heads) / static_cast<uint32_t>(p.heads_kv);
  for (int r = warp; r < nrows; r += warps) {
    const uint32_t packed = static_cast<uint32_t>(r0 + r);
    const int64_t query = packed / group, head = hkv * group + packed % group;
    float max_m = -INFINITY;
#pragma unroll
    for (int st = 0; st < kStates; ++st) max_m = fmaxf(max_m, states.m[st * kRows + r]);
    const bool any = max_m != -INFINITY;  // else no state saw a key: O = 0
    float weight[kStates], total_l = 0.0f;
#pragma unroll
    for (int st = 0; st < kStates; ++st) weight[st] = any ? __expf(states.m[st * kRows + r] - max_m) : 0.0f;
    if (any)
#pragma unroll
      for (int st = 0; st < kStates; ++st) total_l += weight[st] * states.l[st * kRows + r];
#pragma unroll
    for (int c = 0; c < kColumnsPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d >= dv_count) break;
      float total_o = 0.0f;
      if (any)
#pragma unroll
        for (int st = 0; st < kStates; ++st) total_o += weight[st] * states.o[(st * kRows + r) * kHeadDim + d];
      const float value = total_l > 0.0f ? total_o / total_l : 0.0f;
      if (splits == 1) {
        static_cast<Element*>(p.o)[b * p.o_layout.batch + query * p.o_layout.row + head * p.o_layout.head + d] =
            from_float<Element>(value);
      } else {
        o_partial[((int64_t(split) * gridDim.z + blockIdx.z) * rows_padded + r0 + r) * dv_count + d] = value;
      }
    }
    // LSE of the row (+inf in the output, -inf in a partial, for a row that saw no key).
    if (lane == 0) {
      const bool seen = total_l > 0.0f;
      if (splits == 1) {
        if (p.lse != nullptr)
          p.lse[b * p.lse_layout.batch + query * p.lse_layout.row + head * p.lse_layout.head] =
              seen ? max_m + __logf(total_l) : INFINITY;
      } else {
        lse_partial[(int64_t(split) * gridDim.z + blockIdx.z) * rows_padded + r0 + r] =
            seen ? max_m + __logf(total_l) : -INFINITY;
      }
    }
  }
}

}  // namespace flashattn::cuda::decode
