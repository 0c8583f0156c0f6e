// What a kernel that only reads can reach on this GPU, per call, for the byte counts of the decode table's cells.
//
// Issue 6 asks a decode call to read its K/V at >= 85 % of a device-to-device copy's bandwidth (4 GiB, bytes read +
// written per second). This times kernels that do nothing but read one buffer and fold it into a few words, as
// bench_decode.py times a decode call: a CUDA graph of back-to-back calls, each on its own copy of the buffer (at
// least 8 copies and 4x the L2 in all, so no call finds its bytes in the L2), a warm-up of 0.2 s of GPU time, then
// the median of interleaved rounds. Three kinds of kernel:
//  * contiguous chunks over 1, 2 or 4 times as many blocks as SMs (more blocks than SMs the hardware balances
//    between SMs as they finish; where registers allow fewer blocks per SM, they run in waves);
//  * "head rows": the decode kernel's grid and pattern, a block per (split, kv head) reading its head's 256-byte
//    rows of K and V with plain loads;
//  * "ring": the same through the decode kernel's cp.async ring (4 warps of 3 stages of 16 keys), without math.
// Also timed: some of them with a one-block kernel after each read (a combine's node), and a copy of half the bytes
// (the same DRAM traffic). The default set builds the ring up toward a decode call (the library's combine kernel
// after it, early launches, the cache length read on the device, Q staged), on constant and on random data;
// --sweep runs session 33's grids and depths instead.
//
//   nvcc -O3 -std=c++17 -I src -I include -gencode=arch=compute_90a,code=sm_90a bench/gpu/read_floor.cu -o read_floor
//   ./read_floor [--sweep] [--json out.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/decode/kvcache_kernel.cuh"  // the combine kernel and the early-launch controls of the decode kernels
#include "cuda/sm80/mma.cuh"               // the library's cp.async wrappers, which the decode kernel's copies match
#include "read_floor_steal.cuh"             // the ring with dynamic shares, and the ring's slab copies
#include "read_floor_timing.cuh"            // the copy, the graphs' timing, READ_FLOOR_CHECK

