// FlashAttention forward for sm_90a: TMA loads, wgmma, warp specialization.
//
// A CTA works on (query tile, head, sequence) tiles of 128 rows (192 with three
// consumers, hdim 64): one per CTA, or, persistent, a sequence of them
// (tile_scheduler.cuh). One producer and two or three consumer warpgroups:
//   warpgroup 0 (producer): one thread issues the TMA loads of each tile's Q
//     and of its K and V tiles into two stages each, completing on mbarriers;
//     it gives its registers away (setmaxnreg) and waits for nothing but free
//     buffers. The K/V stage and phase counters run on across tiles, and Q has
//     its own full/empty pair, so the next tile's loads start while the
//     consumers finish the current one;
//   warpgroups 1, 2 (, 3) (consumers): 64 query rows each. Per key tile:
//     S = Q K^T (wgmma, both from shared memory), release K; mask, online
//     softmax in the accumulator registers; P converts to A fragments in
//     registers; O += P V (wgmma, V transposed by the instruction), release V.
// Semantics (masks, softcap, ALiBi, LSE, varlen) are the sm80 kernel's; only
// dropout stays on the sm80 path (the dispatcher routes it there).
#pragma once

#include <cuda/ptx>

#include "cuda/sm80/kernel_traits.cuh"  // SequenceBounds, ScoreTransform, exp2_approx, Pack2
#include "cuda/sm90/fwd_producer.cuh"
#include "cuda/sm90/fwd_traits.cuh"
#include "cuda/sm90/tile_scheduler.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashattn::sm90 {

using sm80::exp2_approx;
using sm80::kLn2;
using sm80::make_score_transform;
using sm80::Pack2;
using sm80::row_offset;
using sm80::ScoreTransform;
using sm80::sequence_bounds;
using sm80::SequenceBounds;

