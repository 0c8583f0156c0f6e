// The sm90 forward's compile-time shape (FwdTraits: tile sizes, consumer
// warpgroups, registers, shared-memory layout) and the small shared helpers of
// its kernels: named barriers and the swizzled offset of a tile element.
#pragma once

#include "common/host_device.hpp"  // FA_HOST_DEVICE

namespace flashattn::sm90 {

// kConsumers_: consumer warpgroups of 64 query rows each. Two everywhere; at
// hdim 64 also three (192-row tiles, FA3's choice there; 160 registers per
// consumer thread still hold S, P and O of 128 keys) or one (64-row tiles,
// two CTAs per SM, so one CTA's start and end overlap the other's GEMMs); at
// hdim 128 also one, with 64-key tiles so that two CTAs fit in shared memory.
template <typename T_, int kHeadDim_, bool kMaskDiagonal_, int kConsumers_ = 2>
struct FwdTraits {
  using T = T_;
  static constexpr int kHeadDim = kHeadDim_;  // 64, 128 or 256: D and Dv padded up to it
  static constexpr bool kMaskDiagonal = kMaskDiagonal_;
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kBlockM = 64 * kConsumers;
  // Registers per consumer thread: S is kBlockN / 2, O kHeadDim / 2, P
  // kBlockN / 4. 128 keys: 64 + 64 + 32 at hdim 128; hdim 256 takes 64 keys
  // (32 + 128 + 16) to stay inside the 240 registers setmaxnreg gives.
  // (FA3's 176 keys at hdim 128, 88 + 64 + 44 registers, ran 5-7 % slower
  // than 128 on the H200: session 15, dev/sm90_log.md.)
  static constexpr int kBlockN = kHeadDim <= 64 || (kHeadDim == 128 && kConsumers_ >= 2) ? 128 : 64;
  static constexpr int kColBlocks = kHeadDim / 64;  // 64-element (128-byte) column blocks per row
  static constexpr int kNO = kHeadDim < 128 ? kHeadDim : 128;  // columns of O per P V instruction
  static constexpr int kOChunks = kHeadDim / kNO;
  // Hdim 64, three consumers: the row sums of P on the tensor cores. P V runs
  // N = 72, V's 64 columns and 8 from a block of ones after the V stages, so
  // each thread's accumulators of columns 64.. hold its rows' sums of P (of P
  // as rounded for the GEMM), scaled with O by every correction: the softmax
  // drops its 64 FADDs per thread and key tile and the compensation, for 12.5 %
  // more P V work. H100, same rounds (session 26): the persistent kernel
  // 1.04-1.09x the old default at 8k-16k, the causal one 1.00-1.04x; with one
  // consumer (64-row tiles, no second warpgroup to cover the longer P V)
  // 0.95-0.98x, so not there.
  static constexpr int kSumColumns = kHeadDim == 64 && kConsumers_ == 3 ? 8 : 0;
  static constexpr int kNPV = kNO + kSumColumns;  // N of one P V instruction
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // setmaxnreg: the register file (64 K) split between the producer warpgroup and the consumers.
  static constexpr int kCtasPerSm = kConsumers == 1 ? 2 : 1;
  static constexpr int kProducerRegisters = kConsumers == 3 ? 32 : 24;
  static constexpr int kConsumerRegisters = kConsumers == 1 ? 232 : kConsumers == 2 ? 240 : 160;
  static_assert(kCtasPerSm * 128 * (kProducerRegisters + kConsumers * kConsumerRegisters) <= 65536, "register file");
  static_assert(kConsumers == 2 || kHeadDim == 64 || (kHeadDim == 128 && kConsumers == 1),
                "three consumers at hdim 64 only, one at hdim 64 and 128");
  static constexpr int kStages = 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;   // (kBlockM, kHeadDim), later O
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // (kBlockN, kHeadDim)
  static constexpr int kOnesBytes = kSumColumns > 0 ? kKVBytes : 0;  // (kBlockN, 64) of ones
  static constexpr int kBarrierBytes = 64;
  static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes + kOnesBytes + kBarrierBytes;
  static_assert(kHeadDim % 64 == 0, "column blocks of 64 elements");
  static_assert(kCtasPerSm * kSmemBytes <= 227 * 1024, "shared memory per SM");
  // The persistent kernel stages O in a buffer of its own (1024-byte aligned
  // after the barriers), as sQ already receives the next tile's Q, where it
  // fits (every class but 256) and without a diagonal mask (the hdim-128
  // persistent diagonal kernel spilled 44 bytes with it in session 15; in
  // session 24 it compiled without spills but ran 0.97-1.02x, so not there).
  static constexpr int kOffsetPersistentO = kQBytes + 2 * kStages * kKVBytes + kOnesBytes + 1024;
  static constexpr int kPersistentSmemBytes = 1024 + kOffsetPersistentO + kQBytes;
  static constexpr bool kPersistentStagesO = kPersistentSmemBytes <= 227 * 1024 && !kMaskDiagonal;
  template <bool kPersistent>
  static constexpr int smem_bytes() {
    return kPersistent && kPersistentStagesO ? kPersistentSmemBytes : kSmemBytes;
  }
};

// How far (log2 units of the scaled score) a key tile's row maximum may rise
// above the row's reference maximum before the reference moves and O is
// rescaled (the softmax in fwd_kernel). A constant: read from the kernel's
// arguments it cost the diagonal-mask kernels up to 160 bytes of spills.
constexpr float kRescaleSlack = 8.0f;

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Byte offset of element (row, col) in a tile of column blocks: block col / 64
// is (rows, 64) with the TMA's 128-byte swizzle.
FA_HOST_DEVICE int swizzled_offset(int rows, int row, int col) {
  const int chunk = (col & 63) >> 3;
  return (col >> 6) * rows * 128 + row * 128 + ((chunk ^ (row & 7)) << 4) + (col & 7) * 2;
}

}  // namespace flashattn::sm90
