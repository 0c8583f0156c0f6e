// Host tensors for the tests: strided storage of fp32 / fp16 / bf16 / int32,
// random fill, conversion to and from fp64 in logical (row-major) order, and a
// NaN poison pattern that proves every logical element was written and no
// padding byte was. Device-agnostic: a GPU test copies `bytes` to the device
// and builds its view with device = FA_DEVICE_CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"

namespace fatest {

// How a (B,S,H,D) or (T,H,D) tensor is stored.
enum class Layout {
  kContiguous,  // (B,S,H,D) / (T,H,D) row-major
  kHeadMajor,   // storage (B,H,S,D) / (H,T,D): the S and H strides permuted
  kPadded,      // row-major with padding after each head vector and each batch
};

const char* layout_name(Layout layout);
const char* dtype_name(fa_dtype dtype);
size_t dtype_bytes(fa_dtype dtype);

// Rounds a value to what the dtype can hold (round to nearest even).
double round_to(fa_dtype dtype, double value);
float round_to_f(fa_dtype dtype, float value);

class HostTensor {
 public:
  HostTensor() = default;
  // Storage of `shape` laid out as `layout`; every byte starts as the poison pattern.
  HostTensor(fa_dtype dtype, std::vector<int64_t> shape, Layout layout = Layout::kContiguous);

  fa_dtype dtype() const { return dtype_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t numel() const;  // logical elements
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  std::vector<unsigned char>& bytes() { return bytes_; }
  const std::vector<unsigned char>& bytes() const { return bytes_; }

  // The C API view of this storage.
  fa_tensor view(fa_device_type device = FA_DEVICE_CPU, int32_t device_index = 0) const;

  // Logical element (row-major index over shape) as fp64, and written with rounding to the dtype.
  double get(int64_t logical) const;
  void set(int64_t logical, double value);
  std::vector<double> to_vector() const;
  void from_vector(const std::vector<double>& values);

  // Standard normal values (never exactly zero), rounded to the dtype.
  void fill_random(std::mt19937_64& rng, double stddev = 1.0);

  // All storage bytes set to the poison pattern: a NaN for float dtypes.
  void poison();
  // Logical elements that are still the poison pattern (never written).
  int64_t count_poisoned() const;
  // Storage bytes outside the logical elements that are no longer poison (written out of bounds).
  int64_t count_padding_touched() const;

 private:
  int64_t storage_offset(int64_t logical) const;

  fa_dtype dtype_ = FA_DTYPE_FP32;
  std::vector<int64_t> shape_, strides_;
  std::vector<unsigned char> bytes_;
};

// The poison byte pattern (repeated): 0xFF makes fp32, fp16 and bf16 NaN.
constexpr unsigned char kPoisonByte = 0xFF;

}  // namespace fatest
