// The sm90 backward's producer side and a CTA's start: the kernel's argument
// block, the barriers in shared memory, what a CTA works on, the TMA loads of
// the producer thread, the deterministic mode's releaser warps, and
// start_bwd_cta, which hands the producer warpgroup's registers to the
// consumers (bwd_kernel.cuh and bwd_kernel_wide.cuh run them).
#pragma once

#include <cuda.h>  // CUtensorMap (types only)

#include <cuda/ptx>

#include "cuda/sm80/bwd_kernel.cuh"  // BwdPass, semaphores, store_release
#include "cuda/sm90/bwd_items.hpp"
#include "cuda/sm90/fwd_kernel.cuh"  // wait_barrier, tma_load, named_barrier_sync

namespace flashattn::sm90 {

// Tensor maps first (64-byte aligned): Q and dO with boxes of (64, kBlockM),
// K and V (64, kBlockN); varlen maps have batch extent 1.
struct BwdKernelArgs {
  CUtensorMap tma_q, tma_do, tma_k, tma_v;
  BwdParams params;
  sm80::BwdPass pass;
};

struct BwdBarriers {
  uint64_t kv_full;
  uint64_t q_full[2], q_empty[2];
};

// The deterministic order's key tiles per dQ copy (BwdItems). The host groups
// key tiles only under a mask, so the dense kernels know at compile time that
// there are no groups and keep the code (and the 24-register roles' spills) of
// the order without them.
template <class Traits>
__device__ __forceinline__ int key_group_tiles(const sm80::BwdPass& pass) {
  return Traits::kMaskDiagonal ? pass.key_group_tiles : 0;
}

// The key tile and K/V head (in the pass) of this CTA; deterministic mode
// launches them in its own order (deterministic_launch_slot). Without key-tile
// groups that order needs no division: the indices stay plain block indices,
// which the 24-register producer and releaser read again instead of keeping
// them live.
template <class Traits, bool kDeterministic>
__device__ __forceinline__ BwdLaunchSlot bwd_launch_slot(const sm80::BwdPass& pass) {
  if (!kDeterministic) return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y)};
  const int group_tiles = key_group_tiles<Traits>(pass);
  if (group_tiles == 0) return {static_cast<int>(gridDim.x - 1 - blockIdx.x), static_cast<int>(blockIdx.y)};
  return deterministic_launch_slot(blockIdx.x + gridDim.x * blockIdx.y, gridDim.x, gridDim.y, group_tiles);
}

__device__ __forceinline__ void expect_bytes(uint64_t* barrier, uint32_t bytes) {
  ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta, ::cuda::ptx::space_shared,
                                         barrier, bytes);
}

// What a CTA (key tile n_block of K/V head h_kv, sequence b) works on.
template <class Traits>
struct BwdTileWork {
  SequenceBounds seq;
  MaskPolicy mask;
  BwdItems<Traits::kBlockM, Traits::kBlockN> items;
  int h_kv, h_first;

  __device__ __forceinline__ static BwdTileWork make(const BwdParams& params, const sm80::BwdPass& pass, int b,
                                                     int n_block, int kv_head_in_pass) {
    BwdTileWork work;
    work.seq = sequence_bounds(params, b);
    const int group = static_cast<int>(params.heads / params.heads_kv);
    work.h_kv = pass.head_begin / group + kv_head_in_pass;
    work.h_first = work.h_kv * group;
    work.mask = MaskPolicy::make(work.seq.len_q, work.seq.len_k, params.align_bottom_right, params.window_left,
                                 params.window_right);
    const int group_tiles = key_group_tiles<Traits>(pass);
    work.items = BwdItems<Traits::kBlockM, Traits::kBlockN>::make(work.mask, n_block, work.h_first + group,
                                                                  pass.dq_copies == 2 && group_tiles == 0, group_tiles);
    return work;
  }
};

// Thread 0 of the producer warpgroup: the TMA loads. It derives its work
// from the arguments after giving its registers away, so nothing of the
// kernel's prologue stays live on its 24 registers.
template <class Traits, bool kAscending>
__device__ __forceinline__ void produce_bwd(const BwdKernelArgs& args, uint8_t* smem) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  const BwdParams& params = args.params;
  const int b = blockIdx.z;
  const BwdLaunchSlot slot = bwd_launch_slot<Traits, kAscending>(args.pass);
  const int n_block = slot.n_block;
  const auto work = BwdTileWork<Traits>::make(params, args.pass, b, n_block, slot.kv_head);
  const SequenceBounds& seq = work.seq;
  int h = work.h_first, m_block = work.items.template m_start<kAscending>();
  if (!work.items.template next<kAscending, !Traits::kMaskDiagonal>(h, m_block)) return;  // no item: the consumers wait for nothing either
  BwdBarriers* bars = reinterpret_cast<BwdBarriers*>(smem + Traits::kOffsetBarriers);
  const int batch = params.is_varlen ? 0 : b;
  expect_bytes(&bars->kv_full, 2 * Traits::kKVBytes);
  const int k_row = static_cast<int>(seq.k_row0) + n_block * kBlockN;
