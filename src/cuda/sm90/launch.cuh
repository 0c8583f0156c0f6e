// Launcher of the sm90 forward, instantiated once per (dtype, head-dim class,
// diagonal mask) by the generated translation units (sm_90a only). It encodes
// the tensor maps on the host and enqueues one kernel: no allocation, no sync.
#pragma once

#include <algorithm>
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

// The persistent tile order (sm90/tile_scheduler.cuh): sections of (sequence,
// head) pairs whose K/V fit in half the L2, so the K/V a section reads stay
// resident while all its query tiles run; the other half is left to the Q
// and O streams and to the next section's first K/V tiles.
template <bool kPaired>
sm90::FwdTileOrder make_tile_order(const FwdParams& params, int l2_bytes, int block_m) {
  sm90::FwdTileOrder order;
  order.group = static_cast<int>(params.heads / params.heads_kv);
  order.m_blocks = static_cast<int>((params.seqlen_q + block_m - 1) / block_m);
  order.heads = static_cast<int>(params.heads);
  order.pairs = static_cast<int>(params.heads * params.batch);
  order.tiles = sm90::fwd_tile_indices_per_pair<kPaired>(order.m_blocks) * order.pairs;
  // The query heads of a GQA group share one K/V head: each pair costs a group's share.
  const int64_t kv_bytes_per_pair =
      std::max<int64_t>(params.seqlen_k * (params.head_dim + params.head_dim_v) * 2 / order.group, 1);
  order.section_pairs =
      static_cast<int>(std::clamp<int64_t>(l2_bytes / 2 / kv_bytes_per_pair, 1, std::max(order.pairs, 1)));
  return order;
}

