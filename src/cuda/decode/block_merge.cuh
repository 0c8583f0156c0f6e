// The end of a split-KV block: the online-softmax states that the warps (or
// lane groups) of one block kept for the same rows are merged exactly, and
// the result is written as the output (one split) or as an fp32 partial
// (several splits); then the last split block of those rows to finish merges
// every split's partial into the output (merge_splits_if_last).
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

// The combine of a split call, fused into its last block ("last block done"): every split block
// of (batch row b, kv head hkv, row block) calls this after writing its partials; the last to
// arrive merges all of them exactly, lse = log sum_s e^(lse_s), O = sum_s e^(lse_s - lse) O_s,
// and writes out (and lse). It replaces a second kernel whose launch and chain of dependent loads
// cost ~10 us at B = 1, 4k keys (ncu, dev/kvcache_decode.md).
// Ordering: each thread fences its own partial stores before the block's arrival is counted
// (release); the last block fences after seeing the count (acquire) and reads the partials with
// ld.global.cg, from L2: an L1 line of this SM may hold a stale copy of a neighbouring group's
// LSEs, read by an earlier merge on the same SM (two row blocks' LSEs share a 128-byte line).
// The arrival counter is reset by the last block, so it is zero again when the kernel ends; the
// launcher still zeroes the counters before every launch (a caller's workspace holds anything).
// `scratch`: kMaxSplits * kRows floats of shared memory no longer in use. Needs no barrier before.
template <int kRows, typename Element>
__device__ void merge_splits_if_last(const KvCacheParams& p, const SplitPartials& partials, int nrows, int64_t r0,
                                     int64_t b, int64_t hkv, float* scratch) {
  __shared__ unsigned int arrived_before;
  const int splits = gridDim.x;
  unsigned int* arrivals = partials.arrivals + blockIdx.z * gridDim.y + blockIdx.y;
  __threadfence();
  __syncthreads();  // also: every thread is done reading what scratch overlays
  if (threadIdx.x == 0) {
    arrived_before = atomicAdd(arrivals, 1u);
    __threadfence();
  }
  __syncthreads();
  if (arrived_before != static_cast<unsigned int>(splits - 1)) return;

  const int64_t split_stride = int64_t(gridDim.z) * partials.rows_padded;  // rows from one split to the next
  const int64_t first_row = int64_t(blockIdx.z) * partials.rows_padded + r0;  // of split 0
  // weight (splits, kRows): first every split's LSE, loaded independently by all threads.
  float* weight = scratch;
  for (int e = threadIdx.x; e < splits * nrows; e += blockDim.x) {
    const int s = e / nrows, r = e % nrows;
    weight[s * kRows + r] = __ldcg(partials.lse + s * split_stride + first_row + r);
  }
  __syncthreads();
  // Then, one warp per row, the row's LSE (+inf when no split saw a key) and e^(lse_s - lse) in place.
  const int64_t heads_per_kv = p.heads / p.heads_kv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < nrows; r += blockDim.x / 32) {
    float lse_max = -INFINITY;
    for (int s = lane; s < splits; s += 32) lse_max = fmaxf(lse_max, weight[s * kRows + r]);
    lse_max = warp_max(lse_max);
    float lse = INFINITY;
    if (lse_max != -INFINITY) {
      float total = 0.0f;
      for (int s = lane; s < splits; s += 32) total += __expf(weight[s * kRows + r] - lse_max);
      lse = lse_max + __logf(warp_sum(total));
    }
    for (int s = lane; s < splits; s += 32)
      weight[s * kRows + r] = lse == INFINITY ? 0.0f : __expf(weight[s * kRows + r] - lse);
    if (lane == 0 && p.lse != nullptr) {
      const int64_t i = (r0 + r) / heads_per_kv, h = hkv * heads_per_kv + (r0 + r) % heads_per_kv;
      p.lse[b * p.lse_layout.batch + i * p.lse_layout.row + h * p.lse_layout.head] = lse;
    }
  }
  __syncthreads();
  // O, four dims per item: the splits' loads do not depend on each other, 8 in flight per thread.
  const int dv = static_cast<int>(p.head_dim_v);  // a multiple of 8: partial rows are float4-aligned
  const int quads = dv / 4;
  for (int e = threadIdx.x; e < nrows * quads; e += blockDim.x) {
    const int r = e / quads, d = 4 * (e % quads);
    const float* partial = partials.o + (first_row + r) * dv + d;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int s = 0; s < splits; ++s) {
      // A split that saw no key has weight 0 and a zero partial: no 0 * inf.
      const float w = weight[s * kRows + r];
      const float4 value = __ldcg(reinterpret_cast<const float4*>(partial + s * split_stride * dv));
      acc.x += w * value.x;
      acc.y += w * value.y;
      acc.z += w * value.z;
      acc.w += w * value.w;
    }
    const int64_t i = (r0 + r) / heads_per_kv, h = hkv * heads_per_kv + (r0 + r) % heads_per_kv;
    Element* o = static_cast<Element*>(p.o) + b * p.o_layout.batch + i * p.o_layout.row + h * p.o_layout.head + d;
    o[0] = from_float<Element>(acc.x);
    o[1] = from_float<Element>(acc.y);
    o[2] = from_float<Element>(acc.z);
    o[3] = from_float<Element>(acc.w);
  }
  if (threadIdx.x == 0) *arrivals = 0;  // no other block of this launch touches it again
}

// Writes rows r0 .. r0 + nrows - 1 of (batch row b, kv head hkv), split `split` of `splits`;
// with splits > 1, the last split block to finish then writes the output. Needs a __syncthreads()
// between the state writes and this call; the states' memory is the merge's scratch afterwards.
template <int kStates, int kRows, int kHeadDim, typename Element>
__device__ void merge_and_store(const KvCacheParams& p, const BlockStates<kStates, kRows, kHeadDim>& states,
                                int nrows, int64_t r0, int64_t b, int64_t hkv, const SplitPartials& partials) {
  static_assert(BlockStates<kStates, kRows, kHeadDim>::bytes() >= sizeof(float) * kMaxSplits * kRows,
                "the states' memory holds the split merge's weights");
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
      partials.o[((int64_t(split) * gridDim.z + blockIdx.z) * partials.rows_padded + r0 + r) * dv_count + d] = value;
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
      partials.lse[(int64_t(split) * gridDim.z + blockIdx.z) * partials.rows_padded + r0 + r] =
          seen ? max_m + __logf(total_l) : -INFINITY;
    }
  }
  if (splits > 1) merge_splits_if_last<kRows, Element>(p, partials, nrows, r0, b, hkv, states.o);
}

}  // namespace flashattn::cuda::decode
