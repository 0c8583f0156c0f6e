// FlashAttention backward for sm_90a at head dims above 128 (class 256).
//
// bwd_kernel.cuh gives each consumer warpgroup 64 keys and keeps their dK and
// dV in registers; at hdim 256 that would be 2 x 128 fp32 per thread. Here
// the two consumers split the head dim instead. One CTA per (64-key tile,
// K/V head, sequence); per item (query head x 64-row query tile),
// consumer w (warpgroup w + 1):
//   S^T = K Q^T and dP^T = V dO^T for queries [32 w, 32 w + 32)  wgmma N = 32, K = 256
//   P^T and dS^T of those queries -> shared memory (16-bit), barrier
//   for head-dim columns [128 w, 128 w + 128):
//     dV += P^T dO, dK += dS^T Q        A = P^T / dS^T, K-major in shared memory
//     dQ = dS K                         both operands MN-major
//     dQ added to the fp32 workspace with vector reductions.
// dK and dV take 64 + 64 fp32 per thread, dQ 64. The producer, the item
// order and the deterministic hand-off are bwd_kernel.cuh's.
#pragma once

#include "cuda/sm90/bwd_kernel.cuh"

namespace flashattn::sm90 {

template <typename T_, bool kMaskDiagonal_>
struct BwdWideTraits {
  using T = T_;
  static constexpr int kHeadDim = 256;  // D and Dv padded up to it
  static constexpr bool kMaskDiagonal = kMaskDiagonal_;
  static constexpr int kBlockM = 64;  // queries per item
  static constexpr int kBlockN = 64;  // keys per CTA
  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr int kQueriesPerConsumer = kBlockM / 2;  // N of its S^T and dP^T
  static constexpr int kColsPerConsumer = kHeadDim / 2;    // N of its dV, dK and dQ
  static constexpr int kThreads = 384;
  static constexpr int kStages = 2;                          // Q / dO buffers
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;   // K, V: kColBlocks x (kBlockN, 64)
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;    // Q, dO: kColBlocks x (kBlockM, 64)
  static constexpr int kPBytes = kBlockN * kBlockM * 2;     // P^T or dS^T: (kBlockN keys, kBlockM queries)
  static constexpr int kRowStatBytes = 2 * kQueriesPerConsumer * 4;  // LSE, delta of a consumer's queries
  static constexpr int kBarrierBytes = 64;
  // From a 1024-byte aligned base: K, V, kStages x Q, kStages x dO, (P^T, dS^T)
  // of items it % 2, row statistics of items it % 2 per consumer, barriers.
  static constexpr int kOffsetK = 0, kOffsetV = kKVBytes, kOffsetQ = 2 * kKVBytes;
  static constexpr int kOffsetDo = kOffsetQ + kStages * kQBytes, kOffsetP = kOffsetDo + kStages * kQBytes;
  static constexpr int kOffsetRowStats = kOffsetP + 2 * 2 * kPBytes;
  static constexpr int kOffsetBarriers = kOffsetRowStats + 2 * 2 * kRowStatBytes;
  static constexpr int kSmemBytes = 1024 + kOffsetBarriers + kBarrierBytes;
  static_assert(kSmemBytes <= 227 * 1024, "the H100 / H200 opt-in shared memory per block");
  static_assert(sizeof(BwdBarriers) <= kBarrierBytes, "BwdBarriers fits");
};

template <class Traits, bool kDeterministic>
__global__ void __launch_bounds__(Traits::kThreads, 1) bwd_wide_kernel(const __grid_constant__ BwdKernelArgs args) {
  using T = typename Traits::T;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int kQueries = Traits::kQueriesPerConsumer;
  const BwdParams& params = args.params;
  const sm80::BwdPass& pass = args.pass;

  extern __shared__ unsigned char smem_raw[];
  // TMA's 128-byte swizzle and the wgmma descriptors assume 1024-byte aligned tiles.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  BwdBarriers* bars = reinterpret_cast<BwdBarriers*>(smem + Traits::kOffsetBarriers);

  const BwdLaunchSlot slot = bwd_launch_slot<Traits, kDeterministic>(pass);
  const int n_block = slot.n_block, b = blockIdx.z, tid = threadIdx.x;
  if (n_block * kBlockN >= sequence_bounds(params, b).len_k) return;  // before any barrier exists
  if (!start_bwd_cta<Traits, kDeterministic>(args, smem)) return;

  const auto work = BwdTileWork<Traits>::make(params, pass, b, n_block, slot.kv_head);
  const SequenceBounds& seq = work.seq;
  const MaskPolicy& mask = work.mask;
  const auto items = consumer_items(work.items);
  const int n0 = n_block * kBlockN, keys = min(kBlockN, seq.len_k - n0), h_kv = work.h_kv;
  // The consumers read the mode from pass at run time, as the launcher set it
  // together with kDeterministic: with the flag folded in, ptxas spilled
  // 12-40 bytes in the default kernels and they ran about 3 % slower.
  const bool deterministic = pass.semaphores != nullptr;
  int h = work.h_first, m_block = items.template m_start<kDeterministic>();
  const bool has_items = items.template next<kDeterministic, !Traits::kMaskDiagonal>(h, m_block);
  const int wg = tid / 128 - 1;  // consumer 0 or 1
  const int wtid = tid % 128, lane = tid & 31, warp = wtid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int key_in_tile = warp * 16 + g;  // + 8 r: the rows of S^T, dP^T, dK and dV of this thread
  const int query0 = wg * kQueries;       // S^T and dP^T columns of this consumer
  const int col_block0 = wg * (Traits::kColsPerConsumer / 64);  // first 64-column block of its dV, dK, dQ
  const int dim = static_cast<int>(params.head_dim);
  const float log2_scale = params.softmax_scale * sm80::kLog2e;
  const int64_t q_packed0 = sm80::packed_q_row0(params, seq, b);
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  float acc_dk[64], acc_dv[64];  // (64 keys, 128 columns) of this consumer
#pragma unroll
  for (int i = 0; i < 64; ++i) acc_dk[i] = acc_dv[i] = 0.0f;

  DeferredRelease pending;  // deterministic mode
  int* const wg_semaphores = dq_turn_base(pass, b, work.h_first, wg);

  // The LSE (+inf past the sequence end; log2 units once in shared memory) and delta of this
  // consumer's queries of an item: threads 0-31 load an LSE, 32-63 a delta.
  // As in bwd_kernel.cuh, the next item's are loaded during the dQ GEMM and
  // stored to the shared copy it % 2 after the next item issues its GEMMs.
  auto load_row_stat = [&](int item_h, int item_m_block) {
    const int item_m0 = item_m_block * kBlockM, row = query0 + wtid % kQueries;
    const bool valid = row < seq.len_q - item_m0;
    if (wtid < kQueries)
      return valid ? params.lse[sm80::row_offset(params.lse_layout, b, seq.q_row0 + item_m0 + row, item_h)]
                   : INFINITY;
    return valid ? pass.delta[int64_t(item_h) * params.total_q + q_packed0 + item_m0 + row] : 0.0f;
  };
  float row_stat = has_items && wtid < 2 * kQueries ? load_row_stat(h, m_block) : 0.0f;

  if (has_items) wait_barrier(&bars->kv_full, 0);
  for (int it = 0; has_items; ++it) {
    const int stage = it & 1;
    const int m0 = m_block * kBlockM, rows = min(kBlockM, seq.len_q - m0);
    wait_barrier(&bars->q_full[stage], (it >> 1) & 1);

    // S^T = K Q^T and dP^T = V dO^T: (64 keys, kQueries queries) each, K = 256.
    float acc_s[kQueries / 2], acc_dp[kQueries / 2];
    uint32_t smem_addr = smem_base;  // opaque: the descriptors are rebuilt where they are used
    asm volatile("" : "+r"(smem_addr));
    const uint32_t sK_addr = smem_addr + Traits::kOffsetK, sV_addr = smem_addr + Traits::kOffsetV;
    const uint32_t q_stage = smem_addr + Traits::kOffsetQ + stage * Traits::kQBytes;
    const uint32_t do_stage = smem_addr + Traits::kOffsetDo + stage * Traits::kQBytes;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      const uint32_t block = (k / 4) * 128, step_bytes = (k % 4) * 32;
      WgmmaSS<T, kQueries>::run(acc_s, desc_k_major(sK_addr + block * kBlockN + step_bytes),
                                desc_k_major(q_stage + block * kBlockM + query0 * 128 + step_bytes), k > 0 ? 1 : 0);
    }
    wgmma_commit();
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      const uint32_t block = (k / 4) * 128, step_bytes = (k % 4) * 32;
      WgmmaSS<T, kQueries>::run(acc_dp, desc_k_major(sV_addr + block * kBlockN + step_bytes),
                                desc_k_major(do_stage + block * kBlockM + query0 * 128 + step_bytes), k > 0 ? 1 : 0);
    }
    wgmma_commit();

