// read_floor.cu's ring with dynamic shares: whether keys handed out at run time close the spread between the
// blocks' ends that dev/decode_timeline.py measured (at B = 1 32k on an H100 the last block drains ~8 us after
// the first, with the DRAM under-used meanwhile).
//
// Each block walks a static range of its head's keys (a fraction of an even share), as ring_head_rows walks its
// split; then its warps take chunks of kChunkSlabs slabs of the rest of the head's keys (the pool) from a counter
// of the head, so that blocks whose SMs draw more of the DRAM's bandwidth read more of the pool. The counter needs
// no zeroing: the call's tag sits in its high 32 bits. Block 0 of the head sets (tag, 0) at its entry; a warp's
// atomic add that returns another tag (it came first) or a count past the pool takes nothing more. So a stale
// word (an earlier call's, or this call's from the previous replay of a graph, whose count is past the pool) hands
// out no chunk, every pool chunk goes to exactly one warp, and block 0 alone would take them all. A warp asks first
// once its first slab has landed, by when block 0 has set the word unless it started that much later than the rest.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/sm80/mma.cuh"  // cp_async_16 and the commit and wait of cp.async groups
#include "read_floor_timing.cuh"  // READ_FLOOR_CHECK

namespace read_floor {

constexpr int kSlabKeys = 16, kRowChunks = 16;
constexpr int kSlabCopies = kSlabKeys * kRowChunks / 32;   // a lane's copies per slab and tensor
constexpr int kStageVectors = 2 * kSlabKeys * kRowChunks;  // (2, kSlabKeys, kRowChunks) 16-byte vectors

// Copies slab `key0` (kSlabKeys rows of K and of V of one head, rows `heads` chunks-rows apart) into `stage`:
// lane (r, c) = (lane / 8, lane % 8) copies chunk c of each 128-byte line of rows r, r + 4, r + 8, r + 12.
__device__ __forceinline__ void copy_slab(uint4* stage, const uint4* __restrict__ k, const uint4* __restrict__ v,
                                          int64_t key0, int heads, int head, int lane) {
#pragma unroll
  for (int i = 0; i < kSlabCopies; ++i) {
    const int row = lane / 8 + 4 * (i / 2), chunk = i % 2 * 8 + lane % 8;
    const int64_t chunk_index = ((key0 + row) * heads + head) * kRowChunks + chunk;
    flashattn::sm80::cp_async_16(stage + i * 32 + lane, k + chunk_index, true);
    flashattn::sm80::cp_async_16(stage + (kSlabCopies + i) * 32 + lane, v + chunk_index, true);
  }
}

// Grid (splits, heads), 4 warps of kStages stages of 8 KiB each, as ring_head_rows<kStages, kPlainEntry>.
// Keys [x * static_keys, (x + 1) * static_keys) of block x first (a multiple of kSlabKeys), then pool chunks
// c = 0 .. pool_chunks - 1: keys pool_begin + c * kChunkSlabs * kSlabKeys onwards, below `keys`.
template <int kStages, int kChunkSlabs>
__global__ void __launch_bounds__(256) ring_steal_rows(const uint4* __restrict__ k, const uint4* __restrict__ v,
                                                       int64_t keys, int64_t static_keys, int64_t pool_begin,
                                                       uint32_t pool_chunks, unsigned long long* counters,
                                                       uint32_t tag, uint32_t* __restrict__ sink) {
  extern __shared__ uint4 ring[];  // (warps, kStages, kStageVectors)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int heads = gridDim.y, head = blockIdx.y;
  unsigned long long* counter = counters + head;
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicExch(counter, static_cast<unsigned long long>(tag) << 32);

  const int64_t begin = blockIdx.x * static_keys;
  const int static_slabs = static_cast<int>(static_keys / kSlabKeys);
  const int static_steps = static_slabs > warp ? (static_slabs - warp + warps - 1) / warps : 0;
  // The slabs the warp copies, in order: its static steps, then its chunks. The ticket for the next chunk (lane
  // 0's atomic result) is asked for a chunk ahead of its use (kChunkSlabs static steps before their end, or
  // once the first slab has landed), so its round trip overlaps copies.
  int step = 0, chunk_left = 0;
  int64_t chunk_key = 0;
  bool asked = false, exhausted = false;
  unsigned long long ticket = 0;
  auto ask = [&] {
    if (lane == 0) ticket = atomicAdd(counter, 1ull);
    asked = true;
  };
  auto next_key = [&]() -> int64_t {
    if (step < static_steps) return begin + (int64_t{step++} * warps + warp) * kSlabKeys;
    for (;;) {  // twice at most: the pool's last chunk may end early
      if (chunk_left == 0) {
        if (exhausted) return -1;
        if (!asked) ask();  // the static steps ended before the first slab landed: the round trip waits here
        const unsigned long long taken = __shfl_sync(0xffffffffu, ticket, 0);
        const uint32_t chunk = static_cast<uint32_t>(taken);
        if (static_cast<uint32_t>(taken >> 32) != tag || chunk >= pool_chunks) {
          exhausted = true;
          return -1;
        }
        chunk_key = pool_begin + int64_t{chunk} * kChunkSlabs * kSlabKeys;
        chunk_left = kChunkSlabs;
        ask();
      }
      --chunk_left;
      const int64_t key0 = chunk_key;
      chunk_key += kSlabKeys;
      if (key0 + kSlabKeys <= keys) return key0;
      chunk_left = 0;
    }
  };

  uint4* stages = ring + warp * kStages * kStageVectors;
  uint32_t folded = 0;
  int issued = 0;  // slab i goes to stage i % kStages, issued at turn i - kStages + 1 and read at turn i
#pragma unroll 1
  for (int n = 1 - kStages;; ++n) {
    __syncwarp();
    const int64_t key0 = next_key();
    if (key0 >= 0) copy_slab(stages + issued++ % kStages * kStageVectors, k, v, key0, heads, head, lane);
    flashattn::sm80::cp_async_commit();
    if (n < 0) continue;
    if (n >= issued) break;
    flashattn::sm80::cp_async_wait<kStages - 1>();
    __syncwarp();
    folded ^= stages[n % kStages * kStageVectors + lane].x;
    if (!asked && step >= static_steps - kChunkSlabs) ask();
  }
  for (int offset = 16; offset > 0; offset /= 2) folded ^= __shfl_xor_sync(0xffffffffu, folded, offset);
  if (lane == 0) sink[(int64_t{head} * gridDim.x + blockIdx.x) * warps + warp] = folded;
}

// The XOR of the sink's first `words` words (zeroed first) after `launch` and a synchronize: on random data, the same
// for two kernels that each read every slab once, whichever warps read which.
template <typename Launch>
uint32_t folded_reads(uint32_t* sink, int words, cudaStream_t stream, Launch launch) {
  std::vector<uint32_t> host(words);
  READ_FLOOR_CHECK(cudaMemsetAsync(sink, 0, sizeof(uint32_t) * words, stream));
  launch();
  READ_FLOOR_CHECK(cudaGetLastError());
  READ_FLOOR_CHECK(cudaMemcpyAsync(host.data(), sink, sizeof(uint32_t) * words, cudaMemcpyDeviceToHost, stream));
  READ_FLOOR_CHECK(cudaStreamSynchronize(stream));
  uint32_t folded = 0;
  for (uint32_t word : host) folded ^= word;
  return folded;
}

}  // namespace read_floor
