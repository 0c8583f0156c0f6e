// Host-side declarations of the KV-cache (decode) launchers of the CUDA
// backend. Each (dtype, head-dim class) is instantiated in its own generated
// translation unit (src/cuda/CMakeLists.txt); backend_kvcache.cpp plans the
// split count and the workspace and dispatches to them.
#pragma once

#include <cuda_runtime.h>

#include "common/kvcache_params.hpp"
#include "cuda/launch.hpp"

namespace flashattn::cuda::decode {

// Keys per split come in multiples of kKeysPerTile (the tile of split_kv_kernel).
constexpr int kKeysPerTile = 64;

// Packed query rows per block and resident blocks per SM (for the split
// heuristic) of the kernel this build runs: the tile kernel of
// kvcache_kernel.cuh (16 rows, 82 KiB of shared memory: 2 blocks), or with
// -DFLASHATTN_CUDA_DECODE=warp the warp-streamed one of split_kv_warp.cuh
// (4 rows for G <= 4 decode, 3 blocks of 168 registers; else 8 rows, 2 blocks).
constexpr int rows_per_block(int64_t rows, bool warp_kernel) { return !warp_kernel ? 16 : (rows <= 4 ? 4 : 8); }
constexpr int blocks_per_sm(int64_t rows, bool warp_kernel) { return !warp_kernel ? 2 : (rows <= 4 ? 3 : 2); }

// The work of one call: grid (splits, row_blocks, B * Hkv) and the fp32
// partials of the splits (none when splits == 1).
struct KvCachePlan {
  int splits = 1;
  int row_blocks = 1;
  int rows_padded = 0;  // row_blocks * rows_per_block
  size_t o_partial_bytes = 0, lse_partial_bytes = 0, lse_offset = 0, total = 0;
};

template <typename Tag, int kHeadDim>
fa_status run_kvcache(const KvCacheParams& params, const KvCachePlan& plan, void* workspace, cudaStream_t stream);

}  // namespace flashattn::cuda::decode
