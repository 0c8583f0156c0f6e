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
// (the same DRAM traffic).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/gpu/read_floor.cu -o read_floor
//   ./read_floor [--json out.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../src/cuda/sm80/mma.cuh"  // the library's cp.async wrappers, which the decode kernel's copies match

#define READ_FLOOR_CHECK(expr)                                                                       \
  do {                                                                                               \
    const cudaError_t status_ = (expr);                                                              \
    if (status_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(status_)); \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

namespace {

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
constexpr int kSlabKeys = 16, kRowChunks = 16;
constexpr int kSlabCopies = kSlabKeys * kRowChunks / 32;  // a lane's copies per slab and tensor
constexpr int kStageVectors = 2 * kSlabKeys * kRowChunks;  // (2, kSlabKeys, kRowChunks) 16-byte vectors

template <int kStages>
__global__ void __launch_bounds__(256) ring_head_rows(const uint4* __restrict__ k, const uint4* __restrict__ v,
                                                      int64_t keys, int64_t keys_per_split,
                                                      uint32_t* __restrict__ sink) {
  extern __shared__ uint4 ring[];  // (warps, kStages, kStageVectors)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int heads = gridDim.y, head = blockIdx.y;
  const int64_t begin = blockIdx.x * keys_per_split;
  const int64_t end = begin + keys_per_split < keys ? begin + keys_per_split : keys;
  const int slabs = static_cast<int>((end - begin) / kSlabKeys);  // the splits are whole slabs here
  const int steps = slabs > warp ? (slabs - warp + warps - 1) / warps : 0;
  uint4* stages = ring + warp * kStages * kStageVectors;
  auto issue = [&](int step) {
    const int64_t key0 = begin + (int64_t{step} * warps + warp) * kSlabKeys;
    uint4* stage = stages + step % kStages * kStageVectors;
#pragma unroll
    for (int i = 0; i < kSlabCopies; ++i) {
      const int row = lane / 8 + 4 * (i / 2), chunk = i % 2 * 8 + lane % 8;
      const int64_t chunk_index = ((key0 + row) * heads + head) * kRowChunks + chunk;
      flashattn::sm80::cp_async_16(stage + i * 32 + lane, k + chunk_index, true);
      flashattn::sm80::cp_async_16(stage + (kSlabCopies + i) * 32 + lane, v + chunk_index, true);
    }
  };
  uint32_t folded = 0;
#pragma unroll 1
  for (int n = 1 - kStages; n < steps; ++n) {
    __syncwarp();
    const int fill = n + kStages - 1;
    if (fill < steps) issue(fill);
    flashattn::sm80::cp_async_commit();
    if (n < 0) continue;
    flashattn::sm80::cp_async_wait<kStages - 1>();
    __syncwarp();
    folded ^= stages[n % kStages * kStageVectors + lane].x;
  }
  for (int offset = 16; offset > 0; offset /= 2) folded ^= __shfl_xor_sync(0xffffffffu, folded, offset);
  if (lane == 0) sink[(int64_t{head} * gridDim.x + blockIdx.x) * warps + warp] = folded;
}

// A copy as torch's dst.copy_(src) runs it (cudaMemcpyAsync between buffers on one device is slower on an H100):
// four 16-byte loads in flight per thread, then their stores.
__global__ void __launch_bounds__(512) copy_vectors(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                    int64_t vectors) {
  constexpr int kUnroll = 4;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < vectors; i += kUnroll * stride) {
    uint4 loaded[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) loaded[u] = __ldg(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * stride] = loaded[u];
  }
  for (; i < vectors; i += stride) dst[i] = __ldg(src + i);
}

// The node a split-KV call adds after its split kernel: one small block that depends on it.
__global__ void one_block(uint32_t* sink) { sink[threadIdx.x] += 1; }

struct Variant {
  std::string name;
  int threads;
  int unroll;
  int blocks_per_sm;     // read_chunks: gridDim.x = SMs * blocks_per_sm
  bool second_node;      // a one-block kernel after each read
  int head_splits = 0;   // read_head_rows: gridDim = (head_splits, kHeads); 0: read_chunks
  int ring_stages = 0;   // with head_splits: ring_head_rows with this many stages
};

size_t ring_bytes(const Variant& variant) {
  return size_t{16} * kStageVectors * variant.ring_stages * (variant.threads / 32);
}

constexpr int kHeads = 8;  // kv heads of the decode table's cells

void launch_read(const Variant& variant, int blocks, const uint4* src, int64_t vectors, uint32_t* sink,
                 cudaStream_t stream) {
  if (variant.head_splits > 0) {
    // The first half of the buffer is K, the second V: (keys, kHeads, 16 chunks) each.
    const int64_t keys = vectors / 2 / (kHeads * 16);
    const int64_t per_split = (keys + variant.head_splits - 1) / variant.head_splits;
    const dim3 grid(variant.head_splits, kHeads);
    const uint4* v = src + vectors / 2;
    if (variant.ring_stages == 3)
      ring_head_rows<3><<<grid, variant.threads, ring_bytes(variant), stream>>>(src, v, keys, per_split, sink);
    else if (variant.ring_stages == 4)
      ring_head_rows<4><<<grid, variant.threads, ring_bytes(variant), stream>>>(src, v, keys, per_split, sink);
    else if (variant.unroll == 16)
      read_head_rows<16><<<grid, variant.threads, 0, stream>>>(src, v, keys, per_split, sink);
    else if (variant.unroll == 4)
      read_head_rows<4><<<grid, variant.threads, 0, stream>>>(src, v, keys, per_split, sink);
    else
      read_head_rows<8><<<grid, variant.threads, 0, stream>>>(src, v, keys, per_split, sink);
    READ_FLOOR_CHECK(cudaGetLastError());
    return;
  }
  const int64_t per_block = (vectors + blocks - 1) / blocks;
  switch (variant.unroll) {
    case 4: read_chunks<4><<<blocks, variant.threads, 0, stream>>>(src, vectors, per_block, sink); break;
    case 8: read_chunks<8><<<blocks, variant.threads, 0, stream>>>(src, vectors, per_block, sink); break;
    default: read_chunks<16><<<blocks, variant.threads, 0, stream>>>(src, vectors, per_block, sink); break;
  }
  READ_FLOOR_CHECK(cudaGetLastError());
}

// One graph per variant: one call per buffer copy.
template <typename Body>
cudaGraphExec_t capture(cudaStream_t stream, Body body) {
  cudaGraph_t graph;
  READ_FLOOR_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  body();
  READ_FLOOR_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  READ_FLOOR_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  READ_FLOOR_CHECK(cudaGraphDestroy(graph));
  return exec;
}

float replay_ms(cudaGraphExec_t exec, cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop) {
  READ_FLOOR_CHECK(cudaEventRecord(start, stream));
  READ_FLOOR_CHECK(cudaGraphLaunch(exec, stream));
  READ_FLOOR_CHECK(cudaEventRecord(stop, stream));
  READ_FLOOR_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  READ_FLOOR_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms;
}

// Median time of one call of each graph: a warm-up of 0.2 s of GPU time (bench_decode.py's, for the same reason),
// then rounds that replay every graph once, each round starting at another graph.
std::vector<double> time_interleaved(const std::vector<cudaGraphExec_t>& graphs, int calls, int rounds,
                                     cudaStream_t stream) {
  cudaEvent_t start, stop;
  READ_FLOOR_CHECK(cudaEventCreate(&start));
  READ_FLOOR_CHECK(cudaEventCreate(&stop));
  for (double busy_ms = 0; busy_ms < 200;)
    for (cudaGraphExec_t exec : graphs) busy_ms += replay_ms(exec, stream, start, stop);
  const size_t count = graphs.size();
  std::vector<std::vector<double>> times(count);
  for (int round = 0; round < rounds; ++round)
    for (size_t i = 0; i < count; ++i) {
      const size_t g = (i + round) % count;
      times[g].push_back(replay_ms(graphs[g], stream, start, stop) * 1e3 / calls);
    }
  READ_FLOOR_CHECK(cudaEventDestroy(start));
  READ_FLOOR_CHECK(cudaEventDestroy(stop));
  std::vector<double> medians;
  for (auto& values : times) {
    std::sort(values.begin(), values.end());
    medians.push_back(values[values.size() / 2]);
  }
  return medians;
}

// A device-to-device copy of 4 GiB, the better of cudaMemcpyAsync and copy_vectors: bytes read + written per second
// (bench_decode.py's copy).
double copy_bandwidth_gbps(cudaStream_t stream, int sms) {
  const size_t bytes = size_t{4} << 30;
  void *src, *dst;
  READ_FLOOR_CHECK(cudaMalloc(&src, bytes));
  READ_FLOOR_CHECK(cudaMalloc(&dst, bytes));
  READ_FLOOR_CHECK(cudaMemset(src, 1, bytes));
  const std::vector<cudaGraphExec_t> graphs = {
      capture(stream, [&] { READ_FLOOR_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)); }),
      capture(stream, [&] {
        copy_vectors<<<sms * 4, 512, 0, stream>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst),
                                                  bytes / 16);
        READ_FLOOR_CHECK(cudaGetLastError());
      })};
  const std::vector<double> us = time_interleaved(graphs, 1, 7, stream);
  for (cudaGraphExec_t exec : graphs) READ_FLOOR_CHECK(cudaGraphExecDestroy(exec));
  READ_FLOOR_CHECK(cudaFree(src));
  READ_FLOOR_CHECK(cudaFree(dst));
  return 2.0 * bytes / (std::min(us[0], us[1]) * 1e-6) / 1e9;
}