#pragma unroll
  for (int cb = 0; cb < Traits::kColBlocks; ++cb) {
    tma_load(smem + Traits::kOffsetK + cb * kBlockN * 128, &args.tma_k, cb * 64, k_row, work.h_kv, batch,
             &bars->kv_full);
    tma_load(smem + Traits::kOffsetV + cb * kBlockN * 128, &args.tma_v, cb * 64, k_row, work.h_kv, batch,
             &bars->kv_full);
  }
  int it = 0;
  do {
    const int stage = it & 1;
    if (it >= 2) wait_barrier(&bars->q_empty[stage], ((it >> 1) & 1) ^ 1);  // released by iteration it - 2
    expect_bytes(&bars->q_full[stage], 2 * Traits::kQBytes);
    const int row = static_cast<int>(seq.q_row0) + m_block * kBlockM;
    uint8_t* q_stage = smem + Traits::kOffsetQ + stage * Traits::kQBytes;
    uint8_t* do_stage = smem + Traits::kOffsetDo + stage * Traits::kQBytes;
#pragma unroll
    for (int cb = 0; cb < Traits::kColBlocks; ++cb) {
      tma_load(q_stage + cb * kBlockM * 128, &args.tma_q, cb * 64, row, h, batch, &bars->q_full[stage]);
      tma_load(do_stage + cb * kBlockM * 128, &args.tma_do, cb * 64, row, h, batch, &bars->q_full[stage]);
    }
    ++it;
  } while (work.items.template next<kAscending, !Traits::kMaskDiagonal>(h, m_block));
}

// Named barriers of the deterministic hand-off, per consumer warpgroup wg:
// the consumer's 128 threads arrive on kHandoffBarrier + wg after their dQ
// adds of an item (its releaser warp syncs), and sync on kTakenBarrier + wg
// before the next hand-off (the releaser arrives once it has passed the
// previous one), so a consumer is never two hand-offs ahead of its releaser.
constexpr int kHandoffBarrier = 7, kTakenBarrier = 9;

// Warp 1 + wg of the producer warpgroup in deterministic mode: releases the
// semaphore of each of consumer wg's items once the consumer's adds are behind
// the hand-off barrier, so that the release's fence stalls this warp instead of
// a consumer. It walks the items itself (the same BwdItems as the consumers):
// nothing passes through shared memory.
template <class Traits>
__device__ __forceinline__ void release_dq_turns(const BwdKernelArgs& args, int wg) {
  const sm80::BwdPass& pass = args.pass;
  const int b = blockIdx.z;
  const BwdLaunchSlot slot = bwd_launch_slot<Traits, true>(pass);
  const auto work = BwdTileWork<Traits>::make(args.params, pass, b, slot.n_block, slot.kv_head);
  int h = work.h_first, m_block = work.items.template m_start<true>();
  bool more = work.items.template next<true, !Traits::kMaskDiagonal>(h, m_block);
  while (more) {
    int* semaphore =
        sm80::dq_tile_semaphores(pass, b, h - pass.head_begin, m_block) + 2 * work.items.dq_copy(m_block) + wg;
    const int value = work.items.template dq_rank<!Traits::kMaskDiagonal>(m_block) + 1;
    more = work.items.template next<true, !Traits::kMaskDiagonal>(h, m_block);
    named_barrier_sync(kHandoffBarrier + wg, 160);
    if (more) named_barrier_arrive(kTakenBarrier + wg, 160);
    if (threadIdx.x % 32 == 0) sm80::store_release(semaphore, value);
  }
}

// The start of a backward CTA (both kernels): barriers, then the producer
// warpgroup gives its registers to the consumers and its thread 0 loads.
// Returns true for the consumer threads.
template <class Traits, bool kDeterministic>
__device__ __forceinline__ bool start_bwd_cta(const BwdKernelArgs& args, uint8_t* smem) {
  BwdBarriers* bars = reinterpret_cast<BwdBarriers*>(smem + Traits::kOffsetBarriers);
  const int tid = threadIdx.x;
  if (tid == 0) {
    ::cuda::ptx::mbarrier_init(&bars->kv_full, 1);
    for (int s = 0; s < Traits::kStages; ++s) {
      ::cuda::ptx::mbarrier_init(&bars->q_full[s], 1);
      ::cuda::ptx::mbarrier_init(&bars->q_empty[s], 8);  // one arrival per consumer warp
    }
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  __syncthreads();
  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid == 0) produce_bwd<Traits, kDeterministic>(args, smem);
    if constexpr (kDeterministic)
      if (tid >= 32 && tid < 96) release_dq_turns<Traits>(args, tid / 32 - 1);
    return false;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  return true;
}

}  // namespace flashattn::sm90