    // Accumulator element acc[4 j + 2 r + c]: key key_in_tile + 8 r, query query0 + 8 j + 2 t + c.
    float* lse = reinterpret_cast<float*>(smem + Traits::kOffsetRowStats) + ((it & 1) * 2 + wg) * 2 * kQueries;
    float* delta = lse + kQueries;
    if (wtid < 2 * kQueries) lse[wtid] = wtid < kQueries ? row_stat * sm80::kLog2e : row_stat;  // then delta
    named_barrier_sync(5 + wg, 128);
    pending.release(wg);  // the previous item's dQ adds of this consumer
    const bool masked = !mask.tile_fully_visible(m0, m0 + rows, n0, n0 + kBlockN);
    wgmma_wait<1>();
    fence_registers(acc_s);
    exp_scores<kQueries>(acc_s, lse, log2_scale, t);
    if (masked)
      mask_scores<Traits::kMaskDiagonal, kQueries>(acc_s, mask, m0 + query0, n0 + key_in_tile, seq.len_k, t);
    wgmma_wait<0>();
    fence_registers(acc_dp);
    probabilities_to_ds<kQueries>(acc_s, acc_dp, delta, t);

    // P^T and dS^T of this consumer's queries into the item's (kBlockN, kBlockM)
    // tiles, 16-bit, in the layout wgmma reads K-major (as A of dV, dK) and
    // MN-major (as A of dQ).
    uint8_t* p_tile = smem + Traits::kOffsetP + (it & 1) * 2 * Traits::kPBytes;
    uint8_t* ds_tile = p_tile + Traits::kPBytes;
#pragma unroll
    for (int j = 0; j < kQueries / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int offset = swizzled_offset(kBlockN, key_in_tile + 8 * r, query0 + 8 * j + 2 * t);
        *reinterpret_cast<uint32_t*>(p_tile + offset) = Pack2<T>::pack(acc_s[4 * j + 2 * r], acc_s[4 * j + 2 * r + 1]);
        *reinterpret_cast<uint32_t*>(ds_tile + offset) =
            Pack2<T>::pack(acc_dp[4 * j + 2 * r], acc_dp[4 * j + 2 * r + 1]);
      }
    ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);  // generic writes -> wgmma's async-proxy reads
    named_barrier_sync(1, 256);

    // dV += P^T dO and dK += dS^T Q over this item's 64 queries (4 k-steps), for
    // this consumer's 128 columns: B rows are queries (K), columns the head dim (N).
    const uint32_t p_addr = smem_addr + Traits::kOffsetP + (it & 1) * 2 * Traits::kPBytes;
    const uint32_t ds_addr = p_addr + Traits::kPBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      WgmmaSS<T, 128>::template run<0, 1>(
          acc_dv, desc_k_major(p_addr + kk * 32),
          desc_mn_major(do_stage + col_block0 * kBlockM * 128 + kk * 16 * 128, kBlockM * 128), 1);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      WgmmaSS<T, 128>::template run<0, 1>(
          acc_dk, desc_k_major(ds_addr + kk * 32),
          desc_mn_major(q_stage + col_block0 * kBlockM * 128 + kk * 16 * 128, kBlockM * 128), 1);
    wgmma_commit();

    // dQ (64 queries, this consumer's 128 columns) = dS K over the 64 keys.
    float acc_dq[64];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      WgmmaSS<T, 128>::template run<1, 1>(
          acc_dq, desc_mn_major(ds_addr + kk * 16 * 128, kBlockN * 128),
          desc_mn_major(sK_addr + col_block0 * kBlockN * 128 + kk * 16 * 128, kBlockN * 128), kk > 0 ? 1 : 0);
    wgmma_commit();
    DqTurn turn;  // deterministic mode
    if (deterministic)
      turn = DqTurn::begin<!Traits::kMaskDiagonal>(wg_semaphores, pass.m_blocks, items, h - work.h_first, m_block);
    int next_h = h, next_m_block = m_block;
    const bool has_next = items.template next<kDeterministic, !Traits::kMaskDiagonal>(next_h, next_m_block);
    if (has_next && wtid < 2 * kQueries) row_stat = load_row_stat(next_h, next_m_block);
    wgmma_wait<0>();
    fence_registers(acc_dv);
    fence_registers(acc_dk);
    fence_registers(acc_dq);
    if (lane == 0) ::cuda::ptx::mbarrier_arrive(&bars->q_empty[stage]);

    // Accumulator element acc_dq[4 j + 2 r + c]: query 16 warp + g + 8 r, column 64 col_block0 + 8 j + 2 t + c.
    // One pointer per row of the thread: the column pairs are immediate offsets (as in bwd_kernel).
    const int dq_query0 = warp * 16 + g, col0 = col_block0 * 64 + 2 * t;
    float* dq_row0 = pass.dq_accum + (deterministic ? items.dq_copy(m_block) * pass.dq_copy_floats : 0) +
                     ((q_packed0 + m0 + dq_query0) * pass.heads_per_pass + (h - pass.head_begin)) * kHeadDim + col0;
    float* dq_row1 = dq_row0 + int64_t(pass.heads_per_pass) * (8 * kHeadDim);
    asm volatile("" : "+l"(dq_row0), "+l"(dq_row1));
    if (deterministic) {
      // The key tiles of one query tile add in BwdItems' order; the two
      // consumers add disjoint columns, each with its own semaphore.
      turn.wait(pending);
    }
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        write_dq_pair((r == 0 ? dq_row0 : dq_row1) + 8 * j, acc_dq[4 * j + 2 * r], acc_dq[4 * j + 2 * r + 1],
                      dq_query0 + 8 * r < rows && col0 + 8 * j < dim, kDeterministic && turn.rank == 0);
    if (!has_next) break;
    h = next_h;
    m_block = next_m_block;
  }
  pending.release(wg);
  store_dk_dv<T, Traits::kColsPerConsumer>(params, seq, b, n0, h_kv, keys, key_in_tile, col_block0 * 64, t, acc_dk,
                                           acc_dv);
}

}  // namespace flashattn::sm90