// kExtras: softcap or ALiBi present (dropout never reaches this kernel).
// kSchedule of the consumers: 1 = GEMMs and softmax of a warpgroup in turn;
// 2 = the softmax of tile j overlaps the P V of tile j - 1; 3 = 2 plus
// ping-pong: the two warpgroups take turns issuing their GEMMs (named
// barriers), so one's softmax runs while the other's GEMMs occupy the tensor cores.
// kPersistent: the CTA loops over tiles (tile_scheduler.cuh); the launcher
// builds it for the plain kernels under schedules 2 and 3 only (softcap and
// ALiBi run v1, which stays one tile per CTA).
template <class Traits, bool kExtras, int kSchedule, bool kPersistent>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kCtasPerSm)
    fwd_kernel(const __grid_constant__ FwdKernelArgs args) {
  using T = typename Traits::T;
  using Scheduler = FwdTileScheduler<kPersistent, Traits::kMaskDiagonal>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int kNTilesS = kBlockN / 8;  // n8 column groups of S per thread row
  constexpr int kNO = Traits::kNO, kOChunks = Traits::kOChunks, kNPV = Traits::kNPV;
  constexpr bool kSumOnTensorCores = Traits::kSumColumns > 0;
  const FwdParams& params = args.params;

  extern __shared__ unsigned char smem_raw[];
  // TMA's 128-byte swizzle and the wgmma descriptors assume 1024-byte aligned tiles.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sQ = smem;                                      // kColBlocks x (kBlockM, 64)
  uint8_t* sK = sQ + Traits::kQBytes;                      // kStages x kColBlocks x (kBlockN, 64)
  uint8_t* sV = sK + Traits::kStages * Traits::kKVBytes;   // kStages x kColBlocks x (kBlockN, 64)
  uint8_t* sOnes = sV + Traits::kStages * Traits::kKVBytes;  // (kBlockN, 64) of ones where kSumOnTensorCores
  Barriers* bars = reinterpret_cast<Barriers*>(sOnes + Traits::kOnesBytes);
  // Where the epilogue stages O: this warpgroup's rows of sQ (one tile per
  // CTA), a buffer of its own (persistent), or nowhere (persistent, class 256:
  // stored from the accumulators).
  constexpr bool kStageO = !kPersistent || Traits::kPersistentStagesO;
  uint8_t* sO = kPersistent ? smem + Traits::kOffsetPersistentO : sQ;

  const int tid = threadIdx.x;
  if constexpr (!kPersistent) {  // the whole CTA leaves before any barrier exists
    const FwdTile tile = Scheduler::tile(args.order, 0);
    if (tile.m_block * kBlockM >= sequence_bounds(params, tile.b).len_q) return;
  }

  if (tid == 0) {
    ::cuda::ptx::mbarrier_init(&bars->q_full, 1);
    constexpr int kConsumerWarps = 4 * Traits::kConsumers;  // one arrival per consumer warp
    ::cuda::ptx::mbarrier_init(&bars->q_empty, kConsumerWarps);
    for (int s = 0; s < 2; ++s) {
      ::cuda::ptx::mbarrier_init(&bars->k_full[s], 1);
      ::cuda::ptx::mbarrier_init(&bars->v_full[s], 1);
      ::cuda::ptx::mbarrier_init(&bars->k_empty[s], kConsumerWarps);
      ::cuda::ptx::mbarrier_init(&bars->v_empty[s], kConsumerWarps);
    }
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  if constexpr (kSumOnTensorCores) {
    const uint32_t one = Pack2<T>::pack(1.0f, 1.0f);
    for (int i = tid; i < Traits::kOnesBytes / 16; i += Traits::kThreads)
      reinterpret_cast<uint4*>(sOnes)[i] = make_uint4(one, one, one, one);
    ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);  // generic writes -> wgmma's async-proxy reads
  }
  __syncthreads();

  const int warpgroup = tid / 128;
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Traits::kProducerRegisters) : "memory");
    if (tid == 0) produce<Traits, Scheduler>(args, sQ, sK, sV, bars);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Traits::kConsumerRegisters) : "memory");

  // Dense kernels: the consumer index is read through a shuffle from lane 0, so that the compiler
  // knows it is the same in every lane and keeps sQ's address and the wgmma descriptors in uniform
  // registers, and each wgmma's descriptor is its tile start's plus an offset (desc_advance), one
  // add where building it anew took a mask, shifts and an or, for Q in vector registers moved
  // over before every wgmma (ncu, session 25: ~90 of the 518 instructions per warp and key tile
  // at hdim 128). H100, same rounds: dense hdim 128 +2-4 % at 4k-16k in 18 of 18 cells (three
  // passes), hdim 256 +2-4 % and hdim 64 0.98-1.02x at 4k-16k (one pass); the diagonal kernels
  // with it 0.97-1.01x (causal 4k 0.97-0.99x), so they keep both as they were.
  constexpr bool kUniformOperands = !Traits::kMaskDiagonal;
  // Consumer wg: tile rows [64 wg, 64 wg + 64).
  const int wg = kUniformOperands ? __shfl_sync(0xffffffffu, warpgroup - 1, 0) : warpgroup - 1;
  const int wtid = tid % 128, lane = tid & 31, warp = wtid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row_in_tile = wg * 64 + warp * 16 + g;  // + 8 r for the second row of the thread
  const int dim_v = static_cast<int>(params.head_dim_v);
  // Shared-memory addresses of the wgmma operands (sQ: this warpgroup's rows).
  // Held across the tile loop at hdim <= 128, derived per tile at hdim 256:
  // so no persistent kernel spills under ptxas 13.0; the other way round the
  // hdim-128 causal one spilled 28 bytes and the hdim-256 causal one 8 (in
  // its key-tile loop).
  struct SmemAddresses {
    uint32_t q, k, v;
  };
  auto operand_addresses = [&] {
    return SmemAddresses{static_cast<uint32_t>(__cvta_generic_to_shared(sQ)) + wg * 64 * 128,
                         static_cast<uint32_t>(__cvta_generic_to_shared(sK)),
                         static_cast<uint32_t>(__cvta_generic_to_shared(sV))};
  };
  const SmemAddresses hoisted_addresses = operand_addresses();
  constexpr bool kOverlap = kSchedule >= 2, kPingPong = kSchedule == 3;
  // The conditional rescale (the softmax below), where it measured faster: the
  // dense v2 / v3 kernels (H200, session 15: +2-6 % at 8k-16k), the hdim-256
  // diagonal one (+3-8 %, and its 52 bytes of spills gone) and, since the
  // masked tiles' bounds became 32-bit (session 16), the hdim-128 diagonal ones
  // (H100, session 24, same rounds: one tile per CTA +8-12 % at 16k causal,
  // 0 spills; in session 15 they had run 2-9 % slower with it). The hdim-64 diagonal
  // kernels still lose with it (session 24: 0.95-1.02x, up to 68 bytes of
  // spills), and the v1 (softcap/ALiBi) ones spilled up to 236 bytes more.
  constexpr bool kConditionalRescale = kOverlap && (!Traits::kMaskDiagonal || kHeadDim >= 128);
  // Key tiles consumed so far (stage it % 2, phase (it / 2) % 2) and Q tiles
  // so far (phase q_it % 2): both run on across the CTA's tiles, as the producer's.
  int it = 0, q_it = 0;

  for (int tile_index = Scheduler::first(); Scheduler::valid(args.order, tile_index);
       tile_index = Scheduler::next(tile_index)) {
    const FwdTile tile = Scheduler::tile(args.order, tile_index);
    const SequenceBounds seq = sequence_bounds(params, tile.b);
    const int m0 = tile.m_block * kBlockM;
    if (m0 >= seq.len_q) continue;  // a varlen tile past its sequence
    const int rows = min(kBlockM, seq.len_q - m0);
    const int h = tile.h, b = tile.b;
    const MaskPolicy mask = tile_mask(params, seq);
    const KeyBlockRange keys = key_block_range<kBlockN>(mask, m0, rows);
    const int n_block_min = keys.first, n_block_max = keys.last;
    // The output rows of the tile, formed where they are written (two 64-bit
    // pointers held through the key loop cost the hdim-128 causal kernel spills).
    auto o_rows = [&] { return static_cast<T*>(params.o) + row_offset(params.o_layout, b, seq.q_row0 + m0, h); };
    auto lse_rows = [&] {
      return params.lse == nullptr ? nullptr : params.lse + row_offset(params.lse_layout, b, seq.q_row0 + m0, h);
    };
    const int wg_row_begin = wg * 64, wg_row_end = min(wg * 64 + 64, rows);

    if (keys.empty) {  // no row of the tile sees a key: O = 0, LSE = +inf
      T* o_tile = o_rows();
      float* lse_tile = lse_rows();
      for (int i = wtid; i < max(wg_row_end - wg_row_begin, 0) * (dim_v / 8); i += 128) {
        const int row = wg_row_begin + i / (dim_v / 8), col = (i % (dim_v / 8)) * 8;
        *reinterpret_cast<uint4*>(o_tile + row * params.o_layout.row + col) = make_uint4(0, 0, 0, 0);
      }
      if (lse_tile != nullptr)
        for (int row = wg_row_begin + wtid; row < wg_row_end; row += 128)
          lse_tile[row * params.lse_layout.row] = __int_as_float(0x7f800000);
      continue;
    }

    const ScoreTransform transform = make_score_transform(params, b, h);
    const float log2_scale = transform.log2_scale();
    // The keys each of this thread's two rows sees, [row_key_begin, row_key_end),
    // and the key tiles every row of the tile sees whole, [visible_first,
    // visible_end): 32-bit values fixed for the tile, in place of the 64-bit mask
    // in the key-tile loop (sequence lengths are int, so the clamped bounds are too).
    int row_key_begin[2], row_key_end[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = m0 + row_in_tile + 8 * r;
      row_key_begin[r] = static_cast<int>(min(mask.key_begin(i), int64_t(seq.len_k)));
      row_key_end[r] = static_cast<int>(max(mask.key_end(i + 1), int64_t(0)));
    }
    const MaskPolicy::TileRange whole_tiles = mask.fully_visible_key_tiles(m0, m0 + rows, kBlockN);
    const int visible_first = static_cast<int>(min(whole_tiles.first, int64_t(n_block_max)));
    const int visible_end = static_cast<int>(whole_tiles.end);
    const SmemAddresses smem_addresses = kHeadDim <= 128 ? hoisted_addresses : operand_addresses();
    const uint32_t sQ_addr = smem_addresses.q, sK_addr = smem_addresses.k, sV_addr = smem_addresses.v;
    // (64, kHeadDim) of this warpgroup, chunks of kNO columns (and the row sums after them).
    float acc_o[kOChunks][kNPV / 2];
#pragma unroll
    for (int c = 0; c < kOChunks; ++c)
#pragma unroll
      for (int i = 0; i < kNPV / 2; ++i) acc_o[c][i] = 0.0f;
    // Same invariant as the sm80 kernel: row_max is the max of the row's scores
    // so far (kernel units), acc_o and row_sum (Kahan-compensated by row_error;
    // unused where kSumOnTensorCores) are sums of exp2((s - row_max) * log2_scale).
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f}, row_error[2] = {0.0f, 0.0f};

    wait_barrier(&bars->q_full, q_it & 1);

    // The pieces of one key tile. S = Q K^T of stage `stage` into acc_s (issued, not waited).
    auto issue_s = [&](float (&acc_s)[kBlockN / 2], int stage) {
      const uint64_t q_start = desc_k_major(sQ_addr), k_start = desc_k_major(sK_addr + stage * Traits::kKVBytes);
#pragma unroll
      for (int k = 0; k < kHeadDim / 16; ++k) {
        const uint32_t block = (k / 4) * 128, step_bytes = (k % 4) * 32;
        const uint32_t q_offset = block * kBlockM + step_bytes, k_offset = block * kBlockN + step_bytes;
        if constexpr (kUniformOperands) {
          WgmmaSS<T, kBlockN>::run(acc_s, desc_advance(q_start, q_offset), desc_advance(k_start, k_offset),
                                   k > 0 ? 1 : 0);
        } else {
          WgmmaSS<T, kBlockN>::run(acc_s, desc_k_major(sQ_addr + q_offset),
                                   desc_k_major(sK_addr + stage * Traits::kKVBytes + k_offset), k > 0 ? 1 : 0);
        }
      }
      wgmma_commit();
    };
    uint32_t a_p[kBlockN / 16][4];  // P of the last softmax as A fragments (64, kBlockN)
    // O += P V of stage `stage` (issued, not waited).
    auto issue_pv = [&](int stage) {
      // The leading offset is the distance to the operand's next 64-column
      // block: V's next column block, kBlockN * 128 bytes on; with the sums
      // (hdim 64, one column block of V) the block of ones after the stages.
      const uint32_t v_stage = sV_addr + stage * Traits::kKVBytes;
      const uint32_t leading_bytes =
          kSumOnTensorCores ? (Traits::kStages - stage) * Traits::kKVBytes : kBlockN * 128;
      const uint64_t v_start = desc_mn_major(v_stage, leading_bytes);
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
        for (int c = 0; c < kOChunks; ++c) {
          // Keys 16 kk.. are rows 16 kk.. of every column block; chunk c starts at
          // column block c * kNO / 64; column blocks are kBlockN * 128 bytes apart.
          const uint32_t offset = kk * 16 * 128 + (c * kNO / 64) * kBlockN * 128;
          const uint64_t desc_v =
              kUniformOperands ? desc_advance(v_start, offset) : desc_mn_major(v_stage + offset, leading_bytes);
          WgmmaRS<T, kNPV>::run(acc_o[c], a_p[kk], desc_v, 1);
        }
      }
      wgmma_commit();
    };
    // Score transform, mask and online softmax of one tile: acc_s becomes P
    // (fp32, relative to the new row_max); returns each row's correction
    // exp2((old max - new max) * log2_scale) for O, which the caller applies
    // once no P V is in flight.
    // row_max is a reference, not necessarily the running maximum: it moves
    // only when the tile's maximum exceeds it by more than kRescaleSlack (scaled,
    // log2 units), so after the first tiles most corrections are exactly 1 and
    // the warp skips the rescale of O (its FMULs sat between the wait for P V
    // and the next GEMMs). O and row_sum share the reference, so O / row_sum and
    // the LSE are the same quantities; P's entries stay below 2^kRescaleSlack
    // (256), far inside fp16 and the fp32 sums. Only where kConditionalRescale.
    auto softmax = [&](float (&acc_s)[kBlockN / 2], int n0, bool masked, float (&correction)[2]) {
      if (kExtras || masked) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // The row's visible keys as offsets from this thread's first column
          // (n0 + 2 t), clamped to the tile: each element is two 32-bit compares
          // with a constant (mask.visible per element, with 64-bit indices, cost
          // the 3-consumer hdim-64 diagonal kernel 80 bytes of spills).
          const int column0 = n0 + 2 * t;
          const int first_visible = min(max(row_key_begin[r] - column0, 0), kBlockN);
          const int end_visible = min(max(row_key_end[r] - column0, 0), kBlockN);
#pragma unroll
          for (int ni = 0; ni < kNTilesS; ++ni) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              float& s = acc_s[ni * 4 + r * 2 + c];
              if constexpr (kExtras) s = transform.apply(s, mask, m0 + row_in_tile + 8 * r, column0 + ni * 8 + c);
              const int offset = ni * 8 + c;
              if (masked && (offset < first_visible || offset >= end_visible)) s = -INFINITY;
            }
          }
        }
      }
      // Row maxima over four interleaved partial maxima per row, both rows at
      // once: dependent chains of kNTilesS / 2 + 2 instead of kNTilesS * 2,
      // which ran ahead of every exponential (v8, dev/sm90_log.md).
      // At hdim 256 (64-key tiles, the softmax a small share) the extra live
      // values cost spills: one chain there.
      constexpr int kPartials = kHeadDim <= 128 ? 4 : 1;
      float tile_max[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float partial[kPartials];
#pragma unroll
        for (int e = 0; e < 2 * kNTilesS; ++e) {  // element e of the row: n8 group e / 2, column e % 2
          const float s = acc_s[(e / 2) * 4 + r * 2 + e % 2];
          partial[e % kPartials] = e < kPartials ? s : fmaxf(partial[e % kPartials], s);
        }
        tile_max[r] = partial[0];
#pragma unroll
        for (int p = 1; p < kPartials; ++p) tile_max[r] = fmaxf(tile_max[r], partial[p]);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
#pragma unroll
      for (int r = 0; r < 2; ++r) tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // NaN (both -inf: no key seen yet) and +inf (first visible key) move the reference.
        const bool keep_reference = kConditionalRescale && (tile_max[r] - row_max[r]) * log2_scale <= kRescaleSlack;
        const float new_max = keep_reference ? row_max[r] : fmaxf(row_max[r], tile_max[r]);
        // A row that has seen only masked keys keeps row_max = -inf: offset 0, p = 0.
        const float safe_max = new_max == -INFINITY ? 0.0f : new_max;
        const float offset = safe_max * log2_scale;
        // The difference first, so an unchanged max rescales by exactly 1 (see the
        // sm80 forward: as old * c - offset the FFMA leaves a factor 1 +- 1e-7 that
        // compounds over the key tiles).
        correction[r] = exp2_approx((row_max[r] - safe_max) * log2_scale);
        row_max[r] = new_max;
        float sum[2] = {0.0f, 0.0f};  // two partial sums: half the dependent chain
#pragma unroll
        for (int ni = 0; ni < kNTilesS; ++ni) {
          float& p0 = acc_s[ni * 4 + r * 2];
          float& p1 = acc_s[ni * 4 + r * 2 + 1];
          p0 = exp2_approx(p0 * log2_scale - offset);
          p1 = exp2_approx(p1 * log2_scale - offset);
          if constexpr (!kSumOnTensorCores) sum[ni & 1] += p0 + p1;
        }
        if constexpr (!kSumOnTensorCores) {  // (else P V adds the row sums)
          row_sum[r] *= correction[r];
          row_error[r] *= correction[r];
          const float addend = (sum[0] + sum[1]) - row_error[r];
          const float total = row_sum[r] + addend;
          row_error[r] = (total - row_sum[r]) - addend;
          row_sum[r] = total;
        }
      }
    };
    auto rescale_o = [&](const float (&correction)[2]) {
      const bool unchanged = correction[0] == 1.0f && correction[1] == 1.0f;
      if (kConditionalRescale && __all_sync(0xffffffffu, unchanged)) return;
#pragma unroll
      for (int c = 0; c < kOChunks; ++c)
#pragma unroll
        for (int nj = 0; nj < kNPV / 8; ++nj)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            acc_o[c][nj * 4 + r * 2] *= correction[r];
            acc_o[c][nj * 4 + r * 2 + 1] *= correction[r];
          }
    };
    // P as A fragments: k-step kk covers keys [16 kk, 16 kk + 16), i.e. the n8
    // groups 2 kk and 2 kk + 1 of the accumulator.
    auto convert_p = [&](const float (&acc_s)[kBlockN / 2]) {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        a_p[kk][0] = Pack2<T>::pack(acc_s[8 * kk + 0], acc_s[8 * kk + 1]);
        a_p[kk][1] = Pack2<T>::pack(acc_s[8 * kk + 2], acc_s[8 * kk + 3]);
        a_p[kk][2] = Pack2<T>::pack(acc_s[8 * kk + 4], acc_s[8 * kk + 5]);
        a_p[kk][3] = Pack2<T>::pack(acc_s[8 * kk + 6], acc_s[8 * kk + 7]);
      }
    };
    auto release = [&](uint64_t* barrier) {
      if (lane == 0) ::cuda::ptx::mbarrier_arrive(barrier);
    };

    // Ping-pong turns, round robin: warpgroup wg waits on barrier kTurnBarrier + wg,
    // then lets the next one go (arrive on the next one's barrier). The last
    // warpgroup opens the first turn and skips its last arrive, so every barrier
    // sees as many arrivals as waits. Barriers 1 .. kConsumers are the epilogue's.
    constexpr int kTurnBarrier = 1 + Traits::kConsumers, kLastConsumer = Traits::kConsumers - 1;
    auto turn_begin = [&] {
      if (kPingPong) asm volatile("bar.sync %0, 256;\n" ::"r"(kTurnBarrier + wg) : "memory");
    };
    auto turn_end = [&](bool last) {
      const int next = wg == kLastConsumer ? 0 : wg + 1;
      if (kPingPong && !(last && wg == kLastConsumer))
        asm volatile("bar.arrive %0, 256;\n" ::"r"(kTurnBarrier + next) : "memory");
    };
    if (kPingPong && wg == kLastConsumer) asm volatile("bar.arrive %0, 256;\n" ::"r"(kTurnBarrier) : "memory");
    int pv_stage = 0;  // kOverlap: stage of the V tile whose P waits in a_p
    uint32_t pv_parity = 0;
    auto step = [&](int n_block, auto masked) {
      const int stage = it & 1;
      const uint32_t parity = (it >> 1) & 1;
      ++it;
      float acc_s[kBlockN / 2];  // (64, kBlockN): S of this warpgroup
      float correction[2];
      wait_barrier(&bars->k_full[stage], parity);
      if (kOverlap) {
        wait_barrier(&bars->v_full[pv_stage], pv_parity);
        turn_begin();
      }
      wgmma_fence();
      issue_s(acc_s, stage);
      if (!kOverlap) {
        // v1: every wgmma waited for at once; softmax and GEMMs of a warpgroup alternate.
        wgmma_wait<0>();
        fence_registers(acc_s);
        release(&bars->k_empty[stage]);
        softmax(acc_s, n_block * kBlockN, decltype(masked)::value, correction);
        rescale_o(correction);
        convert_p(acc_s);
        wait_barrier(&bars->v_full[stage], parity);
        wgmma_fence();
        issue_pv(stage);
        wgmma_wait<0>();
#pragma unroll
        for (int c = 0; c < kOChunks; ++c) fence_registers(acc_o[c]);
        release(&bars->v_empty[stage]);
      } else {
        // v2: O += P(j-1) V(j-1) runs on the tensor cores while the softmax of
        // S(j) runs on the ALUs; O is rescaled once that P V has landed. The
        // first tile (no P V before it) is peeled off below: a branch here
        // makes ptxas serialize the wgmmas (C7515).
        issue_pv(pv_stage);
        turn_end(false);
        wgmma_wait<1>();
        fence_registers(acc_s);
        release(&bars->k_empty[stage]);
        softmax(acc_s, n_block * kBlockN, decltype(masked)::value, correction);
        wgmma_wait<0>();
#pragma unroll
        for (int c = 0; c < kOChunks; ++c) fence_registers(acc_o[c]);
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) fence_registers(a_p[kk]);
        release(&bars->v_empty[pv_stage]);
        rescale_o(correction);
        convert_p(acc_s);
        pv_stage = stage;
        pv_parity = parity;
      }
    };
    // v2's first tile: S and softmax only (O is still zero, nothing to rescale).
    auto first_step = [&](int n_block, auto masked) {
      const int stage = it & 1;
      const uint32_t parity = (it >> 1) & 1;
      ++it;
      float acc_s[kBlockN / 2];
      float correction[2];
      wait_barrier(&bars->k_full[stage], parity);
      turn_begin();
      wgmma_fence();
      issue_s(acc_s, stage);
      turn_end(false);
      wgmma_wait<0>();
      fence_registers(acc_s);
      release(&bars->k_empty[stage]);
      softmax(acc_s, n_block * kBlockN, decltype(masked)::value, correction);
      convert_p(acc_s);
      pv_stage = stage;
      pv_parity = parity;
    };

    // Trip counts of the masking policy, as in the sm80 kernel: masked tiles at
    // the diagonal or the sequence end, unmasked ones in the middle, masked ones
    // at the left edge of a sliding window. The producer visits the same order.
    auto visible_tile = [&](int n_block) { return n_block >= visible_first && n_block < visible_end; };
    int n_block = n_block_max - 1;
    if (kOverlap) {
      if (visible_tile(n_block))
        first_step(n_block, std::false_type{});
      else
        first_step(n_block, std::true_type{});
      --n_block;
    }
    // Without a diagonal mask only the last key tile (the sequence's end) can
    // be partial, and v2 / v3 peeled it above: no masked loop is compiled.
    constexpr bool kMaskedSteps = Traits::kMaskDiagonal || !kOverlap;
    if constexpr (kMaskedSteps)
      for (; n_block >= n_block_min && !visible_tile(n_block); --n_block) step(n_block, std::true_type{});
    for (; n_block >= n_block_min && (!kMaskedSteps || visible_tile(n_block)); --n_block)
      step(n_block, std::false_type{});
    if constexpr (Traits::kMaskDiagonal)
      for (; n_block >= n_block_min; --n_block) step(n_block, std::true_type{});
    // Every S GEMM of the tile has completed: the producer may load the next
    // tile's Q while the last P V and the epilogue run.
    if constexpr (kPersistent) release(&bars->q_empty);
    ++q_it;
    if constexpr (kOverlap) {  // the last tile's P V
      wait_barrier(&bars->v_full[pv_stage], pv_parity);
      turn_begin();
      wgmma_fence();
      issue_pv(pv_stage);
      turn_end(true);
      wgmma_wait<0>();
#pragma unroll
      for (int c = 0; c < kOChunks; ++c) fence_registers(acc_o[c]);
      release(&bars->v_empty[pv_stage]);
    }

    // Epilogue: 1 / row_sum and LSE per row, then O. One tile per CTA: O goes
    // into this warpgroup's own rows of sQ (its last wgmma read of Q is
    // complete), then out in 16-byte coalesced stores of the rows inside the
    // sequence. Persistent: the same through sO (sQ already receives the next
    // tile's Q), after the warpgroup's previous copy-out has read it; at class
    // 256, where no sO fits, straight from the accumulators (each quad of
    // threads writes 16 contiguous bytes of a row; the quads of a warp fill
    // whole 32-byte sectors over two consecutive n8 groups).
    T* o_tile = o_rows();
    float* lse_tile = lse_rows();
    if constexpr (kPersistent && kStageO) named_barrier_sync(1 + wg, 128);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum;
      if constexpr (kSumOnTensorCores) {
        sum = acc_o[0][(kNO / 8) * 4 + r * 2];  // (row, column kNO + 2 t): the whole row's sum
      } else {
        sum = row_sum[r] - row_error[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      }
      const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int row = row_in_tile + 8 * r;
#pragma unroll
      for (int c = 0; c < kOChunks; ++c)
#pragma unroll
        for (int nj = 0; nj < kNO / 8; ++nj) {
          const int col = c * kNO + nj * 8 + 2 * t;
          const uint32_t packed = Pack2<T>::pack(acc_o[c][nj * 4 + r * 2] * inverse, acc_o[c][nj * 4 + r * 2 + 1] * inverse);
          if constexpr (!kStageO) {
            if (row < rows && col < dim_v)
              *reinterpret_cast<uint32_t*>(o_tile + row * params.o_layout.row + col) = packed;
          } else {
            *reinterpret_cast<uint32_t*>(sO + swizzled_offset(kBlockM, row, col)) = packed;
          }
        }
      if (lse_tile != nullptr && t == 0 && row < rows) {
        const float offset = row_max[r] == -INFINITY ? 0.0f : row_max[r] * log2_scale;
        lse_tile[row * params.lse_layout.row] = sum > 0.0f ? (offset + __log2f(sum)) * kLn2 : INFINITY;
      }
    }
    if constexpr (kStageO) {
      named_barrier_sync(1 + wg, 128);
      constexpr int kChunksPerRow = kHeadDim / 8;
      for (int i = wtid; i < max(wg_row_end - wg_row_begin, 0) * kChunksPerRow; i += 128) {
        const int row = wg_row_begin + i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
        if (col < dim_v)
          *reinterpret_cast<uint4*>(o_tile + row * params.o_layout.row + col) =
              *reinterpret_cast<const uint4*>(sO + swizzled_offset(kBlockM, row, col));
      }
    }
  }
}

}  // namespace flashattn::sm90