// One launch of the sm90 forward with the tile shape of Traits.
template <class Traits>
fa_status launch_fwd_sm90(const FwdParams& params, cudaStream_t stream) {
  constexpr int kHeadDim = Traits::kHeadDim;
  static_assert(Traits::kBlockM >= kSm90FwdBlockM, "the host bounds tile numbers with the smallest query tile");
  const int64_t m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (m_blocks == 0 || params.batch == 0 || params.heads == 0) return FA_OK;
  sm90::FwdKernelArgs args{};
  args.params = params;
  args.order.group = static_cast<int>(params.heads / params.heads_kv);
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
  // One consumer has no partner to ping-pong with: v2.
  constexpr int kPlainSchedule = Traits::kConsumers == 1 ? 2 : default_schedule(kHeadDim);
  int schedule = extras ? 1 : kPlainSchedule;
  // FLASHATTN_SM90_SCHEDULE=v1|v2|v3 picks the consumer schedule (A/B in one process) in builds
  // with -DFLASHATTN_CUDA_SM90_ALL_SCHEDULES=ON.
  if (const int requested = sm90_schedule_override(); requested != 0) {
    if (!FLASHATTN_CUDA_SM90_ALL_SCHEDULES)
      return fail(FA_ERROR_UNSUPPORTED,
                  "FLASHATTN_SM90_SCHEDULE=v%d: this build has only the default schedules; configure with "
                  "-DFLASHATTN_CUDA_SM90_ALL_SCHEDULES=ON to choose one",
                  requested);
    schedule = requested;
  }
  // One or three consumers: the plain kernels at the default schedule only (sm90_forward_consumers).
  if (Traits::kConsumers != 2 && (extras || schedule != kPlainSchedule))
    return fail(FA_ERROR_INTERNAL, "sm90 forward: %d consumers only for the plain kernels at schedule v%d",
                Traits::kConsumers, kPlainSchedule);
  // FLASHATTN_SM90_PERSISTENT=0|1: the persistent kernel (plain kernels, schedules v2 / v3) or one tile per CTA.
  const bool persistent = sm90_forward_persistent(params, kHeadDim, Traits::kMaskDiagonal);
  if (persistent && (extras || schedule == 1 || Traits::kConsumers == 1))
    return fail(FA_ERROR_INTERNAL, "sm90 forward: no persistent kernel for schedule v%d or softcap / ALiBi", schedule);
  // The kernels of this unit: plain and softcap/ALiBi, one tile per CTA, at
  // every compiled schedule; plain persistent at schedules 2 and 3.
  auto pick = [&](auto extras_tag, auto persistent_tag) {
    constexpr bool kExtras = decltype(extras_tag)::value, kPersistent = decltype(persistent_tag)::value;
    static_assert(!(kExtras && kPersistent), "softcap / ALiBi run one tile per CTA");
    if constexpr (FLASHATTN_CUDA_SM90_ALL_SCHEDULES && Traits::kConsumers == 2) {
      if constexpr (kPersistent)
        return schedule == 3 ? sm90::fwd_kernel<Traits, false, 3, true> : sm90::fwd_kernel<Traits, false, 2, true>;
      else
        return schedule == 1   ? sm90::fwd_kernel<Traits, kExtras, 1, false>
               : schedule == 2 ? sm90::fwd_kernel<Traits, kExtras, 2, false>
                               : sm90::fwd_kernel<Traits, kExtras, 3, false>;
    } else {
      return sm90::fwd_kernel<Traits, kExtras, kExtras ? 1 : kPlainSchedule, kPersistent>;
    }
  };
  if (persistent) {
    if constexpr (Traits::kConsumers != 1) {  // no persistent kernel with one consumer (checked above)
      int multiprocessors = 0, l2_bytes = 0;
      FA_TRY(device_multiprocessors_and_l2(params.device_index, &multiprocessors, &l2_bytes));
      args.order = make_tile_order<Traits::kMaskDiagonal>(params, l2_bytes, Traits::kBlockM);
      // One CTA per SM: its threads at their registers take the whole register file.
      const int units = args.order.tiles / sm90::fwd_tiles_per_unit<Traits::kMaskDiagonal>();
      const dim3 grid(static_cast<unsigned>(std::min(units, multiprocessors)));
      auto kernel = pick(std::false_type{}, std::true_type{});
      constexpr int kSmemBytes = Traits::template smem_bytes<true>();
      FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
      kernel<<<grid, Traits::kThreads, kSmemBytes, stream>>>(args);
    }
  } else {
    const dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(params.heads),
                    static_cast<unsigned>(params.batch));
    auto kernel = pick(std::false_type{}, std::false_type{});
    if constexpr (Traits::kConsumers == 2) {  // softcap / ALiBi kernels exist with two consumers only
      if (extras) kernel = pick(std::true_type{}, std::false_type{});
    }
    FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
    kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(args);
  }
  FA_CUDA_CHECK(cudaGetLastError());
  return FA_OK;
}

template <typename Tag, int kHeadDim, bool kMaskDiagonal>
fa_status run_fwd_sm90(const FwdParams& params, cudaStream_t stream) {
  using T = typename ElementOf<Tag>::type;
  if constexpr (kHeadDim == 64) {
    const int consumers = sm90_forward_consumers(params, kHeadDim, kMaskDiagonal);
    if (consumers == 3) return launch_fwd_sm90<sm90::FwdTraits<T, kHeadDim, kMaskDiagonal, 3>>(params, stream);
    if (consumers == 1) return launch_fwd_sm90<sm90::FwdTraits<T, kHeadDim, kMaskDiagonal, 1>>(params, stream);
  } else if constexpr (kHeadDim == 128) {
    if (sm90_forward_consumers(params, kHeadDim, kMaskDiagonal) == 1)
      return launch_fwd_sm90<sm90::FwdTraits<T, kHeadDim, kMaskDiagonal, 1>>(params, stream);
  }
  return launch_fwd_sm90<sm90::FwdTraits<T, kHeadDim, kMaskDiagonal, 2>>(params, stream);
}

}  // namespace flashattn::cuda

#define FA_INSTANTIATE_FWD_SM90(TAG, HEAD_DIM, MASK_DIAGONAL)                                       \
  template fa_status flashattn::cuda::run_fwd_sm90<flashattn::cuda::TAG, HEAD_DIM, MASK_DIAGONAL>( \
      const flashattn::FwdParams&, cudaStream_t);
