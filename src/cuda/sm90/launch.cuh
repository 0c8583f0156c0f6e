// Launcher of the sm90 forward, instantiated once per (dtype, head-dim class,
// diagonal mask) by the generated translation units (sm_90a only). It encodes
// the tensor maps on the host and enqueues one kernel: no allocation, no sync.
#pragma once

#include <cstdlib>
#include <type_traits>

#include "cuda/element_type.cuh"
#include "cuda/launch.hpp"
#include "cuda/sm90/fwd_kernel.cuh"
#include "cuda/sm90/tensor_map.hpp"
#include "flashattn_cuda_config.hpp"  // generated: FLASHATTN_CUDA_SM90_ALL_SCHEDULES

namespace flashattn::cuda {

// The default consumer schedule (sm90::fwd_kernel's kSchedule) of the plain
// kernels, measured on the H200 (docs/sm90_tuning.md): v2 (softmax of tile j
// overlaps P V of tile j-1) is the fastest at hdim 128 and 256 (+5-17 % over v1),
// v3 (v2 plus ping-pong) at hdim 64, where the softmax weighs most.
constexpr int default_schedule(int head_dim) { return head_dim <= 64 ? 3 : 2; }

template <typename Tag, int kHeadDim, bool kMaskDiagonal>
fa_status run_fwd_sm90(const FwdParams& params, cudaStream_t stream) {
  using Traits = sm90::FwdTraits<typename ElementOf<Tag>::type, kHeadDim, kMaskDiagonal>;
  const dim3 grid(static_cast<unsigned>((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM),
                  static_cast<unsigned>(params.heads), static_cast<unsigned>(params.batch));
  if (grid.x == 0 || grid.z == 0) return FA_OK;
  sm90::FwdKernelArgs args{};
  args.params = params;
  // Varlen: one sequence of all rows (cu_seqlens give the row of each tile).
  const int64_t batch = params.is_varlen ? 1 : params.batch;
  const int64_t rows_q = params.is_varlen ? params.total_q : params.seqlen_q;
  const int64_t rows_k = params.is_varlen ? params.total_k : params.seqlen_k;
  FA_TRY(encode_tensor_map(&args.tma_q, params.dtype, params.q, params.head_dim, rows_q, params.heads, batch,
                           params.q_layout, Traits::kBlockM));
  FA_TRY(encode_tensor_map(&args.tma_k, params.dtype, params.k, params.head_dim, rows_k, params.heads_kv, batch,
                           params.k_layout, Traits::kBlockN));
  FA_TRY(encode_tensor_map(&args.tma_v, params.dtype, params.v, params.head_dim_v, rows_k, params.heads_kv, batch,
                           params.v_layout, Traits::kBlockN));
  const bool extras = params.softcap > 0.0f || params.alibi_slopes != nullptr;
  // Softcap / ALiBi kernels spill under v2 and v3 (up to 470 bytes at hdim 128): they run v1.
  constexpr int kPlainSchedule = default_schedule(kHeadDim);
  int schedule = extras ? 1 : kPlainSchedule;
  // FLASHATTN_SM90_SCHEDULE=v1|v2|v3 picks the consumer schedule (A/B in one process) in builds
  // with -DFLASHATTN_CUDA_SM90_ALL_SCHEDULES=ON.
  const char* schedule_name = std::getenv("FLASHATTN_SM90_SCHEDULE");
  if (schedule_name != nullptr && schedule_name[0] == 'v' && schedule_name[1] >= '1' && schedule_name[1] <= '3') {
    if (!FLASHATTN_CUDA_SM90_ALL_SCHEDULES)
      return fail(FA_ERROR_UNSUPPORTED,
                  "FLASHATTN_SM90_SCHEDULE=%s: this build has only the default schedules; configure with "
                  "-DFLASHATTN_CUDA_SM90_ALL_SCHEDULES=ON to choose one",
                  schedule_name);
    schedule = schedule_name[1] - '0';
  }
  auto pick = [&](auto extras_tag) {
    constexpr bool kExtras = decltype(extras_tag)::value;
    if constexpr (FLASHATTN_CUDA_SM90_ALL_SCHEDULES) {
      return schedule == 1   ? sm90::fwd_kernel<Traits, kExtras, 1>
             : schedule == 2 ? sm90::fwd_kernel<Traits, kExtras, 2>
                             : sm90::fwd_kernel<Traits, kExtras, 3>;
    } else {
      return sm90::fwd_kernel<Traits, kExtras, kExtras ? 1 : kPlainSchedule>;
    }
  };
  auto kernel = extras ? pick(std::true_type{}) : pick(std::false_type{});
  (void)schedule;  // read only when every schedule is compiled
  FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(args);
  FA_CUDA_CHECK(cudaGetLastError());
  return FA_OK;
}

}  // namespace flashattn::cuda

#define FA_INSTANTIATE_FWD_SM90(TAG, HEAD_DIM, MASK_DIAGONAL)                                       \
  template fa_status flashattn::cuda::run_fwd_sm90<flashattn::cuda::TAG, HEAD_DIM, MASK_DIAGONAL>( \
      const flashattn::FwdParams&, cudaStream_t);
