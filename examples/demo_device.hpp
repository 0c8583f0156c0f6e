// Where the demo's tensors live: host memory, or device memory when the
// library has CUDA and a GPU is present (FLASHATTN_DEMO_CUDA).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_common.hpp"

#if defined(FLASHATTN_DEMO_CUDA)
#include <cuda_runtime.h>
#endif

namespace demo {

#if defined(FLASHATTN_DEMO_CUDA)
inline void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}
#endif

inline bool gpu_available() {
#if defined(FLASHATTN_DEMO_CUDA)
  int count = 0;
  return fa_has_cuda() && cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

class Device {
 public:
  explicit Device(bool gpu) : gpu_(gpu) {}
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() {
#if defined(FLASHATTN_DEMO_CUDA)
    for (void* ptr : allocations_) cudaFree(ptr);
#endif
  }

  // A view of t's contents on this device (the host tensor itself on the CPU).
  fa_tensor upload(bench::HostTensor& t) {
    fa_tensor view = t.view();
#if defined(FLASHATTN_DEMO_CUDA)
    if (gpu_) {
      void* ptr = nullptr;
      cuda_check(cudaMalloc(&ptr, t.bytes.size()), "cudaMalloc");
      cuda_check(cudaMemcpy(ptr, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
      allocations_.push_back(ptr);
      view.data = ptr;
      view.device = FA_DEVICE_CUDA;
    }
#endif
    return view;
  }

  void download(const fa_tensor& view, bench::HostTensor& t) {
#if defined(FLASHATTN_DEMO_CUDA)
    if (gpu_) cuda_check(cudaMemcpy(t.bytes.data(), view.data, t.bytes.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
#else
    (void)view;
    (void)t;
#endif
  }

  void synchronize() {
#if defined(FLASHATTN_DEMO_CUDA)
    if (gpu_) cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
  }

 private:
  bool gpu_;
  std::vector<void*> allocations_;
};

}  // namespace demo