namespace {

using read_floor::capture, read_floor::copy_bandwidth_gbps, read_floor::copy_vectors, read_floor::fill_random,
    read_floor::time_interleaved;

// Each block reads one contiguous chunk of `vectors_per_block` 16-byte vectors, as a split reads its keys: every
// thread keeps kUnroll loads (__ldg: the buffer is read-only) in flight, blockDim.x * kUnroll * 16 bytes a block.
// Without __launch_bounds__ ptxas kept 32 registers and only 4 of 16 loads in flight. The XOR of everything read
// goes to one word per warp, so no load is dead.
template <int kUnroll>
__global__ void __launch_bounds__(512, 1) read_chunks(const uint4* __restrict__ src, int64_t vectors,
                                                      int64_t vectors_per_block, uint32_t* __restrict__ sink) {
  const int64_t begin = blockIdx.x * vectors_per_block;
  const int64_t end = begin + vectors_per_block < vectors ? begin + vectors_per_block : vectors;
  const int64_t step = int64_t{blockDim.x} * kUnroll;
  uint32_t folded = 0;
  int64_t base = begin + threadIdx.x;
  // Whole steps without predicates, so that all kUnroll loads are issued before the first use.
  for (; base + (kUnroll - 1) * int64_t{blockDim.x} < end; base += step) {
    uint4 loaded[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) loaded[u] = __ldg(src + base + int64_t{u} * blockDim.x);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) folded ^= loaded[u].x ^ loaded[u].y ^ loaded[u].z ^ loaded[u].w;
  }
  for (; base < end; base += blockDim.x) {
    const uint4 loaded = __ldg(src + base);
    folded ^= loaded.x ^ loaded.y ^ loaded.z ^ loaded.w;
  }
  for (int offset = 16; offset > 0; offset /= 2) folded ^= __shfl_xor_sync(0xffffffffu, folded, offset);
  if (threadIdx.x % 32 == 0) sink[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = folded;
}

// The decode kernel's pattern: a block per (split, kv head), the split fastest as in its grid, reads its head's
// 256-byte rows of K and of V, (keys, heads, 128) bf16 each, so its rows lie heads * 256 bytes apart. A thread holds
// one 16-byte chunk of kUnroll rows of each tensor in flight (blockDim.x / 16 * kUnroll * 512 bytes a block).
template <int kUnroll>
__global__ void __launch_bounds__(512, 1) read_head_rows(const uint4* __restrict__ k, const uint4* __restrict__ v,
                                                         int64_t keys, int64_t keys_per_split,
                                                         uint32_t* __restrict__ sink) {
  constexpr int kRowChunks = 16;  // (128 bf16) / (16-byte chunks)
  const int heads = gridDim.y, head = blockIdx.y;
  const int rows_per_load = blockDim.x / kRowChunks;
  const int64_t begin = blockIdx.x * keys_per_split;
  const int64_t end = begin + keys_per_split < keys ? begin + keys_per_split : keys;
  auto chunk_of = [&](int64_t key) { return (key * heads + head) * kRowChunks + threadIdx.x % kRowChunks; };
  uint32_t folded = 0;
  int64_t key = begin + threadIdx.x / kRowChunks;
  for (; key + (kUnroll - 1) * int64_t{rows_per_load} < end; key += int64_t{rows_per_load} * kUnroll) {
    uint4 k_rows[kUnroll], v_rows[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      k_rows[u] = __ldg(k + chunk_of(key + int64_t{u} * rows_per_load));
      v_rows[u] = __ldg(v + chunk_of(key + int64_t{u} * rows_per_load));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      folded ^= k_rows[u].x ^ k_rows[u].y ^ k_rows[u].z ^ k_rows[u].w ^ v_rows[u].x ^ v_rows[u].y ^ v_rows[u].z ^
                v_rows[u].w;
  }
  for (; key < end; key += rows_per_load) {
    const uint4 k_row = __ldg(k + chunk_of(key)), v_row = __ldg(v + chunk_of(key));
    folded ^= k_row.x ^ k_row.y ^ k_row.z ^ k_row.w ^ v_row.x ^ v_row.y ^ v_row.z ^ v_row.w;
  }
  for (int offset = 16; offset > 0; offset /= 2) folded ^= __shfl_xor_sync(0xffffffffu, folded, offset);
  if (threadIdx.x % 32 == 0)
    sink[(int64_t{head} * gridDim.x + blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32] = folded;
}

// The decode kernel's ring without its math: each warp streams every (blockDim.x / 32)-th slab of 16 keys of its
// split through a private ring of kStages stages of 8 KiB (K then V), by cp.async.cg, kStages - 1 slabs in flight
// while it "computes" a slab, which here is one shared-memory read. Lane (r, c) = (lane / 8, lane % 8) copies chunk
// c of each 128-byte line of rows r, r + 4, r + 8, r + 12, as the contiguous walk does.
// kEntry adds what the decode kernel does around its ring, one step at a time:
//   kPlainEntry   the keys and the split come from the arguments;
//   kEarlyLaunch  launched early (programmatic dependent launch, as every decode kernel): griddepcontrol.wait at
//                 the entry, and the next grid allowed at turn 0, where the decode kernel allows its combine;
//   kDecodeEntry  kEarlyLaunch, and the key count read from a cache_seqlens word in global memory after the wait,
//                 with the split's range derived from it, and the block's 4 query rows (1 KiB) loaded at the entry
//                 and staged in shared memory at turn 0 behind a block barrier, as the decode kernel stages Q.
enum RingEntry { kPlainEntry, kEarlyLaunch, kDecodeEntry };
using read_floor::kRowChunks, read_floor::kSlabKeys, read_floor::kStageVectors;

template <int kStages, RingEntry kEntry>
__global__ void __launch_bounds__(256) ring_head_rows(const uint4* __restrict__ k, const uint4* __restrict__ v,
                                                      int64_t keys_arg, int64_t keys_per_split_arg,
                                                      const int32_t* __restrict__ seqlens,
                                                      const uint4* __restrict__ query, uint32_t* __restrict__ sink) {
  extern __shared__ uint4 ring[];  // (warps, kStages, kStageVectors), then the staged query rows (64 vectors)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int heads = gridDim.y, head = blockIdx.y;
  if constexpr (kEntry != kPlainEntry) flashattn::cuda::decode::wait_for_prerequisite_grids();
  int64_t keys = keys_arg, keys_per_split = keys_per_split_arg;
  constexpr int kQueryVectors = 4 * kRowChunks;  // 4 query rows of the kv head (H / Hkv = 4)
  uint4 query_vector = make_uint4(0, 0, 0, 0);
  if constexpr (kEntry == kDecodeEntry) {
    keys = __ldg(seqlens);
    if (threadIdx.x < kQueryVectors) query_vector = __ldg(query + head * kQueryVectors + threadIdx.x);
    keys_per_split = (keys / kSlabKeys + gridDim.x - 1) / gridDim.x * kSlabKeys;
  }
  const int64_t begin = blockIdx.x * keys_per_split;
  const int64_t end = begin + keys_per_split < keys ? begin + keys_per_split : keys;
  const int slabs = end > begin ? static_cast<int>((end - begin) / kSlabKeys) : 0;  // whole slabs here
  const int steps = slabs > warp ? (slabs - warp + warps - 1) / warps : 0;
  uint4* stages = ring + warp * kStages * kStageVectors;
  auto issue = [&](int step) {
    read_floor::copy_slab(stages + step % kStages * kStageVectors, k, v,
                          begin + (int64_t{step} * warps + warp) * kSlabKeys, heads, head, lane);
  };
  uint32_t folded = 0;
  const int turns = kEntry == kPlainEntry ? steps : (steps > 0 ? steps : 1);  // every warp reaches turn 0
#pragma unroll 1
  for (int n = 1 - kStages; n < turns; ++n) {
    __syncwarp();
    const int fill = n + kStages - 1;
    if (fill < steps) issue(fill);
    flashattn::sm80::cp_async_commit();
    if (n < 0) continue;
    if (kEntry != kPlainEntry && n == 0) {
      flashattn::cuda::decode::allow_dependent_grids();
      if constexpr (kEntry == kDecodeEntry) {
        uint4* staged = ring + warps * kStages * kStageVectors;
        if (threadIdx.x < kQueryVectors) staged[threadIdx.x] = query_vector;
        __syncthreads();
        folded ^= staged[lane].x;
      }
    }
    if (n >= steps) break;
    flashattn::sm80::cp_async_wait<kStages - 1>();
    __syncwarp();
    folded ^= stages[n % kStages * kStageVectors + lane].x;
  }
  for (int offset = 16; offset > 0; offset /= 2) folded ^= __shfl_xor_sync(0xffffffffu, folded, offset);
  if (lane == 0) sink[(int64_t{head} * gridDim.x + blockIdx.x) * warps + warp] = folded;
}


// The node a split-KV call adds after its split kernel: one small block that depends on it.
__global__ void one_block(uint32_t* sink) { sink[threadIdx.x] += 1; }


// What follows the read in a call: nothing, the one-block node, or the library's own combine kernel merging the
// splits' partials (B = 1, Hkv = 8, 4 query rows a kv head: 32 blocks), as a split decode call's second node.
enum class Node { kNone, kOneBlock, kCombine };

struct Variant {
  std::string name;
  int threads;
  int unroll;
  int blocks_per_sm;     // read_chunks: gridDim.x = SMs * blocks_per_sm
  Node node = Node::kNone;
  int head_splits = 0;   // read_head_rows: gridDim = (head_splits, kHeads); 0: read_chunks
  int ring_stages = 0;   // with head_splits: ring_head_rows with this many stages
  RingEntry entry = kPlainEntry;
  bool random_data = false;  // read buffers of random words, else of the constant byte 0x5a
  bool uncovered = false;    // timed without the spin ahead of the start event (replay_ms)
  int static_percent = 0;    // > 0: ring_steal_rows, with this share of the keys walked statically
  int chunk_slabs = 1;       // ring_steal_rows: slabs a pool chunk
};

size_t ring_bytes(const Variant& variant) {
  return size_t{16} * kStageVectors * variant.ring_stages * (variant.threads / 32) + 16 * 4 * kRowChunks;
}

constexpr int kHeads = 8;  // kv heads of the decode table's cells

// The combine's arguments and buffers: partials of up to kMaxSplits splits, filled once with finite values.
struct CombineNode {
  flashattn::KvCacheParams params;
  float* o_partial = nullptr;
  float* lse_partial = nullptr;
  static constexpr int kRowsPadded = 16, kDim = 128, kMaxSplits = 64;

  void allocate(cudaStream_t stream) {
    const int64_t rows = int64_t{kMaxSplits} * kHeads * kRowsPadded;
    READ_FLOOR_CHECK(cudaMalloc(&o_partial, sizeof(float) * rows * kDim));
    READ_FLOOR_CHECK(cudaMalloc(&lse_partial, sizeof(float) * rows));
    fill_random<<<256, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(o_partial), rows * kDim, 7);
    READ_FLOOR_CHECK(cudaGetLastError());
    READ_FLOOR_CHECK(cudaMemsetAsync(lse_partial, 0, sizeof(float) * rows, stream));
    void* out;
    READ_FLOOR_CHECK(cudaMalloc(&out, 2 * 4 * kHeads * kDim));
    params.dtype = FA_DTYPE_BF16;
    params.batch = 1;
    params.heads = 4 * kHeads;
    params.heads_kv = kHeads;
    params.head_dim = params.head_dim_v = kDim;
    params.seqlen_q = 1;
    params.o = out;
    params.o_layout = {4 * kHeads * kDim, 4 * kHeads * kDim, kDim};
  }
  void release() {
    READ_FLOOR_CHECK(cudaFree(o_partial));
    READ_FLOOR_CHECK(cudaFree(lse_partial));
    READ_FLOOR_CHECK(cudaFree(params.o));
  }
};

// The library's launch (kvcache_launch.hpp), early or in plain stream order as the variant asks.
template <typename... Params, typename... Args>
void launch(bool early, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args... args) {
  READ_FLOOR_CHECK(flashattn::cuda::decode::launch_maybe_early(early, kernel, grid, block, smem, stream, args...));
}

template <int kStages>
void launch_ring(const Variant& variant, const uint4* k, const uint4* v, int64_t keys, int64_t per_split,
                 const int32_t* seqlens, const uint4* query, uint32_t* sink, cudaStream_t stream) {
  const auto kernel = variant.entry == kPlainEntry    ? ring_head_rows<kStages, kPlainEntry>
                      : variant.entry == kEarlyLaunch ? ring_head_rows<kStages, kEarlyLaunch>
                                                      : ring_head_rows<kStages, kDecodeEntry>;
  launch(variant.entry != kPlainEntry, kernel, dim3(variant.head_splits, kHeads), variant.threads,
         ring_bytes(variant), stream, k, v, keys, per_split, seqlens, query, sink);
}

// Buffers a call may use besides the one it reads.
struct CallContext {
  const int32_t* seqlens;  // the cell's key count, as cache_seqlens
  const uint4* query;
  uint32_t* sink;
  CombineNode* combine;
  unsigned long long* steal_counters;  // one a head
};

// The ring with dynamic shares (read_floor_steal.cuh), each launch with its own tag (a graph's replays reuse theirs).
void launch_steal(const Variant& variant, const uint4* k, const uint4* v, int64_t keys, const CallContext& context,
                  cudaStream_t stream) {
  static uint32_t launches = 0;
  const int splits = variant.head_splits;
  const int64_t static_keys = keys * variant.static_percent / 100 / splits / kSlabKeys * kSlabKeys;
  const int64_t pool_begin = static_keys * splits, chunk_keys = int64_t{variant.chunk_slabs} * kSlabKeys;
  const auto pool_chunks = static_cast<uint32_t>((keys - pool_begin + chunk_keys - 1) / chunk_keys);
  const auto kernel = variant.chunk_slabs == 1 ? read_floor::ring_steal_rows<3, 1> : read_floor::ring_steal_rows<3, 2>;
  kernel<<<dim3(splits, kHeads), variant.threads, ring_bytes(variant), stream>>>(
      k, v, keys, static_keys, pool_begin, pool_chunks, context.steal_counters, 0x5eed0000u + ++launches, context.sink);
}

void launch_call(const Variant& variant, int blocks, const uint4* src, int64_t vectors, const CallContext& context,
                 cudaStream_t stream) {
  uint32_t* sink = context.sink;
  if (variant.head_splits > 0) {
    // The first half of the buffer is K, the second V: (keys, kHeads, 16 chunks) each.
    const int64_t keys = vectors / 2 / (kHeads * 16);
    const int64_t per_split = (keys + variant.head_splits - 1) / variant.head_splits;
    const dim3 grid(variant.head_splits, kHeads);
    const uint4* v = src + vectors / 2;
    if (variant.static_percent > 0)
      launch_steal(variant, src, v, keys, context, stream);
    else if (variant.ring_stages == 3)
      launch_ring<3>(variant, src, v, keys, per_split, context.seqlens, context.query, sink, stream);
    else if (variant.ring_stages == 4)
      launch_ring<4>(variant, src, v, keys, per_split, context.seqlens, context.query, sink, stream);
    else if (variant.unroll == 16)
      read_head_rows<16><<<grid, variant.threads, 0, stream>>>(src, v, keys, per_split, sink);
    else if (variant.unroll == 4)
      read_head_rows<4><<<grid, variant.threads, 0, stream>>>(src, v, keys, per_split, sink);
    else
      read_head_rows<8><<<grid, variant.threads, 0, stream>>>(src, v, keys, per_split, sink);
  } else {
    const int64_t per_block = (vectors + blocks - 1) / blocks;
    switch (variant.unroll) {
      case 4: read_chunks<4><<<blocks, variant.threads, 0, stream>>>(src, vectors, per_block, sink); break;
      case 8: read_chunks<8><<<blocks, variant.threads, 0, stream>>>(src, vectors, per_block, sink); break;
      default: read_chunks<16><<<blocks, variant.threads, 0, stream>>>(src, vectors, per_block, sink); break;
    }
  }
  READ_FLOOR_CHECK(cudaGetLastError());
  if (variant.node == Node::kOneBlock) {
    one_block<<<1, 32, 0, stream>>>(sink);
    READ_FLOOR_CHECK(cudaGetLastError());
  } else if (variant.node == Node::kCombine) {
    const CombineNode& combine = *context.combine;
    launch(variant.entry != kPlainEntry, flashattn::cuda::decode::combine_kernel<__nv_bfloat16, CombineNode::kDim>,
           dim3(4 * kHeads), dim3(flashattn::cuda::decode::kCombineThreads), 0, stream, combine.params,
           combine.o_partial, combine.lse_partial, variant.head_splits, CombineNode::kRowsPadded);
  }
}


// The variants of session 33: contiguous chunks, head rows and the ring over grids and depths (--sweep).
std::vector<Variant> sweep_variants() {
  std::vector<Variant> variants;
  for (int threads : {256, 512})
    for (int unroll : {4, 8, 16})
      for (int per_sm : {1, 2, 4})
        variants.push_back({std::to_string(threads) + "t x" + std::to_string(unroll) + ", " +
                                std::to_string(per_sm) + " x SMs blocks",
                            threads, unroll, per_sm});
  variants.push_back({"512t x8, SMs blocks + 1-block node", 512, 8, 1, Node::kOneBlock});
  variants.push_back({"256t x8, 4 x SMs + 1-block node", 256, 8, 4, Node::kOneBlock});
  for (int threads : {256, 512})
    for (int splits : {16, 33, 66})
      variants.push_back({"head rows " + std::to_string(threads) + "t x" + std::to_string(threads == 256 ? 8 : 4) +
                              ", " + std::to_string(splits) + " x 8 blocks",
                          threads, threads == 256 ? 8 : 4, 0, Node::kNone, splits});
  variants.push_back({"head rows 256t x8, 16 x 8 + 1-block", 256, 8, 0, Node::kOneBlock, 16});
  variants.push_back({"head rows 128t x16, 16 x 8 blocks", 128, 16, 0, Node::kNone, 16});
  variants.push_back({"ring 4w x3 stages, 16 x 8 blocks", 128, 0, 0, Node::kNone, 16, 3});
  variants.push_back({"ring 4w x4 stages, 16 x 8 blocks", 128, 0, 0, Node::kNone, 16, 4});
  variants.push_back({"ring 8w x3 stages, 16 x 8 blocks", 256, 0, 0, Node::kNone, 16, 3});
  variants.push_back({"ring 4w x3 stages, 32 x 8 blocks", 128, 0, 0, Node::kNone, 32, 3});
  variants.push_back({"ring 4w x3, 16 x 8 + 1-block", 128, 0, 0, Node::kOneBlock, 16, 3});
  return variants;
}

// The default set: the decode kernel's ring (4 warps x 3 stages, 16 splits x 8 heads, the grid of B = 1) built up
// toward a decode call one step at a time, on constant and on random data.
std::vector<Variant> decode_variants() {
  std::vector<Variant> variants;
  for (bool random_data : {false, true}) {
    const std::string data = random_data ? ", random" : ", constant";
    variants.push_back({"head rows 512t x4" + data, 512, 4, 0, Node::kNone, 16, 0, kPlainEntry, random_data});
    variants.push_back({"ring" + data, 128, 0, 0, Node::kNone, 16, 3, kPlainEntry, random_data});
    variants.push_back({"ring + 1-block" + data, 128, 0, 0, Node::kOneBlock, 16, 3, kPlainEntry, random_data});
  }
  variants.push_back({"ring + combine, random", 128, 0, 0, Node::kCombine, 16, 3, kPlainEntry, true});
  variants.push_back({"ring + combine, early launch, random", 128, 0, 0, Node::kCombine, 16, 3, kEarlyLaunch, true});
  variants.push_back({"ring + combine, decode entry, random", 128, 0, 0, Node::kCombine, 16, 3, kDecodeEntry, true});
  variants.push_back({"the same, host's launch latency in", 128, 0, 0, Node::kCombine, 16, 3, kDecodeEntry, true, true});
  variants.push_back({"512t x4, 2 x SMs blocks, random", 512, 4, 2, Node::kNone, 0, 0, kPlainEntry, true});
  for (auto [percent, slabs] : {std::pair{75, 1}, {75, 2}, {50, 1}, {90, 1}})
    variants.push_back({"ring, " + std::to_string(100 - percent) + " % stolen in " + std::to_string(slabs) +
                            "-slab chunks, random", 128, 0, 0, Node::kNone, 16, 3, kPlainEntry, true, false, percent,
                        slabs});
  return variants;
}

struct Cell {
  const char* name;  // the decode cells with these K/V bytes (Hkv = 8, D = 128, bf16)
  int64_t bytes;
};

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  bool sweep = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--json" && i + 1 < argc) json_path = argv[++i];
    if (std::string(argv[i]) == "--sweep") sweep = true;
  }

