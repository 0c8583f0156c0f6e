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

// Whether a kernel's code on the current device holds the griddepcontrol wait
// (PTX of virtual architecture 9.0 or later). Asked once per kernel and device:
// cudaFuncGetAttributes fills the whole attribute struct, work that every
// decode call would otherwise repeat for an answer that never changes.
inline fa_status holds_grid_dependency_wait(const void* kernel, bool* holds) {
  struct Known {
    const void* kernel;
    int device;
    bool holds;
  };
  static std::mutex mutex;
  static std::vector<Known> known;
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  for (const Known& entry : known) {
    if (entry.kernel == kernel && entry.device == device) {
      *holds = entry.holds;
      return FA_OK;
    }
  }
  cudaFuncAttributes attributes{};
  FA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  *holds = attributes.ptxVersion >= 90;
  known.push_back({kernel, device, *holds});
  return FA_OK;
}

// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent launch where the
// kernel's code holds the wait (sm_90+; launch_maybe_early): at B = 1 the launch of each decode
// kernel is a fixed latency of the call. Only code compiled for a virtual architecture of 9.0 or
// later holds that wait, so anything else (an sm_80 GPU, or PTX of compute_80 JIT-compiled for a
// newer one: NVIDIA/cccl#9134) is launched in plain stream order.
template <typename... Params, typename... Args>
fa_status launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        Args... args) {
  bool early = false;
  if (early_launch_allowed()) FA_TRY(holds_grid_dependency_wait(reinterpret_cast<const void*>(kernel), &early));
  FA_CUDA_CHECK(launch_maybe_early(early, kernel, grid, block, smem, stream, args...));
  return FA_OK;
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

// The mma kernel's instance for the cache's walk (cache_walk.hpp).
template <class Traits, typename Element>
fa_status launch_mma_walk(CacheWalk walk, const KvCacheParams& p, const KvCachePlan& plan, float* o_partial,
                          float* lse_partial, cudaStream_t stream) {
  auto kernel = walk == CacheWalk::kContiguous       ? split_kv_mma_kernel<Traits, Element, CacheWalk::kContiguous>
                : walk == CacheWalk::kContiguousWide ? split_kv_mma_kernel<Traits, Element, CacheWalk::kContiguousWide>
                : walk == CacheWalk::kLongPages      ? split_kv_mma_kernel<Traits, Element, CacheWalk::kLongPages>
                                                     : split_kv_mma_kernel<Traits, Element, CacheWalk::kShortPages>;
  return launch_split_kv<Traits>(kernel, p, plan, o_partial, lse_partial, stream);
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
  // after our own combine it gains since the combine allows the next grid once the splits are done:
  // dev/kvcache_decode.md v16 and session 35).
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
  if constexpr (kKernel == DecodeKernel::kMma) {  // only the chosen kernel is instantiated
    using Standard = SplitKvMmaTraits<Element, kHeadDim, Ring::kStandard>;
    // At hdim 64 the compact ring has the standard one's stages: no second copy of its kernels.
    using CompactTraits = SplitKvMmaTraits<Element, kHeadDim, Ring::kCompact>;
    using Compact = std::conditional_t<CompactTraits::kStages == Standard::kStages, Standard, CompactTraits>;
    const CacheWalk walk = plan.wide_fetch ? CacheWalk::kContiguousWide : cache_walk(p);
    if (plan.ring == Ring::kStandard) {
      FA_TRY((launch_mma_walk<Standard, Element>)(walk, p, plan, o_partial, lse_partial, stream));
    } else {
      FA_TRY((launch_mma_walk<Compact, Element>)(walk, p, plan, o_partial, lse_partial, stream));
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
  if (plan.splits > 1) {
    const unsigned blocks = static_cast<unsigned>(batch_heads * rows);  // one per packed row
    FA_TRY(launch_kernel(combine_kernel<Element, kHeadDim>, dim3(blocks), dim3(kCombineThreads), 0, stream, p,
                         o_partial, lse_partial, plan.splits, plan.rows_padded));
  }
  return FA_OK;
}

}  // namespace flashattn::cuda::decode

#define FA_INSTANTIATE_KVCACHE(TAG, HEAD_DIM)                                                          \
  namespace flashattn::cuda::decode {                                                                  \
  template fa_status run_kvcache<TAG, HEAD_DIM>(const KvCacheParams&, const KvCachePlan&, void*, cudaStream_t); \
  }
