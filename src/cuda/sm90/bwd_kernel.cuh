// FlashAttention backward for sm_90a: TMA loads, wgmma, warp specialization.
//
// One CTA per (128-key tile, K/V head, sequence), three warpgroups:
//   warpgroup 0 (producer): one thread loads K and V once (TMA), then per
//     item (query head of the GQA group x query tile of kBlockM rows) Q and dO
//     by TMA, into two stages;
//   warpgroups 1, 2 (consumers): keys [64 w, 64 w + 64) of the tile each. Per item
//     LSE and delta rows of the item       global -> this warpgroup's shared copy
//     S^T = K Q^T and dP^T = V dO^T   wgmma, both operands in shared memory
//     P^T = exp2(S^T scale - LSE),    registers (the accumulators)
//     dS^T = P^T (dP^T - delta)
//     dV += P^T dO, dK += dS^T Q     wgmma, A from registers, dO / Q MN-major
//     dS^T -> shared memory, then one (64, 64) block of dQ = dS K per
//     warpgroup (wgmma, both operands MN-major) added to the fp32 dQ workspace
//     with vector reductions.
// dK and dV stay in registers for the whole CTA (64 + 64 fp32 per thread at
// hdim 128), which is what bounds the key tile. At hdim 64 they take half of
// that, and the item doubles to 128 queries instead: the same registers for
// S^T and dP^T, twice the work per barrier and per item's fixed costs.
// Deterministic mode adds the dQ of a query tile in a fixed key-tile order
// (BwdItems). Softcap, ALiBi and dropout stay on the sm80 backward (the
// dispatcher routes them).
#pragma once

#include <cuda/ptx>
#include <type_traits>

#include "cuda/launch.hpp"              // kSemaphoresPerQueryTile
#include "cuda/sm80/bwd_kernel.cuh"     // BwdPass, packed_q_row0, red_add_f32x2, semaphores
#include "cuda/sm90/bwd_items.hpp"
#include "cuda/sm90/bwd_producer.cuh"   // BwdKernelArgs, BwdTileWork, start_bwd_cta
#include "cuda/sm90/fwd_kernel.cuh"     // wait_barrier, tma_load, swizzled_offset, named_barrier_sync

namespace flashattn::sm90 {

template <typename T_, int kHeadDim_, bool kMaskDiagonal_>
struct BwdTraits {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_;  // 64 or 128: D and Dv padded up to it
  static constexpr bool kMaskDiagonal = kMaskDiagonal_;
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;  // queries per item: N of S^T, K of dV / dK
  static constexpr int kBlockN = 128;  // keys per CTA: two consumer warpgroups x 64
  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr int kNO = kHeadDim;  // N of one dV / dK instruction (64 or 128)
  static constexpr int kThreads = 384;
  static constexpr int kStages = 2;  // Q / dO buffers
  // dQ (kBlockM, kHeadDim) of an item is two (64, 64) blocks over all 128
  // keys, one per warpgroup, which reads the other warpgroup's dS: at hdim 128
  // warpgroup w takes columns [64 w, 64 w + 64), at hdim 64 queries.
  static constexpr bool kDqSplitQueries = kBlockM == 128;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // K, V: kColBlocks x (kBlockN, 64)
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;   // Q, dO: kColBlocks x (kBlockM, 64)
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;   // dS^T: (kBlockN, kBlockM), one column block
  static constexpr int kRowStatBytes = kBlockM * 4;        // LSE (log2 units) or delta of one item
  static constexpr int kBarrierBytes = 64;
  // Shared memory, from a 1024-byte aligned base: K, V, kStages x Q, kStages x dO,
  // dS^T of items it % 2, LSE and delta of items it % 2 for each consumer warpgroup, barriers.
  static constexpr int kOffsetK = 0, kOffsetV = kKVBytes, kOffsetQ = 2 * kKVBytes;
  static constexpr int kOffsetDo = kOffsetQ + kStages * kQBytes, kOffsetDs = kOffsetDo + kStages * kQBytes;
  static constexpr int kOffsetRowStats = kOffsetDs + 2 * kDsBytes;  // 2 items x 2 warpgroups x (LSE, delta)
  static constexpr int kOffsetBarriers = kOffsetRowStats + 2 * 2 * 2 * kRowStatBytes;
  static constexpr int kSmemBytes = 1024 + kOffsetBarriers + kBarrierBytes;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "dK and dV of 64 keys x hdim must fit the registers");
  static constexpr int kRowStatsPerThread = 2 * kBlockM / 128;  // an item's LSE and delta over a warpgroup
  static_assert(kHeadDim / 64 * kBlockM == 128, "dQ is two (64, 64) blocks");
};