  cudaDeviceProp props;
  READ_FLOOR_CHECK(cudaGetDeviceProperties(&props, 0));
  const int sms = props.multiProcessorCount;
  cudaStream_t stream;
  READ_FLOOR_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbps = copy_bandwidth_gbps(stream, sms, false);
  const double random_copy_gbps = copy_bandwidth_gbps(stream, sms, true);
  std::printf("%s, %d SMs, L2 %d MiB; device-to-device copy of 4 GiB (read + write): %.0f GB/s of constant bytes, "
              "%.0f GB/s of random words\n",
              props.name, sms, props.l2CacheSize >> 20, copy_gbps, random_copy_gbps);

  const std::vector<Variant> variants = sweep ? sweep_variants() : decode_variants();
  const Cell cells[] = {{"B=1 4k", int64_t{2} * 4096 * 8 * 128 * 2},
                        {"B=1 32k, B=8 4k", int64_t{2} * 32768 * 8 * 128 * 2},
                        {"B=1 128k, B=8 16k", int64_t{2} * 131072 * 8 * 128 * 2},
                        {"B=8 32k", int64_t{2} * 8 * 32768 * 8 * 128 * 2}};
  const int max_blocks = sms * 4;
  for (auto kernel : {ring_head_rows<3, kPlainEntry>, ring_head_rows<3, kEarlyLaunch>, ring_head_rows<3, kDecodeEntry>,
                      ring_head_rows<4, kPlainEntry>, ring_head_rows<4, kEarlyLaunch>, ring_head_rows<4, kDecodeEntry>})
    READ_FLOOR_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 196608));
  for (auto kernel : {read_floor::ring_steal_rows<3, 1>, read_floor::ring_steal_rows<3, 2>})
    READ_FLOOR_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 196608));
  CallContext context{};
  READ_FLOOR_CHECK(cudaMalloc(&context.sink, sizeof(uint32_t) * max_blocks * 16 * 8));
  int32_t* seqlens;
  uint4* query;
  READ_FLOOR_CHECK(cudaMalloc(&seqlens, sizeof(int32_t)));
  READ_FLOOR_CHECK(cudaMalloc(&query, 16 * 4 * kHeads * kRowChunks));
  READ_FLOOR_CHECK(cudaMemset(query, 0x3c, 16 * 4 * kHeads * kRowChunks));
  CombineNode combine;
  combine.allocate(stream);
  context.seqlens = seqlens;
  context.query = query;
  context.combine = &combine;
  READ_FLOOR_CHECK(cudaMalloc(&context.steal_counters, sizeof(unsigned long long) * kHeads));
  READ_FLOOR_CHECK(cudaMemset(context.steal_counters, 0xff, sizeof(unsigned long long) * kHeads));

  FILE* json = json_path ? std::fopen(json_path, "w") : nullptr;
  if (json) std::fprintf(json, "{\"gpu\": \"%s\", \"sms\": %d, \"copy_GBps\": %.1f, \"random_copy_GBps\": %.1f, "
                         "\"cells\": [", props.name, sms, copy_gbps, random_copy_gbps);
  for (size_t c = 0; c < sizeof(cells) / sizeof(cells[0]); ++c) {
    const Cell& cell = cells[c];
    const int copies = static_cast<int>(std::max<int64_t>(8, (4 * int64_t{props.l2CacheSize} + cell.bytes - 1) /
                                                                   cell.bytes));
    const int64_t vectors = cell.bytes / 16;
    const int32_t keys = static_cast<int32_t>(vectors / 2 / (kHeads * kRowChunks));
    READ_FLOOR_CHECK(cudaMemcpy(seqlens, &keys, sizeof(keys), cudaMemcpyHostToDevice));
    // buffers[random][copy]
    std::vector<void*> buffers[2] = {std::vector<void*>(copies), std::vector<void*>(copies)};
    for (int random = 0; random < 2; ++random)
      for (int i = 0; i < copies; ++i) {
        READ_FLOOR_CHECK(cudaMalloc(&buffers[random][i], cell.bytes));
        if (random) {
          fill_random<<<sms * 8, 256, 0, stream>>>(static_cast<uint32_t*>(buffers[random][i]), cell.bytes / 4, 100 + i);
          READ_FLOOR_CHECK(cudaGetLastError());
        } else {
          READ_FLOOR_CHECK(cudaMemsetAsync(buffers[random][i], 0x5a, cell.bytes, stream));
        }
      }
    READ_FLOOR_CHECK(cudaStreamSynchronize(stream));
    for (const Variant& variant : variants) {  // the dynamic shares read what the ring reads
      if (variant.static_percent == 0) continue;
      Variant ring = variant;
      ring.static_percent = 0;
      const auto* buffer = static_cast<const uint4*>(buffers[1][0]);
      auto folded = [&](const Variant& which) {
        return read_floor::folded_reads(context.sink, variant.head_splits * kHeads * variant.threads / 32, stream,
                                        [&] { launch_call(which, 0, buffer, vectors, context, stream); });
      };
      const uint32_t expected = folded(ring), got = folded(variant);
      if (got != expected || expected == 0) {
        std::fprintf(stderr, "%s, %s: folded reads %08x, the ring's %08x\n", cell.name, variant.name.c_str(), got,
                     expected);
        return 1;
      }
    }
    std::vector<cudaGraphExec_t> graphs;
    for (const Variant& variant : variants)
      graphs.push_back(capture(stream, [&] {
        for (void* buffer : buffers[variant.random_data])
          launch_call(variant, sms * variant.blocks_per_sm, static_cast<const uint4*>(buffer), vectors, context,
                      stream);
      }));
    // A copy of half the bytes moves as many through the DRAM as a read of all of them.
    std::vector<void*> halves(copies);
    for (void*& half : halves) READ_FLOOR_CHECK(cudaMalloc(&half, cell.bytes / 2));
    std::vector<std::string> names;
    std::vector<bool> uncovered;
    for (const Variant& variant : variants) {
      names.push_back(variant.name);
      uncovered.push_back(variant.uncovered);
    }
    for (int random = 0; random < 2; ++random) {
      names.push_back(random ? "copy of half the bytes, random" : "copy of half the bytes, constant");
      graphs.push_back(capture(stream, [&] {
        for (int i = 0; i < copies; ++i)
          copy_vectors<<<sms * 4, 512, 0, stream>>>(static_cast<const uint4*>(buffers[random][i]),
                                                    static_cast<uint4*>(halves[i]), cell.bytes / 2 / 16);
      }));
    }
    const std::vector<double> us = time_interleaved(graphs, copies, 15, stream, uncovered);

    std::printf("\n%s: %.1f MB a call, %d copies; us a call, %% of the copy's bandwidth (constant bytes)\n", cell.name,
                cell.bytes / 1e6, copies);
    if (json) std::fprintf(json, "%s{\"cells\": \"%s\", \"bytes\": %lld, \"copies\": %d, \"variants\": [",
                           c ? ", " : "", cell.name, static_cast<long long>(cell.bytes), copies);
    for (size_t v = 0; v < names.size(); ++v) {
      const double percent = 100.0 * cell.bytes / (us[v] * 1e-6) / 1e9 / copy_gbps;
      std::printf("  %-40s %9.2f us  %6.1f %%\n", names[v].c_str(), us[v], percent);
      if (json) std::fprintf(json, "%s{\"name\": \"%s\", \"us\": %.3f, \"percent_of_copy\": %.2f}", v ? ", " : "",
                             names[v].c_str(), us[v], percent);
    }
    if (json) std::fprintf(json, "]}");
    for (cudaGraphExec_t exec : graphs) READ_FLOOR_CHECK(cudaGraphExecDestroy(exec));
    for (auto& set : buffers)
      for (void* buffer : set) READ_FLOOR_CHECK(cudaFree(buffer));
    for (void* half : halves) READ_FLOOR_CHECK(cudaFree(half));
  }
  if (json) {
    std::fprintf(json, "]}\n");
    std::fclose(json);
  }
  combine.release();
  READ_FLOOR_CHECK(cudaFree(seqlens));
  READ_FLOOR_CHECK(cudaFree(query));
  READ_FLOOR_CHECK(cudaFree(context.sink));
  READ_FLOOR_CHECK(cudaFree(context.steal_counters));
  READ_FLOOR_CHECK(cudaStreamDestroy(stream));
  return 0;
}
