// Launchers of the KV-cache kernels: append (when k_new is given), split-KV
// attention, and the combine (when the keys are split). They only enqueue
// work on the caller's stream.
#pragma once

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "cuda/decode/kvcache_kernel.cuh"
#include "cuda/element_type.cuh"
#include "cuda/decode/kvcache_launch.hpp"
#include "cuda/decode/split_kv_mma.cuh"
#include "cuda/decode/split_kv_warp.cuh"
#include "flashattn_cuda_config.hpp"  // generated: FLASHATTN_CUDA_DECODE_KERNEL

namespace flashattn::cuda::decode {

// FLASHATTN_DECODE_PDL=0 launches every decode kernel in plain stream order (A/B in one process).
inline bool early_launch_allowed() {
  const char* value = std::getenv("FLASHATTN_DECODE_PDL");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// FLASHATTN_DECODE_CLUSTER=1: the splits of the mma kernel merge inside a thread-block cluster
// (block_merge.cuh) instead of through fp32 partials and combine_kernel, where the launcher can
// (compiled_for_sm90, at most kMaxClusterSplits splits, clusters that fit the device). Read per
// call; off by default until it is timed against the combine (dev/kvcache_decode.md v19).
inline bool cluster_merge_requested() {
  const char* value = std::getenv("FLASHATTN_DECODE_CLUSTER");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// *answer for (kernel, the current device, key), computed by compute(answer) the first time and
// remembered: the attribute and occupancy queries behind these answers fill whole structs, work that
// every decode call would otherwise repeat for an answer that never changes. Each call site (each
// Compute type) keeps its own answers.
template <class Compute>
fa_status remembered(const void* kernel, int key, bool* answer, Compute&& compute) {
  struct Known {
    const void* kernel;
    int device, key;
    bool answer;
  };
  static std::mutex mutex;
  static std::vector<Known> known;
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  for (const Known& entry : known) {
    if (entry.kernel == kernel && entry.device == device && entry.key == key) {
      *answer = entry.answer;
      return FA_OK;
    }
  }
  FA_TRY(compute(answer));
  known.push_back({kernel, device, key, *answer});
  return FA_OK;
}

// Whether a kernel's code on the current device was compiled for a virtual architecture of 9.0 or
// later: only that code holds the griddepcontrol wait and the cluster operations.
inline fa_status compiled_for_sm90(const void* kernel, bool* sm90) {
  return remembered(kernel, 0, sm90, [&](bool* answer) {
    cudaFuncAttributes attributes{};
    FA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    *answer = attributes.ptxVersion >= 90;
    return FA_OK;
  });
}

// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent launch where the
// kernel's code holds the wait (sm_90+): the blocks may be scheduled while the previous kernel of
// the stream still runs, and the kernel's wait_for_prerequisite_grids() holds them until that
// kernel has completed; at B = 1 the launch of each decode kernel is a fixed latency of the call.
// Only code compiled for a virtual architecture of 9.0 or later holds that wait, so anything else
// (an sm_80 GPU, or PTX of compute_80 JIT-compiled for a newer one: NVIDIA/cccl#9134) is launched
// in plain stream order.
// Stream capture turns the attribute into a programmatic edge of the graph. cluster > 1: blocks
// (x, y, z) .. (x + cluster - 1, y, z) form a cluster (the caller checked that the code is sm_90's).
template <typename... Params, typename... Args>
fa_status launch_kernel_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, unsigned cluster,
                                    cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attributes[2] = {};
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes;
  if (early_launch_allowed()) {
    bool sm90 = false;
    FA_TRY(compiled_for_sm90(reinterpret_cast<const void*>(kernel), &sm90));
    if (sm90) {
      attributes[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attributes[config.numAttrs].val.programmaticStreamSerializationAllowed = 1;
      ++config.numAttrs;
    }
  }
  if (cluster > 1) {
    attributes[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attributes[config.numAttrs].val.clusterDim.x = cluster;
    attributes[config.numAttrs].val.clusterDim.y = 1;
    attributes[config.numAttrs].val.clusterDim.z = 1;
    ++config.numAttrs;
  }
  FA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
  return FA_OK;
}

template <typename... Params, typename... Args>
fa_status launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        Args... args) {
  return launch_kernel_in_clusters(kernel, grid, block, smem, 1u, stream, args...);
}

// Whether the mma kernel's splits can merge in one cluster per (row block, batch row x kv head):
// asked for (cluster_merge_requested), code of sm_90, 2 .. kMaxClusterSplits splits, and the
// device can place such a cluster (cluster sizes above 8 are non-portable: allowed here). Where
// they can, the kernel's shared-memory and cluster attributes are set for the launch.
template <class Kernel>
fa_status can_merge_in_clusters(Kernel kernel, const KvCachePlan& plan, int threads, int smem, bool* can) {
  *can = false;
  if (!cluster_merge_requested() || plan.splits < 2 || plan.splits > kMaxClusterSplits) return FA_OK;
  bool sm90 = false;
  FA_TRY(compiled_for_sm90(reinterpret_cast<const void*>(kernel), &sm90));
  if (!sm90) return FA_OK;
  FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  return remembered(reinterpret_cast<const void*>(kernel), plan.splits, can, [&](bool* fits) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(plan.splits);
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(plan.splits);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    FA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    *fits = clusters > 0;
    return FA_OK;
  });
}

// One split-KV kernel over grid (splits, row blocks, B * Hkv): every kernel
// takes the same arguments, its Traits give the block size and shared memory.
template <class Traits, class Kernel>
fa_status launch_split_kv(Kernel kernel, const KvCacheParams& p, const KvCachePlan& plan, float* o_partial,
                          float* lse_partial, cudaStream_t stream) {
  const int smem = static_cast<int>(Traits::smem_bytes());
  FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(plan.splits, plan.row_blocks, static_cast<unsigned>(p.batch * p.heads_kv));
  return launch_kernel(kernel, grid, dim3(Traits::kThreads), smem, stream, p, o_partial, lse_partial,
                       plan.rows_padded);
}

// The mma kernel's instance for the cache's walk (cache_walk.hpp). *merged: its splits merged in
// clusters (no partials for combine_kernel).
template <class Traits, typename Element>
fa_status launch_mma_walk(CacheWalk walk, const KvCacheParams& p, const KvCachePlan& plan, float* o_partial,
                          float* lse_partial, cudaStream_t stream, bool* merged) {
  auto kernel = walk == CacheWalk::kContiguous ? split_kv_mma_kernel<Traits, Element, CacheWalk::kContiguous>
                : walk == CacheWalk::kLongPages ? split_kv_mma_kernel<Traits, Element, CacheWalk::kLongPages>
                                                : split_kv_mma_kernel<Traits, Element, CacheWalk::kShortPages>;
  const int smem = static_cast<int>(Traits::smem_bytes());
  FA_TRY(can_merge_in_clusters(kernel, plan, Traits::kThreads, smem, merged));
  if (!*merged) return launch_split_kv<Traits>(kernel, p, plan, o_partial, lse_partial, stream);
  const dim3 grid(plan.splits, plan.row_blocks, static_cast<unsigned>(p.batch * p.heads_kv));
  return launch_kernel_in_clusters(kernel, grid, dim3(Traits::kThreads), smem, static_cast<unsigned>(plan.splits),
                                   stream, p, static_cast<float*>(nullptr), static_cast<float*>(nullptr),
                                   plan.rows_padded);
}

template <typename Tag, int kHeadDim>
fa_status run_kvcache(const KvCacheParams& p, const KvCachePlan& plan, void* workspace, cudaStream_t stream) {
  using Element = typename ElementOf<Tag>::type;
  constexpr DecodeKernel kKernel = decode_kernel(FLASHATTN_CUDA_DECODE_KERNEL, kHeadDim);
  // Refused before the append writes the cache: the split kernel's shared memory must fit a block
  // (the mma kernel's compact ring needs 72 KiB at hdim 128, the tile kernel 155 KiB at 256).
  constexpr size_t kSplitSmem = kKernel == DecodeKernel::kMma
                                    ? SplitKvMmaTraits<Element, kHeadDim, Ring::kCompact>::smem_bytes()
                                : kKernel == DecodeKernel::kWarp ? SplitKvWarpTraits<Element, kHeadDim, 8>::smem_bytes()
                                                                 : DecodeTraits<Element, kHeadDim>::smem_bytes();
  const size_t smem_per_block = static_cast<size_t>(plan.smem_per_block);
  if (kSplitSmem > smem_per_block)
    return fail(FA_ERROR_UNSUPPORTED,
                "k_cache: the decode kernel for head dim class %d needs %zu bytes of shared memory per block; device "
                "%d allows %zu",
                kHeadDim, kSplitSmem, static_cast<int>(p.device_index), smem_per_block);
  // Every kernel of the call is launched early (launch_kernel), the first one too: its blocks take
  // the SMs the caller's previous kernel leaves as it drains, and wait there for it to complete, so
  // that the launch's latency can overlap that kernel's tail (decode at B = 1 is all fixed latency;
  // after our own combine, in bench_decode's graphs, it measured no gain: dev/kvcache_decode.md v16).
  const bool appended = p.seqlen_new > 0 && p.batch > 0;
  if (appended) {
    const int64_t blocks = p.batch * p.seqlen_new * p.heads_kv;
    if (blocks > INT32_MAX) return fail(FA_ERROR_UNSUPPORTED, "k_new: more than 2^31 - 1 rows to append");
    const int threads = static_cast<int>((std::max(p.head_dim, p.head_dim_v) + 31) / 32 * 32);
    FA_TRY(launch_kernel(append_kernel<Element>, dim3(static_cast<unsigned>(blocks)), dim3(threads), 0, stream, p));
  }
  if (p.batch == 0 || p.seqlen_q == 0) return FA_OK;
  // The kernels divide by the heads in 32 bits.
  if (p.heads > INT32_MAX)
    return fail(FA_ERROR_UNSUPPORTED, "q: %lld heads exceed the decode kernels' limit 2^31 - 1",
                static_cast<long long>(p.heads));
  const int64_t batch_heads = p.batch * p.heads_kv;
  if (batch_heads > 65535 || plan.row_blocks > 65535)
    return fail(FA_ERROR_UNSUPPORTED, "q: B * Hkv = %lld exceeds the grid limit 65535 of the decode kernel",
                static_cast<long long>(batch_heads));
  const int64_t rows = p.seqlen_q * (p.heads / p.heads_kv);
  if (plan.splits > 1 && batch_heads * rows > INT32_MAX)
    return fail(FA_ERROR_UNSUPPORTED, "q: %lld packed rows to combine exceed the grid limit 2^31 - 1",
                static_cast<long long>(batch_heads * rows));
  char* base = static_cast<char*>(workspace);
  float* o_partial = plan.splits > 1 ? reinterpret_cast<float*>(base) : nullptr;
  float* lse_partial = plan.splits > 1 ? reinterpret_cast<float*>(base + plan.lse_offset) : nullptr;
  bool merged = false;  // the splits merged in clusters: no combine
  if constexpr (kKernel == DecodeKernel::kMma) {  // only the chosen kernel is instantiated
    using Standard = SplitKvMmaTraits<Element, kHeadDim, Ring::kStandard>;
    // At hdim 64 the compact ring has the standard one's stages: no second copy of its kernels.
    using CompactTraits = SplitKvMmaTraits<Element, kHeadDim, Ring::kCompact>;
    using Compact = std::conditional_t<CompactTraits::kStages == Standard::kStages, Standard, CompactTraits>;
    const CacheWalk walk = cache_walk(p);
    const Ring requested = requested_ring();
    // hdim 128: the standard ring's 104 KiB do not fit an sm_86/sm_89 block's 99 KiB.
    if (requested != Ring::kCompact && Standard::smem_bytes() <= smem_per_block) {
      FA_TRY((launch_mma_walk<Standard, Element>)(walk, p, plan, o_partial, lse_partial, stream, &merged));
    } else {
      FA_TRY((launch_mma_walk<Compact, Element>)(walk, p, plan, o_partial, lse_partial, stream, &merged));
    }
  } else if constexpr (kKernel == DecodeKernel::kWarp) {
    using Four = SplitKvWarpTraits<Element, kHeadDim, 4>;
    using Eight = SplitKvWarpTraits<Element, kHeadDim, 8>;
    if (rows_per_block(rows, kKernel) == 4)
      FA_TRY(launch_split_kv<Four>(split_kv_warp_kernel<Four, Element>, p, plan, o_partial, lse_partial,
                                   stream));
    else
      FA_TRY(launch_split_kv<Eight>(split_kv_warp_kernel<Eight, Element>, p, plan, o_partial, lse_partial,
                                    stream));
  } else {
    using Traits = DecodeTraits<Element, kHeadDim>;
    static_assert(Traits::kBlockN == kKeysPerTile, "plan and kernel agree");
    FA_TRY(launch_split_kv<Traits>(split_kv_kernel<Traits, Element>, p, plan, o_partial, lse_partial,
                                   stream));
  }
  if (plan.splits > 1 && !merged) {
    const unsigned blocks = static_cast<unsigned>(batch_heads * rows);  // one per packed row
    FA_TRY(launch_kernel(combine_kernel<Element>, dim3(blocks), dim3(kCombineThreads), 0, stream, p, o_partial,
                         lse_partial, plan.splits, plan.rows_padded));
  }
  return FA_OK;
}

}  // namespace flashattn::cuda::decode

#define FA_INSTANTIATE_KVCACHE(TAG, HEAD_DIM)                                                          \
  namespace flashattn::cuda::decode {                                                                  \
  template fa_status run_kvcache<TAG, HEAD_DIM>(const KvCacheParams&, const KvCachePlan&, void*, cudaStream_t); \
  }
