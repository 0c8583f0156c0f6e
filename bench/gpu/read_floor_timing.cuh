// read_floor.cu's timing: the copy it measures against, and CUDA graphs of calls timed as bench_decode.py times a
// decode call (a spin ahead of the start event, a warm-up, interleaved rounds, medians).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define READ_FLOOR_CHECK(expr)                                                                       \
  do {                                                                                               \
    const cudaError_t status_ = (expr);                                                              \
    if (status_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(status_)); \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

namespace read_floor {

// The GPU's global nanosecond timer (the same on every SM, unlike clock64).
__device__ __forceinline__ int64_t clock_ns() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return static_cast<int64_t>(now);
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

// Fills a buffer with pseudo-random words (a hash of the index): the decode table's caches hold randn values, and
// a constant fill might not cost the DRAM what data does.
__global__ void fill_random(uint32_t* words, int64_t count, uint32_t seed) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t x = (static_cast<uint64_t>(i) + seed) * 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    words[i] = static_cast<uint32_t>(x ^ (x >> 31));
  }
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

// Keeps the GPU busy for about `nanoseconds` (bench_decode.py's torch.cuda._sleep ahead of a timed replay).
__global__ void spin(int64_t nanoseconds) {
  const int64_t until = clock_ns() + nanoseconds;
  while (clock_ns() < until) __nanosleep(1000);
}

// A replay's time, with a spin queued ahead of the start event (cover): the host launches the graph while the GPU
// spins, so the interval holds the graph's calls and not the host's latency to launch it.
float replay_ms(cudaGraphExec_t exec, cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop, bool cover = true) {
  if (cover) {
    spin<<<1, 1, 0, stream>>>(100000);
    READ_FLOOR_CHECK(cudaGetLastError());
  }
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
                                     cudaStream_t stream, const std::vector<bool>& uncovered = {}) {
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
      const bool cover = g >= uncovered.size() || !uncovered[g];
      times[g].push_back(replay_ms(graphs[g], stream, start, stop, cover) * 1e3 / calls);
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
// (bench_decode.py's copy), of a source of constant bytes or of random words.
double copy_bandwidth_gbps(cudaStream_t stream, int sms, bool random_source) {
  const size_t bytes = size_t{4} << 30;
  void *src, *dst;
  READ_FLOOR_CHECK(cudaMalloc(&src, bytes));
  READ_FLOOR_CHECK(cudaMalloc(&dst, bytes));
  if (random_source) {
    fill_random<<<sms * 8, 256, 0, stream>>>(static_cast<uint32_t*>(src), bytes / 4, 1);
    READ_FLOOR_CHECK(cudaGetLastError());
  } else {
    READ_FLOOR_CHECK(cudaMemsetAsync(src, 1, bytes, stream));
  }
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

}  // namespace read_floor
