// The sm90 forward's producer side: the kernel's argument block, the barriers
// in shared memory, and the TMA loads that one thread of the producer
// warpgroup issues for every tile of its CTA (fwd_kernel.cuh runs it).
#pragma once

#include <cuda.h>  // CUtensorMap (types only: the driver is reached through the runtime)

#include <cuda/ptx>

#include "cuda/sm80/kernel_traits.cuh"  // SequenceBounds, sequence_bounds
#include "cuda/sm90/tile_scheduler.cuh"

namespace flashattn::sm90 {

// The kernel's argument block: the tensor maps (64-byte aligned, first), the
// flat params and the persistent tile order. Q and O rows are (col, row, head,
// batch) maps with boxes of (64, kBlockM); K and V (64, kBlockN). Varlen maps
// have batch extent 1.
struct FwdKernelArgs {
  CUtensorMap tma_q, tma_k, tma_v;
  FwdParams params;
  FwdTileOrder order;  // the persistent kernels' tile order; group in every kernel
};

// Shared-memory bookkeeping: barrier slots after the tiles.
struct Barriers {
  uint64_t q_full, q_empty;
  uint64_t k_full[2], k_empty[2];
  uint64_t v_full[2], v_empty[2];
};

__device__ __forceinline__ void wait_barrier(uint64_t* barrier, uint32_t parity) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(barrier, parity)) {
  }
}

__device__ __forceinline__ void tma_load(void* smem, const CUtensorMap* map, int col, int row, int head, int batch,
                                         uint64_t* barrier) {
  const int32_t coords[4] = {col, row, head, batch};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, smem, map, coords, barrier);
}

// Thread 0 of the producer warpgroup: the TMA loads of every tile of the
// CTA with keys. kv_it counts the key tiles loaded so far (stage kv_it % 2),
// q_it the Q tiles: both run on across tiles, as the consumers' counters do.
template <class Traits, class Scheduler>
__device__ __forceinline__ void produce(const FwdKernelArgs& args, uint8_t* sQ, uint8_t* sK, uint8_t* sV,
                                        Barriers* bars) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  int kv_it = 0, q_it = 0;
  for (int t = Scheduler::first(); Scheduler::valid(args.order, t); t = Scheduler::next(t)) {
    const FwdTile tile = Scheduler::tile(args.order, t);
    const sm80::SequenceBounds seq = sm80::sequence_bounds(args.params, tile.b);
    const int m0 = tile.m_block * kBlockM;
    if (m0 >= seq.len_q) continue;
    const KeyBlockRange keys = key_block_range<kBlockN>(tile_mask(args.params, seq), m0, min(kBlockM, seq.len_q - m0));
    if (keys.empty) continue;
    const int batch = args.params.is_varlen ? 0 : tile.b;
    const int h_kv = tile.h / args.order.group;
    // The consumers release Q after the last S GEMM of the previous tile.
    if (q_it > 0) wait_barrier(&bars->q_empty, (q_it - 1) & 1);
    ++q_it;
    ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                           ::cuda::ptx::space_shared, &bars->q_full, Traits::kQBytes);
#pragma unroll
    for (int cb = 0; cb < Traits::kColBlocks; ++cb)
      tma_load(sQ + cb * kBlockM * 128, &args.tma_q, cb * 64, static_cast<int>(seq.q_row0) + m0, tile.h, batch,
               &bars->q_full);
    for (int n_block = keys.last - 1; n_block >= keys.first; --n_block, ++kv_it) {
      const int stage = kv_it & 1;
      const uint32_t parity = ((kv_it >> 1) & 1) ^ 1;  // the release of iteration kv_it - 2
      const int row = static_cast<int>(seq.k_row0) + n_block * kBlockN;
      if (kv_it >= 2) wait_barrier(&bars->k_empty[stage], parity);
      ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                             ::cuda::ptx::space_shared, &bars->k_full[stage], Traits::kKVBytes);
#pragma unroll
      for (int cb = 0; cb < Traits::kColBlocks; ++cb)
        tma_load(sK + stage * Traits::kKVBytes + cb * kBlockN * 128, &args.tma_k, cb * 64, row, h_kv, batch,
                 &bars->k_full[stage]);
      if (kv_it >= 2) wait_barrier(&bars->v_empty[stage], parity);
      ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                             ::cuda::ptx::space_shared, &bars->v_full[stage], Traits::kKVBytes);
#pragma unroll
      for (int cb = 0; cb < Traits::kColBlocks; ++cb)
        tma_load(sV + stage * Traits::kKVBytes + cb * kBlockN * 128, &args.tma_v, cb * 64, row, h_kv, batch,
                 &bars->v_full[stage]);
    }
  }
}

}  // namespace flashattn::sm90