// Pieces both consumer kernels share. A consumer's S^T / dP^T accumulator
// covers (64 keys, kN queries): element [4 j + 2 r + c] is key key_in_tile + 8 r,
// query query0 + 8 j + 2 t + c of the item; lse and delta point at the LSE
// (log2 units) and delta of query query0.

// P^T = exp2(S^T scale - LSE), in place.
template <int kN>
__device__ __forceinline__ void exp_scores(float (&acc)[kN / 2], const float* lse, float log2_scale, int t) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float lse_query = lse[8 * j + 2 * t + c];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float& s = acc[4 * j + 2 * r + c];
        s = exp2_approx(s * log2_scale - lse_query);
      }
    }
}

// Zeroes the probabilities of hidden (query, key) pairs: a pass of its own,
// one branch per item, because per-element branches inside exp_scores kept
// the exponentials from overlapping. first_query = m0 + query0, first_key =
// n0 + key_in_tile; without a diagonal mask only keys past the end are hidden.
// Each of the thread's two keys sees a range of queries: as offsets from its
// first query column, each element is two 32-bit compares with a constant.
template <bool kMaskDiagonal, int kN>
__device__ __forceinline__ void mask_scores(float (&acc)[kN / 2], const MaskPolicy& mask, int64_t first_query,
                                            int64_t first_key, int len_k, int t) {
  const int64_t column0 = first_query + 2 * t;
  int begin[2], end[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = first_key + 8 * r;
    begin[r] = kMaskDiagonal ? MaskPolicy::offset_in_tile(mask.query_begin(key), column0, kN) : 0;
    end[r] = kMaskDiagonal ? MaskPolicy::offset_in_tile(mask.query_end(key), column0, kN) : key < len_k ? kN : 0;
  }
#pragma unroll
  for (int e = 0; e < kN / 2; ++e) {
    const int offset = 8 * (e / 4) + (e & 1), r = (e >> 1) & 1;
    if (offset < begin[r] || offset >= end[r]) acc[e] = 0.0f;
  }
}

// dS^T = P^T (dP^T - delta), in place in dp.
template <int kN>
__device__ __forceinline__ void probabilities_to_ds(const float (&p)[kN / 2], float (&dp)[kN / 2], const float* delta,
                                                    int t) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float delta_query = delta[8 * j + 2 * t + c];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int e = 4 * j + 2 * r + c;
        dp[e] = p[e] * (dp[e] - delta_query);
      }
    }
}

// Deterministic mode: whether a consumer warpgroup has dQ adds its releaser
// warp has not been told of yet. The hand-off goes out after the next item's
// first warpgroup barrier (that item's first GEMMs are issued by then) or
// after the last item; the releaser warp (release_dq_turns) then does the
// st.release, whose memory barrier stalls an otherwise idle warp instead of a
// consumer (measured: +0-8 % for the deterministic fwd+bwd, dev/sm90_log.md,
// session 9). The consumers' reductions come before their bar.arrive, which
// synchronizes with the releaser's bar.sync, and st.release is cumulative, so
// the adds are visible before the semaphore's value.
struct DeferredRelease {
  bool pending = false;
  int handoffs = 0;
  __device__ __forceinline__ void release(int wg) {
    if (!pending) return;
    if (handoffs > 0) named_barrier_sync(kTakenBarrier + wg, 160);  // the releaser has passed the previous one
    named_barrier_arrive(kHandoffBarrier + wg, 160);
    ++handoffs;
    pending = false;
  }
};

// Deterministic mode: consumer warpgroup wg waits until the key tiles before
// this one (BwdItems' order) have added their part of query tile m_block of
// head h into its dQ copy, then arms the release for the next one. Each
// warpgroup adds a disjoint block of dQ and hands it over with its own
// semaphore, so neither waits for the other. Lane 0 of each warp polls (each
// warp acquires for itself, so no warpgroup barrier holds the four warps
// together: +1-5 % against one poller and a barrier, session 9): the first
// read goes out with the dQ GEMM (begin), so where the turn has already come
// its latency hides behind the GEMM; wait() then only checks it.
struct DqTurn {
  int* semaphore;
  int rank, seen;

