// Tile sizes of every sm80 kernel, from one constexpr function per pass, and
// the per-sequence bookkeeping (varlen bounds, int64 row offsets) they share.
#pragma once

#include <cstdint>

#include "common/mask.hpp"
#include "common/params.hpp"
#include "cuda/sm80/mma.cuh"
#include "cuda/tile_config.hpp"

namespace flashattn::sm80 {

using cuda::BwdTileConfig;
using cuda::FwdTileConfig;
using cuda::bwd_tile_config;
using cuda::fwd_tile_config;

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// What a kernel computes beyond plain attention: a template argument chosen at
// launch, so that each variant gets its own register allocation and no
// per-element code for options it does not use.
//   kNone          no softcap, ALiBi or dropout
//   kOptions       softcap, ALiBi or dropout, the dropout keys read from the
//                  kernel parameters where they are used
//   kSeedInMemory  the same, the keys made from {seed, offset} in device memory
//                  (dropout_rng_state; see DropoutKeys). A variant of its own:
//                  as two copies of the main loop in one kernel, both ran
//                  fwd+bwd at 0.74-0.93x of the previous build (H100, session
//                  46); apart, kNone and kOptions compile to the same SASS.
enum class Extras { kNone, kOptions, kSeedInMemory };

// Where a kernel finds its dropout keys in the main loop. kOptions: in the
// kernel parameters, read where they are used. kSeedInMemory: made from
// {seed, offset} in device memory before the loop, then kept
//   kShared = true   in shared memory, read by each iteration after its first
//                    barrier, so that they take registers only while the mask
//                    is drawn. Held in registers across the loop, the hdim-128
//                    dense forward spilled 1,272 B and ran at 0.86x of the
//                    by-value kernel (H100, session 46).
//   kShared = false  in registers: the diagonal forwards, which do not spill
//                    with them, ran 10-16 % slower reading shared memory (H100,
//                    session 47).
template <Extras kVariant, bool kShared>
class DropoutKeys {
 public:
  // Before the loop's first barrier.
  __device__ __forceinline__ DropoutKeys(const DropoutConfig& from_params, int tid) : from_params_(from_params) {
    if constexpr (kVariant == Extras::kSeedInMemory && kShared) {
      __shared__ uint32_t words[3];  // key0, key1, offset_word
      shared_ = words;
      if (tid == 0) {
        const DropoutConfig resolved = resolve_dropout_keys(from_params);
        words[0] = resolved.key0, words[1] = resolved.key1, words[2] = resolved.offset_word;
      }
    } else if constexpr (kVariant == Extras::kSeedInMemory) {
      resolved_ = resolve_dropout_keys(from_params);
    }
  }

  // The config of one iteration, after its first barrier: a reference to the
  // parameters or the registers, or a copy with the shared keys.
  __device__ __forceinline__ decltype(auto) config() const {
    if constexpr (kVariant != Extras::kSeedInMemory) {
      return (from_params_);
    } else if constexpr (kShared) {
      DropoutConfig config = from_params_;
      config.key0 = shared_[0], config.key1 = shared_[1], config.offset_word = shared_[2];
      config.rng_state = nullptr;
      return config;
    } else {
      return (resolved_);
    }
  }

