// Host-side declarations of the KV-cache (decode) launchers of the CUDA
// backend. Each (dtype, head-dim class) is instantiated in its own generated
// translation unit (src/cuda/CMakeLists.txt); backend_kvcache.cpp plans the
// split count and the workspace and dispatches to them.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "common/kvcache_params.hpp"
#include "cuda/decode/split_plan.hpp"
#include "cuda/launch.hpp"

namespace flashattn::cuda::decode {

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent launch when `early`:
// the blocks may be scheduled while the stream's previous kernel still runs, and the kernel's
// wait_for_prerequisite_grids() holds them until that kernel has completed (launch_kernel,
// kvcache_launch.cuh, decides when). Stream capture turns the attribute into a programmatic edge
// of the graph.
template <typename... Params, typename... Args>
cudaError_t launch_maybe_early(bool early, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                               cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = early ? &attribute : nullptr;
  config.numAttrs = early ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// The split-KV kernels (CMake option FLASHATTN_CUDA_DECODE): tensor cores
// (split_kv_mma.cuh, head-dim classes up to 128), CUDA cores with a private
// ring per warp (split_kv_warp.cuh), or block-wide tiles (kvcache_kernel.cuh).
enum class DecodeKernel { kTiles = 0, kWarp = 1, kMma = 2 };

// The kernel a build runs for a head-dim class: the configured one, except
// that the mma kernel hands classes above 128 (registers) to the warp kernel.
constexpr DecodeKernel decode_kernel(int configured, int head_dim_class) {
  const DecodeKernel kernel = static_cast<DecodeKernel>(configured);
  return kernel == DecodeKernel::kMma && head_dim_class > 128 ? DecodeKernel::kWarp : kernel;
}

// Packed query rows per block and resident blocks per SM (for the split
// heuristic): mma 16 rows (the mma's M), 96 KiB of ring at D = 128: 2 blocks;
// warp 4 rows for G <= 4 decode (3 blocks of 168 registers), else 8 (2 blocks);
// tiles 16 rows, 82 KiB at D = 128 (2 blocks), 155 KiB at D = 256 (1 block).
constexpr int rows_per_block(int64_t rows, DecodeKernel kernel) {
  return kernel == DecodeKernel::kWarp ? (rows <= 4 ? 4 : 8) : 16;
}
constexpr int blocks_per_sm(int64_t rows, DecodeKernel kernel, int head_dim_class) {
  if (kernel == DecodeKernel::kWarp) return rows <= 4 ? 3 : 2;
  return kernel == DecodeKernel::kTiles && head_dim_class > 128 ? 1 : 2;
}
// FLASHATTN_DECODE_PAGED_BLOCKS_PER_SM=1 or 2: the blocks per SM that the
// split heuristic fills for the mma kernel on a paged cache, read per call so
// that a benchmark can time one against two in one process (the workspace
// size follows: it is planned the same way). Unset or any other value: 0, the
// default below.
inline int paged_blocks_per_sm_override() {
  const char* value = std::getenv("FLASHATTN_DECODE_PAGED_BLOCKS_PER_SM");
  if (value == nullptr) return 0;
  return std::strcmp(value, "1") == 0 ? 1 : std::strcmp(value, "2") == 0 ? 2 : 0;
}

// The blocks per SM the split heuristic fills: for the mma kernel on a
// contiguous cache one, although two are resident. Session 14's run 5 (H200,
// bf16, hdim 128, 8 KV heads) timed one block per SM against two: B = 1 with
// 32k keys 47.7 vs 49.8 us (16 splits against 32), 128k 140.8 vs 146.7,
// B = 8 with 4k 47.3 vs 50.0 (2 splits against 4), 32k 264.3 vs 270.2, and
// in its sweeps one block per SM was the fastest count or within 3 % of it.
// A paged cache keeps two: with one block per SM paged 16 ran 1.26-1.37x the
// contiguous time (session 14), its lone warps bound by the long-pages walk's
// instructions (ncu, session 15: 1.60x the contiguous walk's per slab). Since
// session 16's shorter walk (dev/kvcache_decode.md v13) one block per SM runs
// paged 16 at 1.00-1.10x of contiguous and two at 1.00-1.13x, neither ahead at
// every size, so two stay. FLASHATTN_DECODE_PAGED_BLOCKS_PER_SM
// (paged_blocks_per_sm_override) sets the count for paged caches.
inline int split_blocks_per_sm(int64_t rows, DecodeKernel kernel, int head_dim_class, bool paged) {
  if (kernel != DecodeKernel::kMma) return blocks_per_sm(rows, kernel, head_dim_class);
  if (!paged) return 1;
  const int forced = paged_blocks_per_sm_override();
  return forced > 0 ? forced : blocks_per_sm(rows, kernel, head_dim_class);
}

// FLASHATTN_DECODE_RING=compact runs the sm_86/sm_89 instance on a GPU that fits more (the tests
// compare it with the standard one), read per call; unset or other: kStandard.
inline Ring requested_ring() {
  const char* value = std::getenv("FLASHATTN_DECODE_RING");
  return value != nullptr && std::strcmp(value, "compact") == 0 ? Ring::kCompact : Ring::kStandard;
}

// The ring a call of the mma kernel runs: the requested one where the device's opt-in shared memory
// per block holds it (hdim 128: the standard ring's 104 KiB do not fit an sm_86/sm_89 block's 99 KiB).
inline Ring mma_ring(int head_dim_class, int smem_per_block) {
  const Ring requested = requested_ring();
  return requested == Ring::kStandard && mma_smem_bytes(Ring::kStandard, head_dim_class) <= smem_per_block
             ? Ring::kStandard
             : Ring::kCompact;
}

// FLASHATTN_DECODE_FETCH=wide or sector makes the contiguous walk take the L2's 256-byte fetch or
// the sectors' on any grid (the tests compare the two), read per call; unset or other: the plan's rule.
enum class FetchRequest { kRule, kWide, kSector };
inline FetchRequest requested_fetch() {
  const char* value = std::getenv("FLASHATTN_DECODE_FETCH");
  if (value == nullptr) return FetchRequest::kRule;
  if (std::strcmp(value, "wide") == 0) return FetchRequest::kWide;
  return std::strcmp(value, "sector") == 0 ? FetchRequest::kSector : FetchRequest::kRule;
}

// The work of one call: grid (splits, row_blocks, B * Hkv) and the fp32
// partials of the splits (none when splits == 1).
struct KvCachePlan {
  int splits = 1;
  int row_blocks = 1;
  int rows_padded = 0;  // row_blocks * rows_per_block
  int smem_per_block = 0;         // the device's opt-in shared memory per block
  Ring ring = Ring::kStandard;    // the mma kernel's ring (mma_ring)
  bool wide_fetch = false;        // the mma kernel walks a contiguous cache as CacheWalk::kContiguousWide
  size_t o_partial_bytes = 0, lse_partial_bytes = 0, lse_offset = 0, total = 0;
};

template <typename Tag, int kHeadDim>
fa_status run_kvcache(const KvCacheParams& params, const KvCachePlan& plan, void* workspace, cudaStream_t stream);

}  // namespace flashattn::cuda::decode
