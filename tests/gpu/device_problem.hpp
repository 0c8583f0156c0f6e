// A Problem of the shared test support mirrored in GPU memory: every host
// tensor is copied to the device (poison included), argument blocks are
// rewritten to point at the device copies, and outputs come back into the
// same HostTensors, so every host-side check of tests/support applies as is.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "support/problem.hpp"

namespace fatest::gpu {

// Skips the calling test unless a CUDA device can be used (and says why).
bool gpu_available(std::string* why);
#define FA_GPU_TEST_OR_SKIP()                                                \
  do {                                                                       \
    std::string fa_gpu_why;                                                  \
    if (!::fatest::gpu::gpu_available(&fa_gpu_why)) GTEST_SKIP() << fa_gpu_why; \
  } while (0)

#define FA_CUDA_ASSERT(expr)                                                                     \
  do {                                                                                           \
    const cudaError_t fa_assert_status = (expr);                                                 \
    ASSERT_EQ(fa_assert_status, cudaSuccess) << #expr << ": " << cudaGetErrorString(fa_assert_status); \
  } while (0)

class DeviceMirror {
 public:
  explicit DeviceMirror(const Problem& problem);
  ~DeviceMirror();
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  // The host argument blocks of the problem, pointing at the device copies.
  fa_fwd_args fwd_args() const;
  fa_bwd_args bwd_args() const;
  // Host -> device again (e.g. after poison_outputs on the host side).
  void upload(const HostTensor& t);
  // Device -> host for one tensor.
  void download(HostTensor& t) const;
  void* device_pointer(const HostTensor& t) const;

 private:
  fa_tensor to_device(fa_tensor t) const;
  const Problem& problem_;
  std::map<const void*, void*> device_of_;  // host storage -> device storage
};

// A device buffer freed on scope exit.
struct DeviceBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Sets an environment variable for the scope (the library reads its
// FLASHATTN_* switches per call) and restores the previous value on exit.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, previous_;
  bool had_previous_ = false;
};

// The cases of the shared list as the GPU runs them: fp32 cases become bf16
// (the CUDA backend serves fp16 and bf16), so every shape and option runs.
std::vector<Case> gpu_cases(const std::vector<Case>& cases);

// Compute capability (major * 10 + minor) of the current device, 0 without one.
int compute_capability();

// Problems of many more (128-row query tile, head, sequence) tiles than an
// H200 has SMs (132), so the CTAs of the persistent sm90 forward loop: causal
// both alignments (with query tiles that see no key), GQA, sliding window with
// Dv != D, dense non-causal, varlen with empty sequences, fp16 and bf16, every
// head-dim class.
std::vector<Case> many_tile_cases();

}  // namespace fatest::gpu
