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
// Needs a __syncthreads() between the state writes and this call. Row by row, each thread a
// column of it: the merge weights once per row, and the query and head of a packed row stepped
// on from the first row's (one 32-bit division in all: this runs on every call's critical path).
template <int kStates, int kRows, int kHeadDim, typename Element>
__device__ void merge_and_store(const KvCacheParams& p, const BlockStates<kStates, kRows, kHeadDim>& states,
                                int nrows, int64_t r0, int64_t b, int64_t hkv, float* o_partial, float* lse_partial,
                                int rows_padded) {
  static_assert(kRows <= 32, "thread r writes the LSE of row r");
  const int split = blockIdx.x, splits = gridDim.x;
  const int dv_count = static_cast<int>(p.head_dim_v);
  const uint32_t group = static_cast<uint32_t>(p.heads) / static_cast<uint32_t>(p.heads_kv);
  int64_t query = static_cast<uint32_t>(r0) / group;
  int64_t head = hkv * group + static_cast<uint32_t>(r0) % group;
  const int64_t last_head = hkv * group + group - 1;
  for (int r = 0; r < nrows; ++r) {
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
    for (int d = threadIdx.x; d < dv_count; d += blockDim.x) {
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
    if (threadIdx.x == static_cast<unsigned>(r)) {  // blocks have at least a warp, rows at most kRows
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
    const bool wraps = head == last_head;
    query += wraps ? 1 : 0;
    head = wraps ? hkv * group : head + 1;
  }
}

}  // namespace flashattn::cuda::decode