 private:
  const DropoutConfig& from_params_;
  const uint32_t* shared_ = nullptr;
  DropoutConfig resolved_;
};

// Where sequence b starts and how long it is. Dense: rows start at 0 and the
// batch stride moves between sequences; varlen: cu_seqlens (device memory)
// give the first row and the batch stride is 0.
struct SequenceBounds {
  int64_t q_row0 = 0, k_row0 = 0;
  int len_q = 0, len_k = 0;
};

__device__ __forceinline__ SequenceBounds sequence_bounds(const AttnParams& params, int b) {
  SequenceBounds seq;
  if (params.is_varlen) {
    const int q0 = params.cu_seqlens_q[b], q1 = params.cu_seqlens_q[b + 1];
    const int k0 = params.cu_seqlens_k[b], k1 = params.cu_seqlens_k[b + 1];
    seq.q_row0 = q0;
    seq.k_row0 = k0;
    seq.len_q = q1 - q0;
    seq.len_k = k1 - k0;
  } else {
    seq.len_q = static_cast<int>(params.seqlen_q);
    seq.len_k = static_cast<int>(params.seqlen_k);
  }
  return seq;
}

__device__ __forceinline__ int64_t row_offset(const TensorLayout& layout, int b, int64_t row, int h) {
  return b * layout.batch + row * layout.row + static_cast<int64_t>(h) * layout.head;
}

// Asynchronous copy of rows [0, rows_valid) x cols [0, cols_valid) of a
// (Tile::kRows, Tile::kCols) global tile into shared memory; everything else
// of the tile becomes zero (padding of the head dimension, rows past the end).
// Each thread copies one column chunk of every kRowStep-th row: the swizzle of
// its chunk is the same in all of them (kRowStep is a multiple of 8), so the
// shared addresses are one base plus constants and the global address one
// running pointer: no per-row address registers stay live around the GEMMs.
template <class Tile, int kThreads, typename T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t row_stride, int rows_valid,
                                                int cols_valid, int tid) {
  constexpr int kChunksPerRow = Tile::kCols / 8;
  constexpr int kRowStep = kThreads / kChunksPerRow;
  if constexpr (kThreads % kChunksPerRow == 0 && kRowStep % 8 == 0) {
    const int row0 = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
    T* dst = smem + Tile::offset(row0, col);
    const T* src = gmem + row0 * row_stride + col;
    const bool col_valid = col < cols_valid;
#pragma unroll
    for (int r = 0; r < Tile::kRows; r += kRowStep) {
      const bool valid = col_valid && row0 + r < rows_valid;
      cp_async_16(dst + r * Tile::kCols, valid ? src : gmem, valid);
      src += kRowStep * row_stride;
    }
  } else {  // rows of a width that does not divide the block (head-dim class 192)
#pragma unroll
    for (int i = tid; i < Tile::kRows * kChunksPerRow; i += kThreads) {
      const int row = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
      const bool valid = row < rows_valid && col < cols_valid;
      cp_async_16(smem + Tile::offset(row, col), valid ? gmem + row * row_stride + col : gmem, valid);
    }
  }
}

// Shared -> global copy of rows [row_begin, row_end) (tile coordinates) and cols [0, cols_valid).
template <class Tile, typename T>
__device__ __forceinline__ void store_tile(T* gmem, int64_t row_stride, const T* smem, int row_begin, int row_end,
                                           int cols_valid, int tid, int threads) {
  constexpr int kChunksPerRow = Tile::kCols / 8;
  const int chunks = (row_end - row_begin) * kChunksPerRow;
  for (int i = tid; i < chunks; i += threads) {
    const int row = row_begin + i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
    if (col < cols_valid)
      *reinterpret_cast<uint4*>(gmem + row * row_stride + col) =
          *reinterpret_cast<const uint4*>(smem + Tile::offset(row, col));
  }
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The score transform shared by forward and backward: softcap then ALiBi, in
// natural units. Without either the kernels skip it and fold the scale into
// the exp2 argument instead.
struct ScoreTransform {
  float scale = 1.0f, softcap = 0.0f, alibi_slope = 0.0f;
  bool active = false;  // softcap or ALiBi present

  __device__ __forceinline__ float apply(float qk, const MaskPolicy& mask, int64_t i, int64_t j) const {
    float s = softcap > 0.0f ? softcap * tanhf(qk * (scale / softcap)) : qk * scale;
    if (alibi_slope != 0.0f) s -= alibi_slope * mask.alibi_distance(i, j);
    return s;
  }
  // The factor that turns a kernel score into log2 units.
  __device__ __forceinline__ float log2_scale() const { return active ? kLog2e : scale * kLog2e; }
};

__device__ __forceinline__ ScoreTransform make_score_transform(const AttnParams& params, int b, int h) {
  ScoreTransform transform;
  transform.scale = params.softmax_scale;
  transform.softcap = params.softcap;
  if (params.alibi_slopes != nullptr) transform.alibi_slope = params.alibi_slopes[b * params.alibi_batch_stride + h];
  transform.active = params.softcap > 0.0f || params.alibi_slopes != nullptr;
  return transform;
}

}  // namespace flashattn::sm80
