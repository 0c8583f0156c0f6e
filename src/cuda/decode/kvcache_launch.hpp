// Host-side declarations of the KV-cache (decode) launchers of the CUDA
// backend. Each (dtype, head-dim class) is instantiated in its own generated
// translation unit (src/cuda/CMakeLists.txt); backend_kvcache.cpp plans the
// split count and the workspace and dispatches to them.
#pragma once

#include <cuda_runtime.h>

#include "common/kvcache_params.hpp"
#include "cuda/launch.hpp"

namespace flashattn::cuda::decode {

// Packed query rows per block and keys per tile of split_kv_kernel (kvcache_kernel.cuh).
constexpr int kRowsPerBlock = 16;
constexpr int kKeysPerTile = 64;

// The work of one call: grid (splits, row_blocks, B * Hkv) and the fp32
// partials of the splits (none when splits == 1).
struct KvCachePlan {
  int splits = 1;
  int row_blocks = 1;
  int rows_padded = 0;  // row_blocks * kRowsPerBlock
  size_t o_partial_bytes = 0, lse_partial_bytes = 0, lse_offset = 0, total = 0;
};

template <typename Tag, int kHeadDim>
fa_status run_kvcache(const KvCacheParams& params, const KvCachePlan& plan, void* workspace, cudaStream_t stream);

}  // namespace flashattn::cuda::decode
