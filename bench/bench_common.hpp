// Shared by the benchmark and the demo: host tensors, random fill, timing,
// a counting allocator and the flash-attn FLOP convention.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/half.hpp"
#include "flashattn/flashattn.hpp"

namespace bench {

// Bytes of one element of dtype.
inline size_t dtype_bytes(fa_dtype dtype) { return dtype == FA_DTYPE_FP32 ? 4 : 2; }

// A host buffer holding fp32 or bf16 elements.
struct HostTensor {
  fa_dtype dtype = FA_DTYPE_FP32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  HostTensor() = default;
  HostTensor(fa_dtype type, std::vector<int64_t> dims) : dtype(type), shape(std::move(dims)) {
    bytes.resize(static_cast<size_t>(numel()) * dtype_bytes(dtype));
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  float get(int64_t index) const {
    if (dtype == FA_DTYPE_FP32) return reinterpret_cast<const float*>(bytes.data())[index];
    return flashattn::bf16_to_float(reinterpret_cast<const uint16_t*>(bytes.data())[index]);
  }
  void set(int64_t index, float value) {
    if (dtype == FA_DTYPE_FP32)
      reinterpret_cast<float*>(bytes.data())[index] = value;
    else
      reinterpret_cast<uint16_t*>(bytes.data())[index] = flashattn::float_to_bf16(value);
  }
  void fill_random(std::mt19937_64& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < numel(); ++i) set(i, normal(rng));
  }
  fa_tensor view(void* data = nullptr) {
    return fa_tensor_contiguous(data ? data : bytes.data(), dtype, FA_DEVICE_CPU, static_cast<int32_t>(shape.size()),
                                shape.data());
  }
};

// Tracks the library's workspace allocations (all its scratch memory).
struct CountingAllocator {
  static size_t& current() {
    static size_t bytes = 0;
    return bytes;
  }
  static size_t& peak() {
    static size_t bytes = 0;
    return bytes;
  }
  static void* alloc(size_t bytes, fa_device_type, int32_t, void*) {
    void* ptr = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (ptr == nullptr) return nullptr;
    *static_cast<size_t*>(ptr) = bytes;
    current() += bytes;
    peak() = std::max(peak(), current());
    return static_cast<uint8_t*>(ptr) + 64;
  }
  static void release(void* ptr, fa_device_type, int32_t, void*) {
    uint8_t* base = static_cast<uint8_t*>(ptr) - 64;
    current() -= *reinterpret_cast<size_t*>(base);
    std::free(base);
  }
  static void install() { fa_set_allocator(&alloc, &release, nullptr); }
  static void reset_peak() { peak() = current(); }
};

// The backward of a forward call: its tensors and options, plus the gradients.
inline flashattn::BwdArgs backward_args(const fa_fwd_args& fwd, const fa_tensor& dout, const fa_tensor& dq,
                                        const fa_tensor& dk, const fa_tensor& dv) {
  flashattn::BwdArgs bwd;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.v = fwd.v;
  bwd.out = fwd.out;
  bwd.lse = fwd.lse;
  bwd.dout = dout;
  bwd.dq = dq;
  bwd.dk = dk;
  bwd.dv = dv;
  bwd.opts = fwd.opts;
  return bwd;
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <typename Fn>
double median_seconds(int repetitions, Fn&& fn) {
  std::vector<double> times;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// flash-attn's convention: forward 4·B·H·Sq·Sk·D, halved when causal; backward 2.5× forward.
inline double attention_fwd_flops(int64_t b, int64_t h, int64_t sq, int64_t sk, int64_t d, bool causal) {
  const double flops = 4.0 * b * h * sq * sk * d;
  return causal ? flops / 2 : flops;
}

}  // namespace bench