struct Cell {
  const char* name;  // the decode cells with these K/V bytes (Hkv = 8, D = 128, bf16)
  int64_t bytes;
};

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--json" && i + 1 < argc) json_path = argv[++i];

  cudaDeviceProp props;
  READ_FLOOR_CHECK(cudaGetDeviceProperties(&props, 0));
  const int sms = props.multiProcessorCount;
  cudaStream_t stream;
  READ_FLOOR_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbps = copy_bandwidth_gbps(stream, sms);
  std::printf("%s, %d SMs, L2 %d MiB; device-to-device copy of 4 GiB: %.0f GB/s (read + write)\n", props.name, sms,
              props.l2CacheSize >> 20, copy_gbps);

  std::vector<Variant> variants;
  for (int threads : {256, 512})
    for (int unroll : {4, 8, 16})
      for (int per_sm : {1, 2, 4})
        variants.push_back({std::to_string(threads) + "t x" + std::to_string(unroll) + ", " +
                                std::to_string(per_sm) + " x SMs blocks",
                            threads, unroll, per_sm, false});
  variants.push_back({"512t x8, SMs blocks + 1-block node", 512, 8, 1, true});
  variants.push_back({"256t x8, 4 x SMs + 1-block node", 256, 8, 4, true});
  for (int threads : {256, 512})
    for (int splits : {16, 33, 66})
      variants.push_back({"head rows " + std::to_string(threads) + "t x" + std::to_string(threads == 256 ? 8 : 4) +
                              ", " + std::to_string(splits) + " x 8 blocks",
                          threads, threads == 256 ? 8 : 4, 0, false, splits});
  variants.push_back({"head rows 256t x8, 16 x 8 + 1-block", 256, 8, 0, true, 16});
  variants.push_back({"head rows 128t x16, 16 x 8 blocks", 128, 16, 0, false, 16});
  // The decode kernel's ring: 4 warps of 3 stages (64 KiB in flight), then deeper, wider, two blocks per SM.
  variants.push_back({"ring 4w x3 stages, 16 x 8 blocks", 128, 0, 0, false, 16, 3});
  variants.push_back({"ring 4w x4 stages, 16 x 8 blocks", 128, 0, 0, false, 16, 4});
  variants.push_back({"ring 8w x3 stages, 16 x 8 blocks", 256, 0, 0, false, 16, 3});
  variants.push_back({"ring 4w x3 stages, 32 x 8 blocks", 128, 0, 0, false, 32, 3});
  variants.push_back({"ring 4w x3, 16 x 8 + 1-block", 128, 0, 0, true, 16, 3});

  const Cell cells[] = {{"B=1 4k", int64_t{2} * 4096 * 8 * 128 * 2},
                        {"B=1 32k, B=8 4k", int64_t{2} * 32768 * 8 * 128 * 2},
                        {"B=1 128k, B=8 16k", int64_t{2} * 131072 * 8 * 128 * 2},
                        {"B=8 32k", int64_t{2} * 8 * 32768 * 8 * 128 * 2}};
  const int max_blocks = sms * 4;
  READ_FLOOR_CHECK(cudaFuncSetAttribute(ring_head_rows<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 196608));
  READ_FLOOR_CHECK(cudaFuncSetAttribute(ring_head_rows<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 196608));
  uint32_t* sink;
  READ_FLOOR_CHECK(cudaMalloc(&sink, sizeof(uint32_t) * max_blocks * 16 * 8));

  FILE* json = json_path ? std::fopen(json_path, "w") : nullptr;
  if (json) std::fprintf(json, "{\"gpu\": \"%s\", \"sms\": %d, \"copy_GBps\": %.1f, \"cells\": [", props.name, sms,
                         copy_gbps);
  for (size_t c = 0; c < sizeof(cells) / sizeof(cells[0]); ++c) {
    const Cell& cell = cells[c];
    const int copies = static_cast<int>(std::max<int64_t>(8, (4 * int64_t{props.l2CacheSize} + cell.bytes - 1) /
                                                                   cell.bytes));
    std::vector<void*> buffers(copies);
    for (void*& buffer : buffers) {
      READ_FLOOR_CHECK(cudaMalloc(&buffer, cell.bytes));
      READ_FLOOR_CHECK(cudaMemset(buffer, 0x5a, cell.bytes));
    }
    const int64_t vectors = cell.bytes / 16;
    std::vector<cudaGraphExec_t> graphs;
    for (const Variant& variant : variants)
      graphs.push_back(capture(stream, [&] {
        for (void* buffer : buffers) {
          launch_read(variant, sms * variant.blocks_per_sm, static_cast<const uint4*>(buffer), vectors, sink,
                      stream);
          if (variant.second_node) one_block<<<1, 32, 0, stream>>>(sink);
        }
      }));
    // A copy of half the bytes moves as many through the DRAM as a read of all of them.
    std::vector<void*> halves(copies);
    for (void*& half : halves) READ_FLOOR_CHECK(cudaMalloc(&half, cell.bytes / 2));
    graphs.push_back(capture(stream, [&] {
      for (int i = 0; i < copies; ++i)
        copy_vectors<<<sms * 4, 512, 0, stream>>>(static_cast<const uint4*>(buffers[i]), static_cast<uint4*>(halves[i]),
                                                  cell.bytes / 2 / 16);
    }));
    const std::vector<double> us = time_interleaved(graphs, copies, 15, stream);

    std::printf("\n%s: %.1f MB a call, %d copies; us a call, %% of copy's bandwidth\n", cell.name, cell.bytes / 1e6,
                copies);
    if (json) std::fprintf(json, "%s{\"cells\": \"%s\", \"bytes\": %lld, \"copies\": %d, \"variants\": [",
                           c ? ", " : "", cell.name, static_cast<long long>(cell.bytes), copies);
    for (size_t v = 0; v <= variants.size(); ++v) {
      const std::string name = v < variants.size() ? variants[v].name : "copy of half the bytes";
      const double percent = 100.0 * cell.bytes / (us[v] * 1e-6) / 1e9 / copy_gbps;
      std::printf("  %-32s %9.2f us  %6.1f %%\n", name.c_str(), us[v], percent);
      if (json) std::fprintf(json, "%s{\"name\": \"%s\", \"us\": %.3f, \"percent_of_copy\": %.2f}", v ? ", " : "",
                             name.c_str(), us[v], percent);
    }
    if (json) std::fprintf(json, "]}");
    for (cudaGraphExec_t exec : graphs) READ_FLOOR_CHECK(cudaGraphExecDestroy(exec));
    for (void* buffer : buffers) READ_FLOOR_CHECK(cudaFree(buffer));
    for (void* half : halves) READ_FLOOR_CHECK(cudaFree(half));
  }
  if (json) {
    std::fprintf(json, "]}\n");
    std::fclose(json);
  }
  READ_FLOOR_CHECK(cudaFree(sink));
  READ_FLOOR_CHECK(cudaStreamDestroy(stream));
  return 0;
}
