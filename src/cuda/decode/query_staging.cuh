// Q of the mma decode kernel (split_kv_mma.cuh): its rows' loads at the kernel's entry, held in
// registers, and their staging as fp32 (rotated where rotary applies) in shared memory, from which
// turn 0 builds the A fragments.
#pragma once

#include "cuda/decode/kvcache_kernel.cuh"

namespace flashattn::cuda::decode {

// The packed Q rows a thread stages: dim tid % kHeadDim of rows tid / kHeadDim + k * kRowStep, with
// the element offset of each row stepped along (one division at the start, none per row).
template <typename Traits, typename Element>
struct QueryRowWalk {
  static constexpr int kHeadDim = Traits::kHeadDim, kRowStep = Traits::kThreads / kHeadDim;
  static constexpr int kRowsPerThread = Traits::kRows / kRowStep;
  static_assert(Traits::kThreads % kHeadDim == 0 && Traits::kRows % kRowStep == 0, "whole rows per pass");

  int d, r_first, head, heads_per_kv;
  int64_t query, offset, wrap_step, head_step;
  const Element* q_group;  // (b, first head of the group), dim d
  bool present;            // d < head_dim

  // Packed row r is query (r0 + r) / G, head hkv G + (r0 + r) % G: one (32-bit) division, then
  // steps that move the element offset by a head, or to the next query's first head of the group.
  __device__ __forceinline__ QueryRowWalk(const KvCacheParams& p, int64_t b, int64_t hkv, int64_t r0) {
    d = threadIdx.x % kHeadDim;
    r_first = threadIdx.x / kHeadDim;
    const uint32_t group = static_cast<uint32_t>(p.heads) / static_cast<uint32_t>(p.heads_kv);
    heads_per_kv = static_cast<int>(group);
    query = static_cast<uint32_t>(r0 + r_first) / group;
    head = static_cast<int>(static_cast<uint32_t>(r0 + r_first) % group);
    q_group = static_cast<const Element*>(p.q) + b * p.q_layout.batch + hkv * heads_per_kv * p.q_layout.head + d;
    offset = query * p.q_layout.row + head * p.q_layout.head;
    head_step = p.q_layout.head;
    wrap_step = p.q_layout.row - (heads_per_kv - 1) * p.q_layout.head;
    present = d < p.head_dim;
  }
  __device__ __forceinline__ bool real(int k, int nrows) const { return r_first + k * kRowStep < nrows; }
  __device__ __forceinline__ int stage_index(int k) const { return (r_first + k * kRowStep) * kHeadDim + d; }
  __device__ __forceinline__ void next_row() {  // kRowStep packed rows on, without a branch
#pragma unroll
    for (int step = 0; step < kRowStep; ++step) {
      const bool wraps = head + 1 == heads_per_kv;
      head = wraps ? 0 : head + 1;
      query += wraps ? 1 : 0;
      offset += wraps ? wrap_step : head_step;
    }
  }
};

// A thread's Q elements as loaded (zero past D and for padding rows), held in registers from the
// kernel's entry until turn 0 stores them: the loads go out before the first K/V copies, so they do
// not queue behind the first wave of slabs (ncu source pages, dev/kvcache_decode.md session 22:
// 28-37 % of the stall samples at B = 1 4k were on Q's first use when it was loaded after the copies),
// and nothing uses them before the copies are out.
template <typename Traits, typename Element>
struct QueryElements {
  Element values[QueryRowWalk<Traits, Element>::kRowsPerThread] = {};
};

// Issues the loads of Q's plain path (no rotary: the rotary path loads in stage_queries). The row
// steps stop at the last real row (a warp's rows are uniform): a GQA-4 decode block has 4 real rows
// of 16, and the stepping chain over all of them was ~300 dependent instructions of every call's
// fixed cost (dev/kvcache_decode.md v14).
template <typename Traits, typename Element>
__device__ __forceinline__ QueryElements<Traits, Element> load_queries(const KvCacheParams& p,
                                                                      QueryRowWalk<Traits, Element> walk, int nrows) {
  QueryElements<Traits, Element> loaded;
  if (p.rotary_cos != nullptr) return loaded;
#pragma unroll
  for (int k = 0; k < QueryRowWalk<Traits, Element>::kRowsPerThread; ++k) {
    if (!walk.real(k, nrows)) break;
    if (walk.present) loaded.values[k] = walk.q_group[walk.offset];
    walk.next_row();
  }
  return loaded;
}

// Q rows r0 .. r0 + nrows - 1 of (batch row b, kv head hkv), rotated and rounded to the element
// type (as the cache holds k), zero past D and for padding rows, into q_stage (kRows, kHeadDim)
// fp32: the plain path stores `loaded`; the rotary path loads, rotates and stores. The loads of a
// thread are independent and go out together (one thread gathering its fragments element by
// element took ~25 us per block); the plain path is short and branch-free because every block runs
// it once, cold: the first version unrolled the rotary code and a 64-bit division per element, and
// the first K/V copy came 57 KiB of instructions into the kernel (29 KiB after that fix).
template <typename Traits, typename Element>
__device__ __forceinline__ void stage_queries(const KvCacheParams& p, const CacheRow& row, int64_t b, int64_t hkv,
                                              int64_t r0, int nrows, const QueryElements<Traits, Element>& loaded,
                                              float* q_stage) {
  constexpr int kRowsPerThread = QueryRowWalk<Traits, Element>::kRowsPerThread;
  if (p.rotary_cos == nullptr) {
    const QueryRowWalk<Traits, Element> walk(p, b, hkv, r0);
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) q_stage[walk.stage_index(k)] = to_float(loaded.values[k]);
    return;
  }
  QueryRowWalk<Traits, Element> walk(p, b, hkv, r0);
#pragma unroll 4
  for (int k = 0; k < kRowsPerThread; ++k) {
    const bool real = walk.present && walk.real(k, nrows);
    q_stage[walk.stage_index(k)] =
        real ? rotated_element(p, walk.q_group + walk.offset - walk.d, walk.d, query_rotary_position(p, row, walk.query))
             : 0.0f;
    walk.next_row();
  }
}

}  // namespace flashattn::cuda::decode
