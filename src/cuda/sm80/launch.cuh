// Launchers of the sm80 kernels, instantiated once per (dtype, head-dim class,
// diagonal mask) by the generated translation units. They only enqueue work on
// the caller's stream: no allocation, no synchronization.
#pragma once

#include <algorithm>
#include <type_traits>

#include "cuda/element_type.cuh"
#include "cuda/launch.hpp"
#include "cuda/sm80/bwd_kernel.cuh"
#include "cuda/sm80/fwd_kernel.cuh"

namespace flashattn::cuda {

template <class Kernel>
fa_status prepare_smem(Kernel kernel, int smem_bytes, int device_index, const char* what) {
  int max_optin = 0;
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_index));
  if (smem_bytes > max_optin)
    return fail(FA_ERROR_UNSUPPORTED, "%s: needs %d bytes of shared memory per block, this device allows %d", what,
                smem_bytes, max_optin);
  FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  return FA_OK;
}

// The kernels' variant (sm80::Extras) for the call's options.
inline sm80::Extras extras_of(const AttnParams& params) {
  if (params.dropout.enabled && params.dropout.rng_state != nullptr) return sm80::Extras::kSeedInMemory;
  const bool extras = params.softcap > 0.0f || params.alibi_slopes != nullptr || params.dropout.enabled;
  return extras ? sm80::Extras::kOptions : sm80::Extras::kNone;
}

// select(std::integral_constant<sm80::Extras, variant>{}) for the call's variant:
// the kernel instance to launch.
template <class Select>
auto for_extras(const AttnParams& params, Select select) {
  using sm80::Extras;
  switch (extras_of(params)) {
    case Extras::kSeedInMemory: return select(std::integral_constant<Extras, Extras::kSeedInMemory>{});
    case Extras::kOptions: return select(std::integral_constant<Extras, Extras::kOptions>{});
    default: return select(std::integral_constant<Extras, Extras::kNone>{});
  }
}

