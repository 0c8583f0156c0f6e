// The CUDA element type of a dtype tag (cuda/launch.hpp): one mapping for
// every kernel family's launcher.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/launch.hpp"

namespace flashattn::cuda {

template <typename Tag>
struct ElementOf;
template <>
struct ElementOf<fp16_tag> {
  using type = __half;
};
template <>
struct ElementOf<bf16_tag> {
  using type = __nv_bfloat16;
};

}  // namespace flashattn::cuda
