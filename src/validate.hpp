// Turns C API arguments into normalized backend params, or fails with a
// message naming the argument. Writes nothing but `params`.
#pragma once

#include <cstring>
#include <initializer_list>
#include <string>

#include "common/kvcache_params.hpp"
#include "common/params.hpp"

namespace flashattn {

fa_status validate_kvcache(const fa_kvcache_args* args, KvCacheParams& params);

// The checks validate.cpp builds on, shared with src/kvcache/validate_kvcache.cpp.
namespace validation {
// A C caller may store any int in an enum field; reading such a value through
// the C++ enum type is undefined, so enums are read as their raw int32 until
// they have been checked.
template <typename Enum>
int32_t raw(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "C enums are int sized");
  int32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}
std::string dtype_name(int32_t dtype);
std::string shape_string(const fa_tensor& t);
fa_status check_view(const char* name, const fa_tensor& t, int rank);
fa_status check_dtype(const char* name, const fa_tensor& t, fa_dtype expected);
fa_status check_same_device(const char* name, const fa_tensor& t, const fa_tensor& q);
fa_status check_shape(const char* name, const fa_tensor& t, std::initializer_list<int64_t> dims);
fa_status check_head_dim(const char* name, int64_t dim);
TensorLayout layout_of(const fa_tensor& t, bool varlen);
// fp32 slopes (H) or (B, H) on q's device (absent is fine): their pointer and batch stride (0 for (H)).
fa_status check_alibi(const fa_tensor& alibi, const fa_tensor& q, int64_t batch, int64_t heads, const float*& slopes,
                      int64_t& batch_stride);
// softmax_scale, softcap, windows, alignment and num_threads (dropout_p is each caller's).
fa_status check_option_values(const fa_options& opts);
}  // namespace validation

fa_status validate_fwd(const fa_fwd_args* args, FwdParams& params);
fa_status validate_bwd(const fa_bwd_args* args, BwdParams& params);

}  // namespace flashattn
