// Launcher of the sm90 backward, instantiated once per (dtype, head-dim class,
// diagonal mask) by the generated translation units (sm_90a only). The delta,
// dQ-zeroing and dQ-conversion passes are the sm80 backward's; only the main
// kernel differs. No allocation, no synchronization.
#pragma once

#include <type_traits>

#include "cuda/sm80/launch.cuh"  // run_bwd_passes, prepare_smem
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/bwd_kernel_wide.cuh"
#include "cuda/sm90/tensor_map.hpp"

namespace flashattn::cuda {

template <typename Tag, int kHeadDim, bool kMaskDiagonal>
fa_status run_bwd_sm90(const BwdParams& params, const BwdWorkspace& layout, void* workspace, cudaStream_t stream) {
  using T = typename ElementOf<Tag>::type;
  // Class 256 splits the head dim between the consumers (bwd_kernel_wide.cuh).
  constexpr bool kWide = kHeadDim == 256;
  using Traits = std::conditional_t<kWide, sm90::BwdWideTraits<T, kMaskDiagonal>,
                                    sm90::BwdTraits<T, kHeadDim, kMaskDiagonal>>;
  static_assert(Traits::kBlockN == sm90_bwd_block_n(kHeadDim), "the host's workspace layout assumes this key tile");
  if (params.total_q == 0 && params.total_k == 0) return FA_OK;
  sm90::BwdKernelArgs args{};
  args.params = params;
  // Varlen: one sequence of all rows (cu_seqlens give the row of each tile).
  const int64_t batch = params.is_varlen ? 1 : params.batch;
  const int64_t rows_q = params.is_varlen ? params.total_q : params.seqlen_q;
  const int64_t rows_k = params.is_varlen ? params.total_k : params.seqlen_k;
  FA_TRY(encode_tensor_map(&args.tma_q, params.dtype, params.q, params.head_dim, rows_q, params.heads, batch,
                           params.q_layout, Traits::kBlockM));
  FA_TRY(encode_tensor_map(&args.tma_do, params.dtype, params.dout, params.head_dim_v, rows_q, params.heads, batch,
                           params.dout_layout, Traits::kBlockM));
  FA_TRY(encode_tensor_map(&args.tma_k, params.dtype, params.k, params.head_dim, rows_k, params.heads_kv, batch,
                           params.k_layout, Traits::kBlockN));
  FA_TRY(encode_tensor_map(&args.tma_v, params.dtype, params.v, params.head_dim_v, rows_k, params.heads_kv, batch,
                           params.v_layout, Traits::kBlockN));
  // Deterministic mode is a kernel flag: its producer walks the items in
  // another order (BwdItems), and the default kernel keeps its own registers.
  auto kernel_for = [](auto deterministic) {
    if constexpr (kWide)
      return sm90::bwd_wide_kernel<Traits, decltype(deterministic)::value>;
    else
      return sm90::bwd_kernel<Traits, decltype(deterministic)::value>;
  };
  auto kernel = params.deterministic ? kernel_for(std::true_type{}) : kernel_for(std::false_type{});
  FA_TRY(prepare_smem(kernel, Traits::kSmemBytes, params.device_index, "sm90 backward kernel"));
  const int group = static_cast<int>(params.heads / params.heads_kv);
  return run_bwd_passes<T, kHeadDim>(
      params, layout, workspace, Traits::kBlockM, stream, [&](const sm80::BwdPass& pass, int heads_this_pass) {
        args.pass = pass;
        const dim3 grid(static_cast<unsigned>((params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN),
                        static_cast<unsigned>(heads_this_pass / group), static_cast<unsigned>(params.batch));
        if (grid.x > 0 && grid.z > 0) {
          kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(args);
          FA_CUDA_CHECK(cudaGetLastError());
        }
        return FA_OK;
      },
      /*dq_first_store=*/true);
}

}  // namespace flashattn::cuda

#define FA_INSTANTIATE_BWD_SM90(TAG, HEAD_DIM, MASK_DIAGONAL)                                                      \
  template fa_status flashattn::cuda::run_bwd_sm90<flashattn::cuda::TAG, HEAD_DIM, MASK_DIAGONAL>(                \
      const flashattn::BwdParams&, const flashattn::cuda::BwdWorkspace&, void*, cudaStream_t);
