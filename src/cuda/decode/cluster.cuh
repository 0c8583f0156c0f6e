// The thread-block-cluster operations of the decode kernels' in-cluster merge
// (sm_90): the blocks of one cluster are the splits of one (row block, batch
// row x kv head), and each reads the others' merged states from their shared
// memory instead of a combine kernel reading fp32 partials from global memory.
// Compiled out below sm_90, where the launcher never forms clusters.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#endif

namespace flashattn::cuda::decode {

// Every thread of every block of the cluster arrives, then waits for all (release / acquire:
// shared-memory writes before it are visible to the cluster's blocks after it).
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __trap();
#endif
}

__device__ __forceinline__ unsigned cluster_block_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().block_rank();
#else
  __trap();
  return 0;
#endif
}

// The address of `local` (this block's shared memory) in block `rank`'s shared memory.
__device__ __forceinline__ const float* cluster_shared(const float* local, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(local, rank);
#else
  __trap();
  return local;
#endif
}

}  // namespace flashattn::cuda::decode
