// Thin C++17 wrapper over the C API: the same structs, exceptions instead of
// status codes.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "flashattn/flashattn.h"

namespace flashattn {

class Error : public std::runtime_error {
 public:
  Error(fa_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  fa_status status() const noexcept { return status_; }

 private:
  fa_status status_;
};

inline void check(fa_status status) {
  if (status != FA_OK) throw Error(status, fa_last_error());
}

// A view with the given shape; strides default to contiguous row-major.
inline fa_tensor make_tensor(void* data, fa_dtype dtype, std::initializer_list<int64_t> shape,
                             std::initializer_list<int64_t> strides = {}, fa_device_type device = FA_DEVICE_CPU,
                             int32_t device_index = 0) {
  if (shape.size() > FA_MAX_RANK) throw Error(FA_ERROR_INVALID_ARGUMENT, "shape: expected at most 4 dimensions");
  if (strides.size() != 0 && strides.size() != shape.size())
    throw Error(FA_ERROR_INVALID_ARGUMENT, "strides: expected as many strides as dimensions");
  fa_tensor t = fa_tensor_contiguous(data, dtype, device, static_cast<int32_t>(shape.size()), shape.begin());
  t.device_index = device_index;
  int d = 0;
  for (int64_t stride : strides) t.strides[d++] = stride;
  return t;
}

struct Options : fa_options {
  Options() { fa_options_init(this); }
};

struct FwdArgs : fa_fwd_args {
  FwdArgs() { fa_fwd_args_init(this); }
};

struct BwdArgs : fa_bwd_args {
  BwdArgs() { fa_bwd_args_init(this); }
};

struct KvCacheArgs : fa_kvcache_args {
  KvCacheArgs() { fa_kvcache_args_init(this); }
};

inline size_t fwd_workspace_size(const fa_fwd_args& args) {
  size_t bytes = 0;
  check(fa_fwd_workspace_size(&args, &bytes));
  return bytes;
}

inline size_t bwd_workspace_size(const fa_bwd_args& args) {
  size_t bytes = 0;
  check(fa_bwd_workspace_size(&args, &bytes));
  return bytes;
}

// workspace == nullptr: the library allocates through fa_set_allocator's allocator.
inline void fwd(const fa_fwd_args& args, void* workspace = nullptr, size_t workspace_bytes = 0) {
  check(fa_fwd(&args, workspace, workspace_bytes));
}

inline size_t fwd_kvcache_workspace_size(const fa_kvcache_args& args) {
  size_t bytes = 0;
  check(fa_fwd_kvcache_workspace_size(&args, &bytes));
  return bytes;
}

// Appends k_new / v_new into the cache (when given) and attends; see flashattn.h.
inline void fwd_kvcache(const fa_kvcache_args& args, void* workspace = nullptr, size_t workspace_bytes = 0) {
  check(fa_fwd_kvcache(&args, workspace, workspace_bytes));
}

inline void bwd(const fa_bwd_args& args, void* workspace = nullptr, size_t workspace_bytes = 0) {
  check(fa_bwd(&args, workspace, workspace_bytes));
}

}  // namespace flashattn
