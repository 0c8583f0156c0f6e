#include "support/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "common/half.hpp"

namespace fatest {

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kContiguous: return "contiguous";
    case Layout::kHeadMajor: return "headmajor";
    case Layout::kPadded: return "padded";
  }
  return "?";
}

const char* dtype_name(fa_dtype dtype) {
  switch (dtype) {
    case FA_DTYPE_FP32: return "fp32";
    case FA_DTYPE_FP16: return "fp16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_INT32: return "int32";
  }
  return "?";
}

size_t dtype_bytes(fa_dtype dtype) { return dtype == FA_DTYPE_FP16 || dtype == FA_DTYPE_BF16 ? 2 : 4; }

float round_to_f(fa_dtype dtype, float value) {
  switch (dtype) {
    case FA_DTYPE_FP16: return flashattn::fp16_to_float(flashattn::float_to_fp16(value));
    case FA_DTYPE_BF16: return flashattn::bf16_to_float(flashattn::float_to_bf16(value));
    default: return value;
  }
}

double round_to(fa_dtype dtype, double value) {
  if (dtype == FA_DTYPE_INT32) return std::nearbyint(value);
  // fp64 -> fp32 -> half rounds twice; the inputs we round are fp32 values or
  // fp32 accumulations, where the double rounding cannot change the result.
  return round_to_f(dtype, static_cast<float>(value));
}

HostTensor::HostTensor(fa_dtype dtype, std::vector<int64_t> shape, Layout layout)
    : dtype_(dtype), shape_(std::move(shape)), strides_(shape_.size(), 1) {
  const int r = rank();
  if (r < 1 || r > FA_MAX_RANK) throw std::invalid_argument("HostTensor: rank must be 1..4");
  if (r < 3 || layout == Layout::kContiguous) {
    int64_t stride = 1;
    for (int d = r - 1; d >= 0; --d) {
      strides_[d] = stride;
      stride *= shape_[d] > 0 ? shape_[d] : 1;
    }
  } else if (layout == Layout::kHeadMajor) {
    // (..., S, H, D) stored as (..., H, S, D).
    const int s = r - 3, h = r - 2, d = r - 1;
    const int64_t S = std::max<int64_t>(shape_[s], 1), H = std::max<int64_t>(shape_[h], 1);
    const int64_t D = std::max<int64_t>(shape_[d], 1);
    strides_[d] = 1;
    strides_[s] = D;
    strides_[h] = S * D;
    if (r == 4) strides_[0] = H * S * D;
  } else {
    const int s = r - 3, h = r - 2, d = r - 1;
    const int64_t H = std::max<int64_t>(shape_[h], 1), S = std::max<int64_t>(shape_[s], 1);
    strides_[d] = 1;
    strides_[h] = shape_[d] + 8;
    strides_[s] = H * strides_[h] + 8;
    if (r == 4) strides_[0] = S * strides_[s] + 16;
  }
  int64_t extent = numel() > 0 ? 1 : 0;
  if (extent) {
    for (int d = 0; d < r; ++d) extent += (shape_[d] - 1) * strides_[d];
  }
  if (layout == Layout::kPadded && r >= 3) extent += 8;  // trailing padding catches overruns too
  bytes_.assign(static_cast<size_t>(extent) * dtype_bytes(dtype_), kPoisonByte);
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

fa_tensor HostTensor::view(fa_device_type device, int32_t device_index) const {
  fa_tensor t;
  std::memset(&t, 0, sizeof(t));
  // A zero-size tensor still needs a non-null pointer for the API; any valid address serves.
  t.data = bytes_.empty() ? const_cast<unsigned char*>(&kPoisonByte) : const_cast<unsigned char*>(bytes_.data());
  t.dtype = dtype_;
  t.device = device;
  t.device_index = device_index;
  t.rank = rank();
  for (int d = 0; d < rank(); ++d) {
    t.shape[d] = shape_[d];
    t.strides[d] = strides_[d];
  }
  return t;
}

int64_t HostTensor::storage_offset(int64_t logical) const {
  int64_t offset = 0;
  for (int d = rank() - 1; d >= 0; --d) {
    offset += (logical % shape_[d]) * strides_[d];
    logical /= shape_[d];
  }
  return offset;
}

double HostTensor::get(int64_t logical) const {
  const unsigned char* p = bytes_.data() + storage_offset(logical) * dtype_bytes(dtype_);
  switch (dtype_) {
    case FA_DTYPE_FP32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case FA_DTYPE_INT32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case FA_DTYPE_FP16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return flashattn::fp16_to_float(v);
    }
    case FA_DTYPE_BF16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return flashattn::bf16_to_float(v);
    }
  }
  return 0.0;
}

void HostTensor::set(int64_t logical, double value) {
  unsigned char* p = bytes_.data() + storage_offset(logical) * dtype_bytes(dtype_);
  switch (dtype_) {
    case FA_DTYPE_FP32: {
      const float v = static_cast<float>(value);
      std::memcpy(p, &v, 4);
      break;
    }
    case FA_DTYPE_INT32: {
      const int32_t v = static_cast<int32_t>(value);
      std::memcpy(p, &v, 4);
      break;
    }
    case FA_DTYPE_FP16: {
      const uint16_t v = flashattn::float_to_fp16(static_cast<float>(value));
      std::memcpy(p, &v, 2);
      break;
    }
    case FA_DTYPE_BF16: {
      const uint16_t v = flashattn::float_to_bf16(static_cast<float>(value));
      std::memcpy(p, &v, 2);
      break;
    }
  }
}

std::vector<double> HostTensor::to_vector() const {
  std::vector<double> values(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) values[i] = get(i);
  return values;
}

void HostTensor::from_vector(const std::vector<double>& values) {
  if (static_cast<int64_t>(values.size()) != numel()) throw std::invalid_argument("from_vector: size mismatch");
  for (int64_t i = 0; i < numel(); ++i) set(i, values[i]);
}

void HostTensor::fill_random(std::mt19937_64& rng, double stddev) {
  std::normal_distribution<double> normal(0.0, stddev);
  for (int64_t i = 0; i < numel(); ++i) {
    double value = 0.0;
    while (value == 0.0) value = round_to(dtype_, normal(rng));
    set(i, value);
  }
}

void HostTensor::poison() {
  if (!bytes_.empty()) std::memset(bytes_.data(), kPoisonByte, bytes_.size());
}

int64_t HostTensor::count_poisoned() const {
  const size_t width = dtype_bytes(dtype_);
  int64_t count = 0;
  for (int64_t i = 0; i < numel(); ++i) {
    const unsigned char* p = bytes_.data() + storage_offset(i) * width;
    bool poisoned = true;
    for (size_t b = 0; b < width; ++b) poisoned = poisoned && p[b] == kPoisonByte;
    count += poisoned ? 1 : 0;
  }
  return count;
}

int64_t HostTensor::count_padding_touched() const {
  const size_t width = dtype_bytes(dtype_);
  std::vector<bool> logical(bytes_.size() / width, false);
  for (int64_t i = 0; i < numel(); ++i) logical[static_cast<size_t>(storage_offset(i))] = true;
  int64_t count = 0;
  for (size_t e = 0; e < logical.size(); ++e) {
    if (logical[e]) continue;
    for (size_t b = 0; b < width; ++b) {
      if (bytes_[e * width + b] != kPoisonByte) {
        ++count;
        break;
      }
    }
  }
  return count;
}

}  // namespace fatest