  // wg_semaphores: the CTA's DqTurnBase (its first head, query tile 0, this
  // warpgroup); head_in_group: h minus the CTA's first head.
  template <bool kEveryTileVisits, class Items>
  __device__ __forceinline__ static DqTurn begin(int* wg_semaphores, int semaphore_m_blocks, const Items& items,
                                                 int head_in_group, int m_block) {
    DqTurn turn;
    turn.semaphore = wg_semaphores + (head_in_group * semaphore_m_blocks + m_block) * flashattn::cuda::kSemaphoresPerQueryTile +
                     2 * items.dq_copy(m_block);
    turn.rank = items.template dq_rank<kEveryTileVisits>(m_block);
    turn.seen = threadIdx.x % 32 == 0 ? sm80::load_acquire(turn.semaphore) : 0;
    return turn;
  }
  __device__ __forceinline__ void wait(DeferredRelease& pending) {
    if (threadIdx.x % 32 == 0)
      while (seen != rank) seen = sm80::load_acquire(semaphore);
    __syncwarp();
    pending.pending = true;
  }
};

// The consumers' copy of the item walk, its mask offset held in a register:
// the compiler otherwise re-derives it from the parameters (a 64-bit clamp of
// ~12 instructions) at every item, in the deterministic rank (dq_rank).
template <class Items>
__device__ __forceinline__ Items consumer_items(const Items& items) {
  Items pinned = items;
  asm volatile("" : "+r"(pinned.end_offset));
  return pinned;
}

// Deterministic mode: consumer warpgroup wg's semaphore for query tile 0 of
// the CTA's first head, once per CTA, so that an item's semaphore is a 32-bit
// offset from it (a GQA group's tiles are few). Derived per item, the 64-bit
// index took ~70 instructions between the dQ GEMM's issue and its wait, where
// the deterministic consumers spent ~10 % of their samples (ncu source
// counters, hdim 128 16k causal, session 14).
__device__ __forceinline__ int* dq_turn_base(const sm80::BwdPass& pass, int b, int h_first, int wg) {
  return pass.semaphores == nullptr ? nullptr : sm80::dq_tile_semaphores(pass, b, h_first - pass.head_begin, 0) + wg;
}

// One column pair of a dQ add, done where `write` holds. In deterministic
// mode the first adder of a (query tile, dQ copy) (rank 0) stores instead, so
// the host does not zero the accumulator (+1-7 % at 1k, session 9); the
// convert pass counts a copy that no key tile reached (its semaphore still 0)
// as zero. The callers pass compile-time conditions where they can (whole
// tiles, the mode of the item): ptxas turns a run-time predicate into a
// branch around the pair, four instructions per pair and 16 pairs an item.
__device__ __forceinline__ void write_dq_pair(float* address, float a, float b, bool write, bool first_adder) {
  asm volatile(
      "{\n"
      ".reg .pred write, store, add;\n"
      "setp.ne.b32 write, %3, 0;\n"
      "setp.ne.and.b32 store, %4, 0, write;\n"
      "setp.eq.and.b32 add, %4, 0, write;\n"
      "@store st.global.v2.f32 [%0], {%1, %2};\n"
      "@add red.global.add.v2.f32 [%0], {%1, %2};\n"
      "}\n" ::"l"(address),
      "f"(a), "f"(b), "r"(static_cast<int>(write)), "r"(static_cast<int>(first_adder))
      : "memory");
}

// dK (times the softmax scale) and dV of a consumer's 64 keys x kCols columns
// from its accumulators: element [4 j + 2 r + c] is key key_in_tile + 8 r,
// column col0 + 8 j + 2 t + c.
template <typename T, int kCols>
__device__ __forceinline__ void store_dk_dv(const BwdParams& params, const SequenceBounds& seq, int b, int n0,
                                            int h_kv, int keys, int key_in_tile, int col0, int t,
                                            const float (&acc_dk)[kCols / 2], const float (&acc_dv)[kCols / 2]) {
  T* dk_tile = static_cast<T*>(params.dk) + sm80::row_offset(params.dk_layout, b, seq.k_row0 + n0, h_kv);
  T* dv_tile = static_cast<T*>(params.dv) + sm80::row_offset(params.dv_layout, b, seq.k_row0 + n0, h_kv);
  const int dim = static_cast<int>(params.head_dim), dim_v = static_cast<int>(params.head_dim_v);
  const float scale = params.softmax_scale;
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = key_in_tile + 8 * r, col = col0 + 8 * j + 2 * t;
      if (key >= keys) continue;
      if (col < dim)
        *reinterpret_cast<uint32_t*>(dk_tile + key * params.dk_layout.row + col) =
            Pack2<T>::pack(acc_dk[4 * j + 2 * r] * scale, acc_dk[4 * j + 2 * r + 1] * scale);
      if (col < dim_v)
        *reinterpret_cast<uint32_t*>(dv_tile + key * params.dv_layout.row + col) =
            Pack2<T>::pack(acc_dv[4 * j + 2 * r], acc_dv[4 * j + 2 * r + 1]);
    }
}