template <typename Tag, int kHeadDim, bool kMaskDiagonal>
fa_status run_fwd(const FwdParams& params, cudaStream_t stream) {
  using Traits = sm80::FwdTraits<typename ElementOf<Tag>::type, kHeadDim, kMaskDiagonal>;
  auto kernel = for_extras(params, [](auto variant) { return sm80::fwd_kernel<Traits, decltype(variant)::value>; });
  FA_TRY(prepare_smem(kernel, Traits::kSmemBytes, params.device_index, "forward kernel"));
  const dim3 grid(static_cast<unsigned>((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM),
                  static_cast<unsigned>(params.heads), static_cast<unsigned>(params.batch));
  if (grid.x == 0 || grid.z == 0) return FA_OK;
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(params);
  FA_CUDA_CHECK(cudaGetLastError());
  return FA_OK;
}

// The passes every backward kernel family shares: delta = rowsum(dO * O); then,
// per group of query heads whose fp32 dQ fits the workspace, zero the dQ
// accumulator (and the deterministic semaphores), launch the main kernel
// (launch_main(pass, heads_this_pass)) and convert dQ. block_m: the query tile
// of the main kernel, which numbers the semaphores.
template <typename T, int kHeadDim, class LaunchMain>
fa_status run_bwd_passes(const BwdParams& params, const BwdWorkspace& layout, void* workspace, int block_m,
                         cudaStream_t stream, LaunchMain&& launch_main, bool dq_first_store = false) {
  char* base = static_cast<char*>(workspace);
  float* delta = reinterpret_cast<float*>(base + layout.delta_offset);
  if (params.total_q > 0) {
    constexpr int kRowsPerBlock = 8;
    const dim3 grid(static_cast<unsigned>((params.total_q + kRowsPerBlock - 1) / kRowsPerBlock),
                    static_cast<unsigned>(params.heads));
    sm80::bwd_delta_kernel<T><<<grid, kRowsPerBlock * 32, 0, stream>>>(params, delta);
    FA_CUDA_CHECK(cudaGetLastError());
  }
  sm80::BwdPass pass;
  pass.dq_accum = reinterpret_cast<float*>(base + layout.dq_accum_offset);
  pass.delta = delta;
  pass.semaphores = params.deterministic ? reinterpret_cast<int*>(base + layout.semaphore_offset) : nullptr;
  pass.heads_per_pass = layout.heads_per_pass;
  pass.m_blocks = static_cast<int>((params.seqlen_q + block_m - 1) / block_m);
  pass.dq_copies = layout.dq_copies;
  pass.key_group_tiles = layout.key_group_tiles;
  pass.dq_copy_floats = int64_t(params.total_q) * layout.heads_per_pass * kHeadDim;
  pass.dq_first_store = dq_first_store && pass.semaphores != nullptr;
  pass.block_m = block_m;
  for (int head_begin = 0; head_begin < params.heads; head_begin += layout.heads_per_pass) {
    pass.head_begin = head_begin;
    if (layout.dq_accum_bytes > 0 && !pass.dq_first_store)
      FA_CUDA_CHECK(cudaMemsetAsync(pass.dq_accum, 0, layout.dq_accum_bytes, stream));
    if (pass.semaphores != nullptr && layout.semaphore_bytes > 0)
      FA_CUDA_CHECK(cudaMemsetAsync(pass.semaphores, 0, layout.semaphore_bytes, stream));
    const int heads_this_pass = static_cast<int>(std::min<int64_t>(layout.heads_per_pass, params.heads - head_begin));
    FA_TRY(launch_main(pass, heads_this_pass));
    if (params.total_q > 0) {
      constexpr int kThreads = 256, kRowsPerBlock = kThreads / (kHeadDim / 8);
      const dim3 grid_dq(static_cast<unsigned>((params.total_q + kRowsPerBlock - 1) / kRowsPerBlock),
                         static_cast<unsigned>(heads_this_pass));
      sm80::bwd_convert_dq_kernel<T, kHeadDim><<<grid_dq, kThreads, 0, stream>>>(params, pass);
      FA_CUDA_CHECK(cudaGetLastError());
    }
  }
  return FA_OK;
}

template <class Traits, sm80::Extras kVariant>
fa_status run_bwd_with(const BwdParams& params, const BwdWorkspace& layout, void* workspace, cudaStream_t stream) {
  using T = typename Traits::T;
  auto kernel = sm80::bwd_kernel<Traits, kVariant>;
  FA_TRY(prepare_smem(kernel, Traits::kSmemBytes, params.device_index, "backward kernel"));
  const int group = static_cast<int>(params.heads / params.heads_kv);
  return run_bwd_passes<T, Traits::kHeadDim>(
      params, layout, workspace, Traits::kBlockM, stream, [&](const sm80::BwdPass& pass, int heads_this_pass) {
        const dim3 grid(static_cast<unsigned>((params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN),
                        static_cast<unsigned>(heads_this_pass / group), static_cast<unsigned>(params.batch));
        if (grid.x > 0 && grid.z > 0) {
          kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(params, pass);
          FA_CUDA_CHECK(cudaGetLastError());
        }
        return FA_OK;
      });
}

template <typename Tag, int kHeadDim, bool kMaskDiagonal>
fa_status run_bwd(const BwdParams& params, const BwdWorkspace& layout, void* workspace, cudaStream_t stream) {
  using T = typename ElementOf<Tag>::type;
  if (params.total_q == 0 && params.total_k == 0) return FA_OK;
  return for_extras(params, [&](auto variant) {
    constexpr sm80::Extras kVariant = decltype(variant)::value;
    constexpr bool kExtras = kVariant != sm80::Extras::kNone;
    using Traits = sm80::BwdTraits<T, kHeadDim, kMaskDiagonal, false, kExtras>;
    using LargeSmemTraits = sm80::BwdTraits<T, kHeadDim, kMaskDiagonal, true, kExtras>;
    if constexpr (LargeSmemTraits::kSmemBytes != Traits::kSmemBytes) {
      int max_optin = 0;
      FA_CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, params.device_index));
      if (LargeSmemTraits::kSmemBytes <= max_optin)
        return run_bwd_with<LargeSmemTraits, kVariant>(params, layout, workspace, stream);
    }
    return run_bwd_with<Traits, kVariant>(params, layout, workspace, stream);
  });
}

}  // namespace flashattn::cuda

// Instantiate one launcher of one (dtype tag, head-dim class, diagonal mask).
#define FA_INSTANTIATE_FWD(TAG, HEAD_DIM, MASK_DIAGONAL)                                       \
  template fa_status flashattn::cuda::run_fwd<flashattn::cuda::TAG, HEAD_DIM, MASK_DIAGONAL>( \
      const flashattn::FwdParams&, cudaStream_t);
#define FA_INSTANTIATE_BWD(TAG, HEAD_DIM, MASK_DIAGONAL) \
  template fa_status flashattn::cuda::run_bwd<flashattn::cuda::TAG, HEAD_DIM, MASK_DIAGONAL>(             \
      const flashattn::BwdParams&, const flashattn::cuda::BwdWorkspace&, void*, cudaStream_t);
