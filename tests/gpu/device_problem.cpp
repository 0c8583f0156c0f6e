#include "device_problem.hpp"

#include <cstdlib>
#include <cstring>

namespace fatest::gpu {

bool gpu_available(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    *why = std::string("no usable CUDA device: cudaGetDeviceCount failed: ") + cudaGetErrorString(status);
    return false;
  }
  if (count == 0) {
    *why = "no usable CUDA device: cudaGetDeviceCount returned 0";
    return false;
  }
  if (!fa_has_cuda()) {
    *why = "flashattn was built without the CUDA backend";
    return false;
  }
  return true;
}

DeviceBuffer::DeviceBuffer(size_t n) : bytes(n) {
  if (cudaMalloc(&data, n == 0 ? 16 : n) != cudaSuccess) data = nullptr;
}
DeviceBuffer::~DeviceBuffer() {
  if (data != nullptr) cudaFree(data);
}

DeviceMirror::DeviceMirror(const Problem& problem) : problem_(problem) {
  const HostTensor* tensors[] = {&problem.q,   &problem.k,  &problem.v,    &problem.out,  &problem.lse,
                                 &problem.dout, &problem.dq, &problem.dk,   &problem.dv,   &problem.cu_q,
                                 &problem.cu_k, &problem.alibi};
  for (const HostTensor* t : tensors) {
    if (t->data() == nullptr) continue;  // an absent optional tensor
    void* device = nullptr;
    if (cudaMalloc(&device, t->bytes().empty() ? 16 : t->bytes().size()) != cudaSuccess) continue;
    device_of_[t->data()] = device;
    upload(*t);
  }
}

DeviceMirror::~DeviceMirror() {
  for (auto& entry : device_of_) cudaFree(entry.second);
}

void* DeviceMirror::device_pointer(const HostTensor& t) const {
  auto found = device_of_.find(t.data());
  return found == device_of_.end() ? nullptr : found->second;
}

void DeviceMirror::upload(const HostTensor& t) {
  void* device = device_pointer(t);
  if (device != nullptr && !t.bytes().empty()) cudaMemcpy(device, t.data(), t.bytes().size(), cudaMemcpyHostToDevice);
}

void DeviceMirror::download(HostTensor& t) const {
  void* device = device_pointer(t);
  if (device != nullptr && !t.bytes().empty()) cudaMemcpy(t.data(), device, t.bytes().size(), cudaMemcpyDeviceToHost);
}

fa_tensor DeviceMirror::to_device(fa_tensor t) const {
  if (t.data == nullptr) return t;
  auto found = device_of_.find(t.data);
  if (found != device_of_.end()) t.data = found->second;
  t.device = FA_DEVICE_CUDA;
  t.device_index = 0;
  return t;
}

fa_fwd_args DeviceMirror::fwd_args() const {
  fa_fwd_args a = problem_.fwd_args();
  for (fa_tensor* t : {&a.q, &a.k, &a.v, &a.out, &a.lse, &a.cu_seqlens_q, &a.cu_seqlens_k, &a.alibi_slopes})
    *t = to_device(*t);
  return a;
}

fa_bwd_args DeviceMirror::bwd_args() const {
  fa_bwd_args a = problem_.bwd_args();
  for (fa_tensor* t : {&a.dout, &a.q, &a.k, &a.v, &a.out, &a.lse, &a.dq, &a.dk, &a.dv, &a.cu_seqlens_q,
                       &a.cu_seqlens_k, &a.alibi_slopes})
    *t = to_device(*t);
  return a;
}

std::vector<Case> gpu_cases(const std::vector<Case>& cases) {
  std::vector<Case> out;
  for (Case c : cases) {
    if (c.dtype == FA_DTYPE_FP32) {
      c.dtype = FA_DTYPE_BF16;
      c.name += "_as_bf16";
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace fatest::gpu