template <class Traits, bool kDeterministic>
__global__ void __launch_bounds__(Traits::kThreads, 1) bwd_kernel(const __grid_constant__ BwdKernelArgs args) {
  using T = typename Traits::T;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int kNO = Traits::kNO;
  const BwdParams& params = args.params;
  const sm80::BwdPass& pass = args.pass;

  extern __shared__ unsigned char smem_raw[];
  // TMA's 128-byte swizzle and the wgmma descriptors assume 1024-byte aligned tiles.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sDs = smem + Traits::kOffsetDs;
  BwdBarriers* bars = reinterpret_cast<BwdBarriers*>(smem + Traits::kOffsetBarriers);

  const BwdLaunchSlot slot = bwd_launch_slot<Traits, kDeterministic>(pass);
  const int n_block = slot.n_block, b = blockIdx.z, tid = threadIdx.x;
  if (n_block * kBlockN >= sequence_bounds(params, b).len_k) return;  // before any barrier exists
  if (!start_bwd_cta<Traits, kDeterministic>(args, smem)) return;
  const int warpgroup = tid / 128;

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
  const int wg = warpgroup - 1;  // consumer 0 or 1: keys [64 wg, 64 wg + 64) of the tile
  const int wtid = tid % 128, lane = tid & 31, warp = wtid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int key_in_tile = wg * 64 + warp * 16 + g;  // + 8 r for the second row of the thread
  const int dim = static_cast<int>(params.head_dim);
  const float log2_scale = params.softmax_scale * sm80::kLog2e;
  const int64_t q_packed0 = sm80::packed_q_row0(params, seq, b);
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  float acc_dk[kNO / 2], acc_dv[kNO / 2];  // (64 keys, kHeadDim) of this warpgroup
#pragma unroll
  for (int i = 0; i < kNO / 2; ++i) acc_dk[i] = acc_dv[i] = 0.0f;

  // The (64, 64) block of every item's dQ that this warpgroup computes.
  const int dq_col_block = Traits::kDqSplitQueries ? 0 : wg;
  const int dq_query_block = Traits::kDqSplitQueries ? wg : 0;

  DeferredRelease pending;  // deterministic mode
  int* const wg_semaphores = dq_turn_base(pass, b, work.h_first, wg);

  // The LSE (+inf past the sequence end, so those rows get P = 0) and delta
  // rows of an item, (2, kBlockM) values: index wtid + 128 s is row_stat[s].
  // Each item loads the next item's values while its dQ GEMM runs, so the
  // global latency hides; they go to this warpgroup's shared copy it % 2
  // (the LSE in log2 units: converted there, where the load has arrived,
  // not at the load, where the multiply stalled ~2 % of the consumers'
  // samples) after the next item issues its GEMMs. That copy was last read
  // two items before, ahead of that item's dS barrier.
  float row_stat[Traits::kRowStatsPerThread];
  auto load_row_stats = [&](int item_h, int item_m_block) {
    const int item_m0 = item_m_block * kBlockM;
#pragma unroll
    for (int s = 0; s < Traits::kRowStatsPerThread; ++s) {
      const int index = wtid + 128 * s, row = index % kBlockM;
      const bool valid = row < seq.len_q - item_m0;
      if (index < kBlockM)
        row_stat[s] = valid ? params.lse[sm80::row_offset(params.lse_layout, b, seq.q_row0 + item_m0 + row, item_h)]
                            : INFINITY;
      else
        row_stat[s] = valid ? pass.delta[int64_t(item_h) * params.total_q + q_packed0 + item_m0 + row] : 0.0f;
    }
  };
  if (has_items) load_row_stats(h, m_block);

  if (has_items) wait_barrier(&bars->kv_full, 0);
  for (int it = 0; has_items; ++it) {
    const int stage = it & 1;
    const int m0 = m_block * kBlockM, rows = min(kBlockM, seq.len_q - m0);
    wait_barrier(&bars->q_full[stage], (it >> 1) & 1);

    // S^T = K Q^T and dP^T = V dO^T: (64 keys, kBlockM queries) each.
    float acc_s[kBlockM / 2], acc_dp[kBlockM / 2];
    // The K and V descriptors are the same for every item: hoisted out of the
    // loop they would hold 48 registers. An opaque base keeps them computed
    // where they are used.
    uint32_t smem_addr = smem_base;
    asm volatile("" : "+r"(smem_addr));
    const uint32_t sK_addr = smem_addr + Traits::kOffsetK, sV_addr = smem_addr + Traits::kOffsetV;
    const uint32_t q_stage = smem_addr + Traits::kOffsetQ + stage * Traits::kQBytes;
    const uint32_t do_stage = smem_addr + Traits::kOffsetDo + stage * Traits::kQBytes;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      const uint32_t block = (k / 4) * 128, step_bytes = (k % 4) * 32;
      WgmmaSS<T, kBlockM>::run(acc_s, desc_k_major(sK_addr + block * kBlockN + wg * 64 * 128 + step_bytes),
                               desc_k_major(q_stage + block * kBlockM + step_bytes), k > 0 ? 1 : 0);
    }
    wgmma_commit();
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      const uint32_t block = (k / 4) * 128, step_bytes = (k % 4) * 32;
      WgmmaSS<T, kBlockM>::run(acc_dp, desc_k_major(sV_addr + block * kBlockN + wg * 64 * 128 + step_bytes),
                               desc_k_major(do_stage + block * kBlockM + step_bytes), k > 0 ? 1 : 0);
    }
    wgmma_commit();

    // Accumulator element acc[4 j + 2 r + c]: key key_in_tile + 8 r, query 8 j + 2 t + c.
    float* lse = reinterpret_cast<float*>(smem + Traits::kOffsetRowStats) + ((it & 1) * 2 + wg) * 2 * kBlockM;
    float* delta = lse + kBlockM;
