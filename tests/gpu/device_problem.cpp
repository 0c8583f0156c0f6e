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

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  if (const char* previous = std::getenv(name)) {
    previous_ = previous;
    had_previous_ = true;
  }
  setenv(name, value, 1);
}

ScopedEnv::~ScopedEnv() {
  if (had_previous_)
    setenv(name_.c_str(), previous_.c_str(), 1);
  else
    unsetenv(name_.c_str());
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

int compute_capability() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return 0;
  return major * 10 + minor;
}

std::vector<Case> many_tile_cases() {
  auto make = [](const char* name, fa_dtype dtype, int64_t B, int64_t H, int64_t Hkv, int64_t Sq, int64_t Sk,
                 int64_t D, int64_t Dv) {
    Case c;
    c.name = name;
    c.dtype = dtype;
    c.B = B, c.H = H, c.Hkv = Hkv, c.Sq = Sq, c.Sk = Sk, c.D = D, c.Dv = Dv;
    return c;
  };
  std::vector<Case> cases;
  // Sizes: 272-320 tiles each (two or three per CTA on 132 SMs) at under a
  // billion multiply-adds, so the fp64 reference stays in seconds.
  // 3 query tiles x 96 (sequence, head) pairs = 288 tiles.
  Case causal_gqa = make("many_tiles_causal_gqa_bf16_hdim64", FA_DTYPE_BF16, 2, 48, 12, 257, 257, 64, 64);
  causal_gqa.causal = true;
  cases.push_back(causal_gqa);
  // 2 x 144 = 288 tiles, non-causal, keys not a multiple of the key tile.
  cases.push_back(make("many_tiles_dense_fp16_hdim128", FA_DTYPE_FP16, 2, 72, 72, 130, 150, 128, 128));
  // Top-left causal with fewer queries than keys: 2 x 144 = 288 tiles.
  Case top_left = make("many_tiles_causal_top_left_bf16_hdim128", FA_DTYPE_BF16, 2, 72, 18, 130, 150, 128, 128);
  top_left.causal = true;
  top_left.align = FA_ALIGN_TOP_LEFT;
  cases.push_back(top_left);
  // Bottom-right causal with 520 queries and 200 keys: rows below 320 see no
  // key, so query tiles 0 and 1 of every pair have no key tile at all (O = 0,
  // LSE = +inf) and tile 2 is partly empty: 5 x 64 = 320 tiles.
  Case no_keys = make("many_tiles_causal_no_key_tiles_fp16_hdim64", FA_DTYPE_FP16, 2, 32, 32, 520, 200, 64, 64);
  no_keys.causal = true;
  cases.push_back(no_keys);
  // Sliding window, D = 192 and Dv = 128 (the 256 class): 2 x 136 = 272 tiles.
  Case window = make("many_tiles_window_dv_fp16_hdim192", FA_DTYPE_FP16, 1, 136, 136, 140, 140, 192, 128);
  window.window_left = 64;
  window.window_right = 16;
  cases.push_back(window);
  // Varlen with empty sequences (and queries without keys): 4 x 8 x 10 = 320 tiles.
  Case varlen = make("many_tiles_varlen_causal_empty_bf16_hdim128", FA_DTYPE_BF16, 8, 10, 2, 0, 0, 128, 128);
  varlen.seqlens_q = {300, 0, 129, 1, 0, 256, 77, 400};
  varlen.seqlens_k = {300, 5, 0, 1, 0, 256, 500, 400};
  varlen.Sq = 400;
  varlen.Sk = 500;
  varlen.causal = true;
  cases.push_back(varlen);
  return cases;
}

}  // namespace fatest::gpu
