// The end of a split-KV block: the online-softmax states that the warps (or
// lane groups) of one block kept for the same rows are merged exactly, and
// the result is written as the output (one split), as an fp32 partial for
// combine_kernel (several splits), or, where the splits form a thread-block
// cluster (sm_90), merged with the other splits' states in their shared memory.
#pragma once

#include "cuda/decode/cluster.cuh"
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

// The merge of row r over kStates states: M = max m, each state's weight e^(m - M), L = sum l e^(m - M).
template <int kStates, int kRows, int kHeadDim>
struct RowMerge {
  float max_m = -INFINITY, total_l = 0.0f, weight[kStates];
  bool any;  // some state saw a key (else O = 0)
  __device__ RowMerge(const BlockStates<kStates, kRows, kHeadDim>& states, int r) {
#pragma unroll
    for (int st = 0; st < kStates; ++st) max_m = fmaxf(max_m, states.m[st * kRows + r]);
    any = max_m != -INFINITY;
#pragma unroll
    for (int st = 0; st < kStates; ++st) weight[st] = any ? __expf(states.m[st * kRows + r] - max_m) : 0.0f;
    if (any)
#pragma unroll
      for (int st = 0; st < kStates; ++st) total_l += weight[st] * states.l[st * kRows + r];
  }
  // sum o e^(m - M) of column d (not yet divided by L).
  __device__ float o_sum(const BlockStates<kStates, kRows, kHeadDim>& states, int r, int d) const {
    float total_o = 0.0f;
    if (any)
#pragma unroll
      for (int st = 0; st < kStates; ++st) total_o += weight[st] * states.o[(st * kRows + r) * kHeadDim + d];
    return total_o;
  }
};

// Where packed row r0 + r (query (r0 + r) / G, head hkv G + (r0 + r) % G) goes: its first output
// element and its LSE, as offsets into p.o and p.lse.
struct OutputRow {
  int64_t o, lse;
  __device__ OutputRow(const KvCacheParams& p, int64_t b, int64_t hkv, int64_t r0, int r) {
    const uint32_t group = static_cast<uint32_t>(p.heads) / static_cast<uint32_t>(p.heads_kv);
    const uint32_t packed = static_cast<uint32_t>(r0 + r);
    const int64_t query = packed / group, head = hkv * group + packed % group;
    o = b * p.o_layout.batch + query * p.o_layout.row + head * p.o_layout.head;
    lse = b * p.lse_layout.batch + query * p.lse_layout.row + head * p.lse_layout.head;
  }
  // The LSE M + log L, +inf for a row that saw no key.
  __device__ void store_lse(const KvCacheParams& p, float max_m, float total_l) const {
    if (p.lse != nullptr) p.lse[lse] = total_l > 0.0f ? max_m + __logf(total_l) : INFINITY;
  }
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
  for (int r = warp; r < nrows; r += warps) {
    const RowMerge<kStates, kRows, kHeadDim> merge(states, r);
    const OutputRow out(p, b, hkv, r0, r);
#pragma unroll
    for (int c = 0; c < kColumnsPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d >= dv_count) break;
      const float value = merge.total_l > 0.0f ? merge.o_sum(states, r, d) / merge.total_l : 0.0f;
      if (splits == 1) {
        static_cast<Element*>(p.o)[out.o + d] = from_float<Element>(value);
      } else {
        o_partial[((int64_t(split) * gridDim.z + blockIdx.z) * rows_padded + r0 + r) * dv_count + d] = value;
      }
    }
    // LSE of the row (+inf in the output, -inf in a partial, for a row that saw no key).
    if (lane == 0) {
      if (splits == 1) {
        out.store_lse(p, merge.max_m, merge.total_l);
      } else {
        lse_partial[(int64_t(split) * gridDim.z + blockIdx.z) * rows_padded + r0 + r] =
            merge.total_l > 0.0f ? merge.max_m + __logf(merge.total_l) : -INFINITY;
      }
    }
  }
}

// The in-cluster merge (split_kv_mma_kernel with o_partial == nullptr and several splits): the
// grid's splits are one cluster per (row block, batch row x kv head), at most kMaxClusterSplits.
constexpr int kMaxClusterSplits = 16;

// Step 1: this block's warps' states merged into one state `block` (rows below nrows), kept in
// this block's shared memory unnormalized: m = M, l = L, o = sum o e^(m - M).
template <int kStates, int kRows, int kHeadDim>
__device__ void merge_warps(const KvCacheParams& p, const BlockStates<kStates, kRows, kHeadDim>& states,
                            const BlockStates<1, kRows, kHeadDim>& block, int nrows) {
  const int warps = static_cast<int>(blockDim.x / 32), warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int dv_count = static_cast<int>(p.head_dim_v);
  for (int r = warp; r < nrows; r += warps) {
    const RowMerge<kStates, kRows, kHeadDim> merge(states, r);
    for (int d = lane; d < dv_count; d += 32) block.o[r * kHeadDim + d] = merge.o_sum(states, r, d);
    if (lane == 0) {
      block.m[r] = merge.max_m;
      block.l[r] = merge.total_l;
    }
  }
}

// Step 2: after a cluster barrier, block `rank` of the cluster merges rows rank, rank + splits, ...
// over every block's state (read from their shared memory) and writes O and the LSE; a second
// barrier keeps every block's shared memory alive until all reads are done.
template <int kRows, int kHeadDim, typename Element>
__device__ void merge_cluster_and_store(const KvCacheParams& p, const BlockStates<1, kRows, kHeadDim>& block,
                                        int nrows, int64_t r0, int64_t b, int64_t hkv) {
  cluster_barrier();
  const int splits = static_cast<int>(gridDim.x), rank = static_cast<int>(cluster_block_rank());
  const int dv_count = static_cast<int>(p.head_dim_v);
  for (int r = rank; r < nrows; r += splits) {
    float m[kMaxClusterSplits], l[kMaxClusterSplits];
    float max_m = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      m[s] = s < splits ? *cluster_shared(block.m + r, s) : -INFINITY;
      l[s] = s < splits ? *cluster_shared(block.l + r, s) : 0.0f;
      max_m = fmaxf(max_m, m[s]);
    }
    const bool any = max_m != -INFINITY;
    float total_l = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      m[s] = any ? __expf(m[s] - max_m) : 0.0f;  // now the split's weight
      total_l += m[s] * l[s];
    }
    const OutputRow out(p, b, hkv, r0, r);
    for (int d = static_cast<int>(threadIdx.x); d < dv_count; d += static_cast<int>(blockDim.x)) {
      float total_o = 0.0f;
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s)
        if (s < splits) total_o += m[s] * *cluster_shared(block.o + r * kHeadDim + d, s);
      static_cast<Element*>(p.o)[out.o + d] = from_float<Element>(total_l > 0.0f ? total_o / total_l : 0.0f);
    }
    if (threadIdx.x == 0) out.store_lse(p, max_m, total_l);
  }
  cluster_barrier();
}

}  // namespace flashattn::cuda::decode