#pragma unroll
    for (int s = 0; s < Traits::kRowStatsPerThread; ++s)  // delta follows LSE
      lse[wtid + 128 * s] = wtid + 128 * s < kBlockM ? row_stat[s] * sm80::kLog2e : row_stat[s];
    named_barrier_sync(5 + wg, 128);
    pending.release(wg);  // the previous item's dQ adds of this warpgroup
    const bool masked = !mask.tile_fully_visible(m0, m0 + rows, n0, n0 + kBlockN);
    wgmma_wait<1>();
    fence_registers(acc_s);
    exp_scores<kBlockM>(acc_s, lse, log2_scale, t);
    if (masked) mask_scores<Traits::kMaskDiagonal, kBlockM>(acc_s, mask, m0, n0 + key_in_tile, seq.len_k, t);
    wgmma_wait<0>();
    fence_registers(acc_dp);
    probabilities_to_ds<kBlockM>(acc_s, acc_dp, delta, t);

    // P^T and dS^T as A fragments: k-step kk covers queries [16 kk, 16 kk + 16).
    uint32_t a_p[kBlockM / 16][4], a_ds[kBlockM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        a_p[kk][q] = Pack2<T>::pack(acc_s[8 * kk + 2 * q], acc_s[8 * kk + 2 * q + 1]);
        a_ds[kk][q] = Pack2<T>::pack(acc_dp[8 * kk + 2 * q], acc_dp[8 * kk + 2 * q + 1]);
      }
    // dV += P^T dO, dK += dS^T Q: B rows are queries (K), columns the head dim (N).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      WgmmaRS<T, kNO>::run(acc_dv, a_p[kk], desc_mn_major(do_stage + kk * 16 * 128, kBlockM * 128), 1);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      WgmmaRS<T, kNO>::run(acc_dk, a_ds[kk], desc_mn_major(q_stage + kk * 16 * 128, kBlockM * 128), 1);
    wgmma_commit();

    // dS^T into shared memory for dQ = dS K, in the layout wgmma reads MN-major.
    uint8_t* ds_tile = sDs + (it & 1) * Traits::kDsBytes;
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int key = key_in_tile + 8 * (q & 1), query = 16 * kk + 8 * (q >> 1) + 2 * t;
        *reinterpret_cast<uint32_t*>(ds_tile + swizzled_offset(kBlockN, key, query)) = a_ds[kk][q];
      }
    ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);  // generic writes -> wgmma's async-proxy reads
    named_barrier_sync(1, 256);

    // This warpgroup's (64 queries, 64 columns) block of dQ = dS K over all 128 keys.
    // At hdim 64 the dV / dK products finish first: their register operands
    // (P^T, dS^T: 64 per thread) would not fit next to dQ's accumulators.
    if constexpr (Traits::kDqSplitQueries) {
      wgmma_wait<0>();
      fence_registers(acc_dv);
      fence_registers(acc_dk);
    }
    float acc_dq[32];
    wgmma_fence();
    const uint32_t ds_addr =
        smem_addr + Traits::kOffsetDs + (it & 1) * Traits::kDsBytes + dq_query_block * kBlockN * 128;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      WgmmaSS<T, 64>::template run<1, 1>(acc_dq, desc_mn_major(ds_addr + kk * 16 * 128, kBlockN * 128),
                                         desc_mn_major(sK_addr + dq_col_block * kBlockN * 128 + kk * 16 * 128,
                                                       kBlockN * 128),
                                         kk > 0 ? 1 : 0);
    wgmma_commit();
    DqTurn turn;  // deterministic mode
    if (deterministic)
      turn = DqTurn::begin<!Traits::kMaskDiagonal>(wg_semaphores, pass.m_blocks, items, h - work.h_first, m_block);
    int next_h = h, next_m_block = m_block;
    const bool has_next = items.template next<kDeterministic, !Traits::kMaskDiagonal>(next_h, next_m_block);
    if (has_next) load_row_stats(next_h, next_m_block);
    wgmma_wait<0>();
    fence_registers(acc_dv);
    fence_registers(acc_dk);
    fence_registers(acc_dq);
    if (lane == 0) ::cuda::ptx::mbarrier_arrive(&bars->q_empty[stage]);

    // Accumulator element acc_dq[4 j + 2 r + c]: query 64 dq_query_block + 16 warp + g + 8 r,
    // column 64 dq_col_block + 8 j + 2 t + c. A pointer to each of the
    // thread's two rows makes the column pairs j immediate offsets of the
    // reductions (a 64-bit row product per pair cost ~100 instructions an item).
    const int query0 = dq_query_block * 64 + warp * 16 + g, col0 = dq_col_block * 64 + 2 * t;
    float* dq_row0 = pass.dq_accum + (deterministic ? items.dq_copy(m_block) * pass.dq_copy_floats : 0) +
                     ((q_packed0 + m0 + query0) * pass.heads_per_pass + (h - pass.head_begin)) * kHeadDim + col0;
    float* dq_row1 = dq_row0 + int64_t(pass.heads_per_pass) * (8 * kHeadDim);
    asm volatile("" : "+l"(dq_row0), "+l"(dq_row1));  // whole pointers, not the base added per pair
    // full: the tile has kBlockM rows and D is kHeadDim, so no pair is out
    // of bounds (a bounds predicate per pair became a branch around it).
    auto add_dq = [&](auto full, auto first_adder) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          write_dq_pair((r == 0 ? dq_row0 : dq_row1) + 8 * j, acc_dq[4 * j + 2 * r], acc_dq[4 * j + 2 * r + 1],
                        decltype(full)::value || (query0 + 8 * r < rows && col0 + 8 * j < dim),
                        decltype(first_adder)::value);
    };
    auto add_dq_in_bounds = [&](auto first_adder) {
      if (rows == kBlockM && dim == kHeadDim)
        add_dq(std::true_type{}, first_adder);
      else
        add_dq(std::false_type{}, first_adder);
    };
    if (!deterministic) {
      add_dq_in_bounds(std::false_type{});
    } else {
      // Deterministic: the key tiles of one query tile add in BwdItems' order;
      // the two warpgroups add disjoint blocks.
      turn.wait(pending);
      if (turn.rank == 0)  // released during the next item (DeferredRelease)
        add_dq_in_bounds(std::true_type{});
      else
        add_dq_in_bounds(std::false_type{});
    }
    if (!has_next) break;
    h = next_h;
    m_block = next_m_block;
  }
  pending.release(wg);
  store_dk_dv<T, kNO>(params, seq, b, n0, h_kv, keys, key_in_tile, 0, t, acc_dk, acc_dv);
}

}  // namespace flashattn::sm90
